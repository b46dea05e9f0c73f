"""The actors' port (actors/services.py ``Services``) as the actor tests provide it: one stand-in.

Every attribute the port names is present. The process facts default to a single node (no cluster,
no fences, no epochs); every repository a test does not give is ``Missing``, which fails loudly when
an actor touches it. So a stand-in can no longer lack an attribute and send an actor silently down
the single-node branch (what ``getattr`` defaults did before: issue 34 item 2).

``StandIn`` declares each attribute with the port's type, and mypy checks that it is a ``Services``
(the assignment under TYPE_CHECKING below; tests/actors/test_types.py runs mypy), so the hub's own
Settings, EventHub, Journal and LinkHealth that it holds are checked against the port's Protocols too.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import trio

from actors.bus import Bus
from actors.runtime import Actor, Registry
from actors.services import (DeviceMeter, Journal, LinkDiagnosis, Placement, Publisher, Services, Stores,
                             Timeouts, TunnelSessions)
from device_client.shared.clock import Clock, TestClock
from hub.eventlog import Journal as EventJournal
from hub.events import EventHub
from hub.linkhealth import LinkHealth
from hub.settings import Settings
from storage.behind import WriteBehind
from storage.configs import Configurations
from storage.crypto import SecretBox
from storage.devices import Devices
from storage.fleets import Fleets
from storage.memtests import MemoryTests
from storage.registry_credentials import RegistryCredentials
from storage.rollouts import Rollouts
from storage.secrets import SecretFiles
from storage.windows import UpdateWindows


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
    """What the port declares: its attributes, its properties and its methods."""
    names = set(Services.__annotations__)
    names |= {n for n, v in vars(Services).items() if (callable(v) or isinstance(v, property)) and not n.startswith("_")}
    return names


def store_names() -> set[str]:
    """The repositories the port's ``stores`` declares."""
    return {n for n, v in vars(Stores).items() if isinstance(v, property)}


class StandInStores:
    """The port's ``stores``: every repository a test does not give is ``Missing``."""

    devices: Devices
    fleets: Fleets
    registry_credentials: RegistryCredentials
    configs: Configurations
    secrets: SecretFiles
    secret_box: SecretBox
    rollouts: Rollouts
    windows: UpdateWindows
    memtests: MemoryTests

    def __init__(self) -> None:
        for name in store_names():
            setattr(self, name, Missing(f"stores.{name}"))


class StandIn:
    """The port with single-node defaults; what a test gives replaces them (``stand_in``)."""

    settings: Timeouts
    clock: Clock
    bus: Bus
    registry: Registry
    events: Publisher
    journal: Journal
    presence: WriteBehind
    links: dict[uuid.UUID, Any]
    meter: DeviceMeter
    stores: StandInStores
    delivery_slots: trio.CapacityLimiter
    tunnels: TunnelSessions
    topology: Placement
    window_changes: int
    link_health: LinkDiagnosis

    def __init__(self) -> None:
        for name in port_names() - {"device_actor", "stores"}:
            setattr(self, name, Missing(name))
        self.stores = StandInStores()
        self.settings = Settings()
        self.clock = TestClock()
        self.bus = Bus()
        events = EventHub()
        self.events = events
        self.journal = EventJournal(None, events, enabled=False)  # published at once, as before the log
        self.links = {}
        self.topology = Alone()
        self.window_changes = 0
        self.link_health = LinkHealth()

    async def device_actor(self, device_id: uuid.UUID) -> Actor:
        raise AssertionError("the actor used services.device_actor, which this test's stand-in lacks")


if TYPE_CHECKING:
    _: Services = StandIn()  # mypy: every attribute and method of the port, each of the port's type
    _stores: Stores = StandInStores()  # and every repository of its stores (mypy names a missing one here)


def stand_in(**given: Any) -> StandIn:
    """The port with what the test gives: a repository by its name in ``stores`` (``devices=``)."""
    unknown = set(given) - port_names() - store_names()
    if unknown:
        raise TypeError(f"not in the actors' port (actors/services.py): {sorted(unknown)}")
    s = StandIn()
    for name, value in given.items():
        setattr(s.stores if name in store_names() else s, name, value)
    if "events" in given and "journal" not in given:  # the journal publishes on the test's event hub
        s.journal = EventJournal(None, given["events"], enabled=False)
    return s
