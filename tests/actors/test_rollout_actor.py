"""The RolloutActor on trio's virtual clock: queued devices are released exactly when their fleet's
window opens, and a restarted actor continues from what storage holds.

Storage and the device side are in-memory stand-ins here (FakeStore below stands in for the
PostgreSQL tables of rollouts, devices, deliveries and windows; FakeDeviceActor for a DeviceActor whose device
applies a version the moment it is assigned). The rollout learns whether a device is online or held by a
memory test from the device's row (what its DeviceActor wrote), never from the DeviceActor itself. The integration layer (tests/api/test_rollouts.py)
runs the same path against PostgreSQL and real agents.
"""

from __future__ import annotations

import datetime as dt
import uuid

import trio

from actors.rollout import RolloutActor
from actors.runtime import Registry, Supervisor
from device_client.shared.clock import TestClock
from tests.actors.standin import stand_in

UTC = dt.timezone.utc
EPOCH = dt.datetime(2026, 3, 27, 20, 0, tzinfo=UTC)  # a Friday, two days before Berlin's spring forward
ORG, FLEET, CONFIG, VERSION = (uuid.uuid4() for _ in range(4))


class FakeStore:
    """Stands in for PostgreSQL: the rollout row and steps, device rows, the fleet's window."""

    def __init__(self, devices: list[uuid.UUID], window: dict | None) -> None:
        self.rollout_id = uuid.uuid4()
        self.row = {"id": self.rollout_id, "org_id": ORG, "fleet_ids": [FLEET], "config_id": CONFIG,
                    "version_id": VERSION, "force": False, "batch_size": 10, "success_threshold": 0.9,
                    "failure_threshold": 0.1, "state": "pending", "reason": None, "current_batch": 0,
                    "accepted_failures": 0, "accepted_batch": -1}
        self.steps = {d: {"device_id": d, "fleet_id": FLEET, "batch": 0 if i == 0 else 1, "step": "pending",
                          "error": None, "updated_at": None} for i, d in enumerate(devices)}
        self.devices = {d: {"id": d, "org_id": ORG, "config_id": None, "config_version_id": None,
                            "applied_version_id": None, "config_status": None, "config_error": None,
                            "online": True, "state": "online", "workload_held": False}
                        for d in devices}
        self.window = window
        self.assigned_at: dict[uuid.UUID, float] = {}

    # rollouts
    async def get_any(self, rollout_id):
        return dict(self.row), [dict(s) for s in self.steps.values()]

    async def save(self, rollout_id, now, *, state, current_batch, reason, accepted_failures, accepted_batch, steps,
                   fence=None, events=()):
        self.row.update(state=state, current_batch=current_batch, reason=reason,
                        accepted_failures=accepted_failures, accepted_batch=accepted_batch)
        for device_id, step, error, at in steps:
            self.steps[device_id].update(step=step, error=error, updated_at=at)

    async def device_views(self, version_id, ids):
        return [dict(self.devices[d]) for d in ids]

    async def assign(self, device_ids, config_id, version_id, now, fence=None):
        for d in device_ids:
            row = self.devices[d]
            if row["config_version_id"] != version_id or row["config_status"] != "applied":
                row.update(config_id=config_id, config_version_id=version_id, config_status="pending")
                self.assigned_at[d] = trio.current_time()

    # windows
    async def get_many(self, org_id, fleet_ids):
        return {FLEET: self.window}


class FakeDeviceActor:
    """A connected device that applies what it is assigned at once. It has no state to peek at: the
    rollout may only message it (``tell``) and read storage."""

    def __init__(self, store: FakeStore, device_id: uuid.UUID) -> None:
        self.store, self.device_id = store, device_id

    def tell(self, msg) -> None:
        row = self.store.devices[self.device_id]
        row.update(config_status="applied", applied_version_id=row["config_version_id"])


