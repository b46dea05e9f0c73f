"""The actors' port is complete and used as declared: what the tests give has every attribute it names,
and no actor reads it with a ``getattr`` default (issue 34 item 2). That the hub gives them all is
checked on a running hub (tests/api/test_services_port.py)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from tests.actors.standin import port_names, stand_in

ACTORS = Path(__file__).resolve().parents[2] / "actors"


def test_the_stand_in_has_every_attribute_of_the_actors_port():
    s = stand_in()
    assert all(hasattr(s, name) or name in vars(s) for name in port_names())
    assert s.topology.rollout_fence(uuid.uuid4()) is None and s.bus.connected


def test_no_actor_reads_the_port_with_a_default():
    # getattr(services, "x", default) makes a missing attribute a silent branch (a missing fence read as
    # "not fenced"); the port is complete, so an attribute is read as itself
    pattern = re.compile(r"getattr\((self\.)?(services|s)\b")
    found = [f"{path.name}:{n}" for path in sorted(ACTORS.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []
