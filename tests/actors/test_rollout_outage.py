"""The RolloutActor through a PostgreSQL outage, on trio's virtual clock (issue 14, item 1).

Storage is test_rollout_actor's in-memory FakeStore, made to raise ``DatabaseUnavailable`` the way
storage/db.py does while PostgreSQL is down: the actor must neither crash nor lose what its machine
decided, and must not redo what storage already took (a device assigned twice is a workload restarted
twice). tests/api/test_outage_rollout_tunnel.py runs the same outage against a real PostgreSQL.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
import trio

from actors.machines import rollout as rm
from actors.rollout import Control, RolloutActor
from storage.db import DatabaseUnavailable
from tests.actors.test_rollout_actor import FakeStore, services_for


class FlakyStore(FakeStore):
    """FakeStore whose calls named in ``down`` fail as an unreachable PostgreSQL does ("*": all)."""

    def __init__(self, devices, window) -> None:
        super().__init__(devices, window)
        self.down: set[str] = set()
        self.assigns: Counter[uuid.UUID] = Counter()

    def _reach(self, name: str) -> None:
        if name in self.down or "*" in self.down:
            raise DatabaseUnavailable("the database is not reachable (ConnectionRefusedError)")

    async def get_any(self, rollout_id):
        self._reach("get_any")
        return await super().get_any(rollout_id)

    async def save(self, *args, **kw):
        self._reach("save")
        return await super().save(*args, **kw)

    async def device_views(self, version_id, ids):
        self._reach("device_views")
        return await super().device_views(version_id, ids)

    async def assign(self, device_ids, config_id, version_id, now, fence=None):
        self._reach("assign")
        self.assigns.update(device_ids)
        return await super().assign(device_ids, config_id, version_id, now)

    async def get_many(self, org_id, fleet_ids):
        self._reach("get_many")
        return await super().get_many(org_id, fleet_ids)


async def test_an_outage_between_assigning_and_saving_loses_nothing_and_repeats_nothing(autojump_clock):
    devices = [uuid.uuid4() for _ in range(3)]
    store = FlakyStore(devices, None)
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            s, supervisor = services_for(nursery, store)
            store.row["state"] = "running"  # started earlier: the first tick assigns the canary
            store.down = {"save"}  # down right after the canary's assignment, before its step was saved
            actor = await supervisor.start(RolloutActor(store.rollout_id, s))
            await trio.sleep(0.1)
            assert store.assigns == Counter({devices[0]: 1})
            assert store.steps[devices[0]]["step"] == "pending"  # in memory only
            assert actor.machine.steps[str(devices[0])].step is rm.Step.UPDATING
            store.down = {"*"}
            await trio.sleep(30)
            # an operator's pause while storage is down: 503 for the asker, the rollout unchanged
            with pytest.raises(DatabaseUnavailable):
                await actor.ask(Control(rm.Pause()), timeout=5)
            assert actor.machine.state is rm.RolloutState.RUNNING
            await trio.sleep(40)  # 70 s of outage in all
            assert not actor.stopped and actor.restarts == 0 and supervisor.restarts_total == 0
            assert actor.storage_waits > 10
            store.down = set()
            await trio.sleep(10)  # at most one 5 s backoff, then ticks every 0.25 s
            assert store.row["state"] == "completed", store.row
            assert all(store.steps[d]["step"] == "succeeded" for d in devices)
            # every device assigned exactly once: the canary's assignment was not redone
            assert store.assigns == Counter({d: 1 for d in devices})
            assert actor.stopped  # settled and written: it ended
            nursery.cancel_scope.cancel()


async def test_a_pause_is_only_done_once_stored(autojump_clock):
    devices = [uuid.uuid4() for _ in range(3)]
    store = FlakyStore(devices, None)
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            s, supervisor = services_for(nursery, store)
            store.down = {"device_views"}  # ticks fail before the machine sees anything
            actor = await supervisor.start(RolloutActor(store.rollout_id, s))
            await trio.sleep(1)
            assert store.row["state"] == "running"
            store.down = {"save"}
            with pytest.raises(DatabaseUnavailable):
                await actor.ask(Control(rm.Pause()), timeout=5)
            assert actor.machine.state is rm.RolloutState.RUNNING and store.row["state"] == "running"
            store.down = {"device_views"}
            snapshot = await actor.ask(Control(rm.Pause()), timeout=5)
            assert snapshot["state"] == "paused" and store.row["state"] == "paused"
            nursery.cancel_scope.cancel()
