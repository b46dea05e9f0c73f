"""A running hub's services provide every attribute and method of the actors' port (actors/services.py):
the actors read them as themselves, with no defaults, so a missing one must fail here, not in a device's
actor at run time."""

from __future__ import annotations

import uuid

import trio

from tests.actors.standin import port_names, store_names
from tests.hubtools import start_hub


async def test_a_running_hub_provides_every_attribute_of_the_actors_port(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        assert {name for name in port_names() if not hasattr(hub.services, name)} == set()
        assert {name for name in store_names() if not hasattr(hub.services.stores, name)} == set()
        assert hub.services.bus.connected and hub.services.topology.rollout_fence(uuid.uuid4()) is None
