"""The DeviceActor's memory tests (actors/device_memtests.py) on trio's virtual clock: exact instants.

As in test_device_actor.py, storage is the one fake: ``FakeMemoryTests`` stands in for the
PostgreSQL memtest tables (recording what the actor stores) and ``FakeDevices`` for the devices
row the actor rebuilds from. The device is a handler on the real Bus, answering
``cmd.<id>.memtest.*`` as the link handler would relay a device's reply. Everything else is the
production code: Supervisor, Registry, Bus, EventHub, WriteBehind, Settings, TestClock.
"""

from __future__ import annotations

import contextlib
import uuid
from types import SimpleNamespace

import pytest
import trio

from actors.device import DeviceActor, DeviceEvent
from actors.machines.connection import LinkDown, LinkUp
from actors.machines.memtest_plan import plan_for
from actors.device_memtests import CancelTest, ReadStatus, StartTest
from actors.runtime import Registry, Supervisor
from device_client.shared.clock import TestClock
from device_client.shared.protocol import subject
from actors.errors import Conflict, DeviceRefused, TooSoon
from hub.settings import Settings
from storage.behind import WriteBehind
from tests.actors.standin import stand_in

DEV = uuid.UUID("00000000-0000-4000-8000-0000000000d2")
ORG = uuid.UUID("00000000-0000-4000-8000-00000000000b")
SETTINGS = Settings(heartbeat_interval=1000.0, command_timeout=2.0)
FACTS = {"firmware": "1", "architecture": "x86_64",
         "capabilities": {"memoryTest": {"online": True, "offline": True}}}
LIVE = plan_for({})
FULL = plan_for({"impact": "stopped"})


class FakeDevices:
    def __init__(self) -> None:
        self.presence: list[dict] = []  # presence rows as flushed (what a rollout reads)

    async def get_any(self, device_id):
        return {"org_id": ORG, "state": "offline", "boot_reason": "power_on", "last_seen_at": None}

    async def write_presence(self, rows):
        self.presence += rows


class FakeMemoryTests:
    """Stands in for storage/memtests.py: records each call."""

    def __init__(self) -> None:
        self.statuses: list[tuple[float, dict]] = []
        self.results: dict[str, dict] = {}
        self.merges: list[dict] = []

    async def save_status(self, org_id, device_id, status, at):
        self.statuses.append((trio.current_time(), status))

    async def save_result(self, org_id, device_id, result, at):
        new = result["runId"] not in self.results
        self.results.setdefault(result["runId"], result)
        return new

    async def save_health(self, org_id, device_id, health, at):
        pass

    async def merge_memory(self, org_id, device_id, *, retired, bad, verdict, rule, since):
        self.merges.append({"retired": retired, "bad": bad, "verdict": verdict})
        return rule(len(retired), len(bad), verdict)


class Device:
    """The device's side of the bus: one test at a time, as the agent answers."""

    def __init__(self) -> None:
        self.running: dict | None = None
        self.calls: list[tuple[float, str, dict]] = []
        self.acked: list[str] = []

    async def handle(self, subj: str, payload: dict) -> dict:
        verb = subj.split(".", 2)[2]
        self.calls.append((trio.current_time(), verb, payload))
        if verb == "memtest.start":
            if self.running:
                raise DeviceRefused("a test runs", code="busy")
            await trio.sleep(0.25)  # stopping the workload, say
            self.running = {"runId": payload["runId"], "plan": payload["plan"], "phase": "testing"}
            return {"status": self.running}
        if verb == "memtest.status":
            return {"supported": True, "status": self.running, "health": {}, "history": []}
        if verb == "memtest.cancel":
            if not self.running:
                raise DeviceRefused("nothing runs", code="not_running")
            ended, self.running = {**self.running, "phase": "cancelled"}, None
            return {"status": ended}
        if verb == "memtest.ack":
            self.acked += payload["runIds"]
            return {}
        raise DeviceRefused("unknown", code="unknown_command")