def services_for(nursery, store: FakeStore):
    supervisor = Supervisor(nursery)
    registry = Registry(supervisor)
    device_actors = {d: FakeDeviceActor(store, d) for d in store.devices}
    s = stand_in(clock=TestClock(EPOCH), rollouts=store, windows=store, registry=registry)
    registry.lookup = lambda key: device_actors.get(key[1]) if key[0] == "device" else None

    async def device_actor(device_id):
        return device_actors[device_id]

    s.device_actor = device_actor
    return s, supervisor


WINDOW = {"enabled": True, "timezone": "Europe/Berlin", "start_time": "02:30", "end_time": "04:00",
          "days_of_week": ["Sunday"]}


async def test_queued_devices_start_exactly_when_the_window_opens(autojump_clock):
    devices = [uuid.uuid4() for _ in range(3)]
    store = FakeStore(devices, WINDOW)
    with trio.fail_after(10 * 24 * 3600):
        async with trio.open_nursery() as nursery:
            s, supervisor = services_for(nursery, store)
            await supervisor.start(RolloutActor(store.rollout_id, s))
            await trio.sleep(1)
            assert store.row["state"] == "running"
            assert [store.steps[d]["step"] for d in devices] == ["QUEUED_MAINTENANCE", "pending", "pending"]
            # Sunday 29 March 2026: 02:30 Berlin falls in the spring-forward gap, so the window opens at
            # the first valid instant after it, 03:00 CEST = 01:00 UTC.
            opens = dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
            await trio.sleep((opens - EPOCH).total_seconds() + 5)
            released = EPOCH + dt.timedelta(seconds=store.assigned_at[devices[0]])
            assert released == opens  # to the second (and below)
            assert store.row["state"] == "completed"
            assert all(store.steps[d]["step"] == "succeeded" for d in devices)
            # the canary went first; the batch after it within one poll interval
            assert store.assigned_at[devices[1]] - store.assigned_at[devices[0]] <= 0.5
            nursery.cancel_scope.cancel()


async def test_a_restarted_actor_continues_where_storage_left_it(autojump_clock):
    devices = [uuid.uuid4() for _ in range(3)]
    store = FakeStore(devices, None)
    # as a crashed hub left it: canary succeeded, batch 1 half done, one device still updating
    store.row.update(state="running", current_batch=1)
    store.steps[devices[0]]["step"] = "succeeded"
    store.steps[devices[1]]["step"] = "succeeded"
    store.steps[devices[2]]["step"] = "updating"
    for d in devices[:2]:
        store.devices[d].update(config_id=CONFIG, config_version_id=VERSION, applied_version_id=VERSION,
                                config_status="applied")
    store.devices[devices[2]].update(config_id=CONFIG, config_version_id=VERSION, config_status="applying")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            s, supervisor = services_for(nursery, store)
            await supervisor.start(RolloutActor(store.rollout_id, s))
            await trio.sleep(1)
            assert store.steps[devices[2]]["step"] == "verifying"
            assert store.assigned_at == {}  # nobody assigned twice
            store.devices[devices[2]].update(config_status="applied", applied_version_id=VERSION)
            await trio.sleep(1)
            assert store.row["state"] == "completed" and store.assigned_at == {}
            nursery.cancel_scope.cancel()


async def test_online_and_held_come_from_what_the_device_actor_stored(autojump_clock):
    devices = [uuid.uuid4() for _ in range(2)]  # canary, then one
    store = FakeStore(devices, None)
    store.devices[devices[0]].update(online=False, state="offline")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            s, supervisor = services_for(nursery, store)
            await supervisor.start(RolloutActor(store.rollout_id, s))
            await trio.sleep(5)
            assert store.steps[devices[0]]["step"] == "pending" and store.assigned_at == {}  # offline: waits
            store.devices[devices[0]].update(online=True, state="online", workload_held=True)
            await trio.sleep(1)
            assert store.steps[devices[0]]["step"] == "deferred_memory_test"  # a memory test holds it
            store.devices[devices[0]]["workload_held"] = False
            await trio.sleep(1)
            assert store.row["state"] == "completed" and set(store.assigned_at) == set(devices)
            nursery.cancel_scope.cancel()
