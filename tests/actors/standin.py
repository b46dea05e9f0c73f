"""The actors' port (actors/services.py ``Services``) as the actor tests provide it: one stand-in.

Every attribute the port names is present. The process facts default to a single node (no cluster,
no fences, no epochs); every repository a test does not give is ``Missing``, which fails loudly when
an actor touches it. So a stand-in can no longer lack an attribute and send an actor silently down
the single-node branch (what ``getattr`` defaults did before: issue 34 item 2).
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from actors.bus import Bus
from actors.services import Services
from device_client.shared.clock import TestClock
from hub.eventlog import Journal
from hub.events import EventHub
from hub.linkhealth import LinkHealth
from hub.settings import Settings


class Missing:
    """A repository the test did not give: any use of it is the test's error, said as such."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        raise AssertionError(f"the actor used services.{self._name}.{attr}, which this test's stand-in lacks")


class Alone:
    """The actors' Placement of one hub process (hub/topology.py SingleNode's answers)."""

    def tell_elsewhere(self, device_id: uuid.UUID, msg: object) -> None:
        pass

    def link_epoch(self, device_id: uuid.UUID) -> None:
        return None

    def rollout_fence(self, rollout_id: uuid.UUID) -> None:
        return None


def port_names() -> set[str]:
    """What the port declares: its attributes and its methods."""
    names = set(Services.__annotations__)
    names |= {n for n, v in vars(Services).items() if callable(v) and not n.startswith("_")}
    return names


def stand_in(**given: Any) -> SimpleNamespace:
    s = SimpleNamespace(**{name: Missing(name) for name in port_names()})
    s.__dict__.update(settings=Settings(), clock=TestClock(), bus=Bus(), events=EventHub(), links={},
                      topology=Alone(), window_changes=0,
                      link_health=LinkHealth())
    s.__dict__.update(given)
    if "journal" not in given:  # events published at once, as before the log (hub/eventlog.py)
        s.journal = Journal(None, s.events, enabled=False)
    return s