@contextlib.asynccontextmanager
async def hub():
    s = stand_in(settings=SETTINGS, clock=TestClock(), devices=FakeDevices(), memtests=FakeMemoryTests(),
                 meter=SimpleNamespace(device_seen=lambda *a: None))
    s.presence = WriteBehind(s.stores.devices.write_presence, interval=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.presence.run)
        s.supervisor = Supervisor(nursery)
        s.registry = Registry(s.supervisor)
        s.device = Device()
        s.bus.subscribe(subject(str(DEV), ">"), s.device.handle)
        s.actor = await s.registry.get(("device", DEV), lambda: DeviceActor(DEV, s))
        s.links[DEV] = SimpleNamespace(conn_id="c1", close=lambda: None)
        s.actor.tell(LinkUp("c1", "power_on", dict(FACTS)))
        yield s
        nursery.cancel_scope.cancel()


async def start(s, run_id: str, plan=LIVE) -> dict:
    return await s.actor.ask(StartTest(run_id, plan), timeout=30)


async def test_start_is_stored_before_it_is_answered_and_rate_limited_for_exactly_five_seconds(autojump_clock):
    with trio.fail_after(60):
        async with hub() as s:
            await trio.sleep(10)
            answer = await start(s, "r1")
            assert trio.current_time() == 10.25  # the device's answer, after stopping its workload
            assert answer["runId"] == "r1" and answer["status"]["phase"] == "testing"
            assert s.stores.memtests.statuses[0][0] == 10.25 and s.stores.memtests.statuses[0][1]["runId"] == "r1"
            s.actor.tell(DeviceEvent("memtest.result", {"result": {"runId": "r1", "outcome": "pass",
                                                                   "verdict": "ok"}}))
            s.device.running = None
            await trio.sleep(4.7499)
            with pytest.raises(TooSoon) as info:
                await start(s, "r2")
            assert info.value.retry_after == pytest.approx(5 - 4.7499)  # the hub answers Retry-After: 1
            await trio.sleep_until(15.25)
            assert (await start(s, "r2"))["runId"] == "r2"
            assert [c[2]["runId"] for c in s.device.calls if c[1] == "memtest.start"] == ["r1", "r2"]
            assert s.device.acked == ["r1"] and s.stores.memtests.results["r1"]["outcome"] == "pass"


async def test_concurrent_starts_one_wins_the_other_is_busy_with_its_status(autojump_clock):
    with trio.fail_after(60):
        async with hub() as s:
            outcomes: dict[str, object] = {}

            async def attempt(run_id: str) -> None:
                try:
                    outcomes[run_id] = await start(s, run_id, FULL)
                except Conflict as exc:
                    outcomes[run_id] = exc

            async with trio.open_nursery() as n:
                n.start_soon(attempt, "a")
                await trio.sleep(0.01)
                n.start_soon(attempt, "b")
            assert outcomes["a"]["runId"] == "a"
            busy = outcomes["b"]
            assert isinstance(busy, Conflict) and busy.code == "busy" and busy.details["runId"] == "a"
            assert len([c for c in s.device.calls if c[1] == "memtest.start"]) == 1
            assert s.actor.facts["workloadHeld"] is True  # rollouts defer this device


async def test_a_held_workload_reaches_the_presence_row_a_rollout_reads(autojump_clock):
    # No actor reads another's state: a rollout learns that a test holds the workload from storage.
    with trio.fail_after(60):
        async with hub() as s:
            await start(s, "r1", FULL)
            await trio.sleep(1)  # the presence rows are written behind (0.5 s)
            assert s.stores.devices.presence[-1]["facts"]["workloadHeld"] is True
            assert s.stores.devices.presence[-1]["facts"]["memoryTestRunning"]["runId"] == "r1"
            await s.actor.ask(CancelTest(None), timeout=10)
            await trio.sleep(1)
            assert s.stores.devices.presence[-1]["facts"]["workloadHeld"] is False
            assert s.stores.devices.presence[-1]["state"] == "online"


async def test_progress_is_published_cancel_ends_it_and_the_workload_is_released(autojump_clock):
    with trio.fail_after(60):
        async with hub() as s:
            sub = s.events.subscribe(("device", DEV))
            await start(s, "r1", FULL)
            s.actor.tell(DeviceEvent("memtest.progress", {"runId": "r1", "plan": FULL, "phase": "testing",
                                                          "pass": 2, "pattern": "walking_zeros", "errors": 1,
                                                          "coverageBytes": 3, "totalBytes": 4, "rateBps": 7.0,
                                                          "tempMilliC": 60500}))
            answer = await s.actor.ask(CancelTest(None), timeout=10)
            assert answer["status"]["phase"] == "cancelled"
            assert s.actor.facts["workloadHeld"] is False and s.actor.memtests.machine.running is None
            ops = []
            while True:
                try:
                    e = sub.receive.receive_nowait()
                except trio.WouldBlock:
                    break
                if e["kind"] == "device.operation":
                    ops.append(e["payload"])
            assert [o["phase"] for o in ops] == ["testing", "testing", "cancelled"]
            assert ops[1]["pattern"] == "walking_zeros" and ops[1]["coverage"] == 0.75
            assert ops[1]["temperature"] == 60.5 and ops[1]["rate"] == 7.0
            with pytest.raises(Conflict) as info:
                await s.actor.ask(CancelTest(None), timeout=10)
            assert info.value.code == "not_running"


async def test_status_read_and_link_loss_keep_the_last_status_on_record(autojump_clock):
    with trio.fail_after(60):
        async with hub() as s:
            await start(s, "r1")
            live = await s.actor.ask(ReadStatus(), timeout=10)
            assert live["status"]["runId"] == "r1"
            s.actor.tell(DeviceEvent("memtest.progress", {"runId": "r1", "plan": LIVE, "phase": "confirming"}))
            before = len(s.stores.memtests.statuses)
            s.actor.tell(LinkDown("c1"))
            await trio.sleep(1)
            assert len(s.stores.memtests.statuses) == before + 1
            assert s.stores.memtests.statuses[-1][1]["phase"] == "confirming"


async def test_a_flood_of_progress_and_health_costs_bounded_tasks_and_keeps_the_newest(autojump_clock):
    """Issue 14, section 4: device-driven work is bounded. With storage slow (1 s a write), 2,000
    progress events cost at most two status saves in flight, and health reports past the job bound are counted, not queued without end."""
    from actors.device_memtests import JOBS_MAX

    with trio.fail_after(600):
        async with hub() as s:
            await start(s, "r1", FULL)
            saves_before = len(s.stores.memtests.statuses)
            slow = s.stores.memtests.save_status

            async def slow_save(org_id, device_id, status, at):
                await trio.sleep(1)
                await slow(org_id, device_id, status, at)

            health_saved = []

            async def slow_health(org_id, device_id, health, at):
                await trio.sleep(1)
                health_saved.append(health)

            s.stores.memtests.save_status, s.stores.memtests.save_health = slow_save, slow_health
            tasks, waiting = [], []
            for n in range(2000):
                await s.actor.post(DeviceEvent("memtest.progress", {"runId": "r1", "plan": FULL, "phase": "testing",
                                                                     "pass": 1, "pattern": "walking_ones",
                                                                     "coverageBytes": n, "totalBytes": 4000}))
                await s.actor.post(DeviceEvent("memtest.health", {"health": {"tempMilliC": n}}))
                if n % 100 == 0:
                    await trio.sleep(0)
                    tasks.append(len(s.actor.tasks.child_tasks))
                waiting.append(len(s.actor.memtests._jobs or ()))
            assert max(tasks) <= 4, tasks  # the saver, one queued save, the in-order worker, slack of one
            assert max(waiting) <= JOBS_MAX, max(waiting)  # the job queue never passed its bound
            await trio.sleep(0.01)  # the mailbox's last events handled
            while s.actor.memtests._jobs or s.actor.memtests._working:  # one virtual second a save
                await trio.sleep(1)
            # How many reports were taken depends on how often the sender waited (the clock jumps then and
            # jobs finish), so the figure is an accounting, not a constant: each report was saved or counted.
            dropped = s.actor.memtests.health_dropped
            assert dropped > 0, dropped
            assert len(health_saved) + dropped == 2000, (len(health_saved), dropped)
            assert s.stores.memtests.statuses[-1][1]["phase"] == "testing"  # the newest status is on record
            assert len(s.stores.memtests.statuses) - saves_before < 20  # coalesced, not one write per event
