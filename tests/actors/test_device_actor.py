"""DeviceActor on trio's virtual clock, with real runtime, bus, event hub and write-behind.

The one fake here is storage: ``FakeDevices`` stands in for the PostgreSQL ``devices`` table (its
``get_any`` returns the row the actor rebuilds from, with the columns the actor reads: org_id, state,
boot_reason, last_seen_at) and the write-behind flushes presence rows into it instead of into the
database. The integration layer (tests/api, tests/e2e) runs the same actor over a
real embedded PostgreSQL. Everything else is the production code: Supervisor, Registry, Bus, EventHub,
WriteBehind, Settings and TestClock (wall time = epoch + trio time, so instants are exact).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import uuid

import pytest
import trio

from actors.device import DeviceActor, DeviceEvent, GetLive, Reboot, Send
from actors.machines.connection import Heartbeat, LinkDown, LinkUp
from actors.runtime import ActorCrashed, Registry, Supervisor
from device_client.shared.clock import TestClock
from device_client.shared.protocol import subject
from actors.errors import DeviceOffline, DeviceRefused, DeviceTimeout
from hub.metering import Meter
from hub.settings import Settings
from storage.behind import WriteBehind
from tests.actors.standin import stand_in

DEV = uuid.UUID("00000000-0000-4000-8000-0000000000d1")
ORG = uuid.UUID("00000000-0000-4000-8000-00000000000a")
EPOCH = TestClock().epoch
FACTS = {"firmware": "1.2.3", "architecture": "arm64", "tunnelPublicKey": "pk-base64"}
SETTINGS = Settings(heartbeat_interval=1.0, command_timeout=2.0, reboot_timeout=20.0)


def at(seconds: float) -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=seconds)


class FakeDevices:
    """Stands in for the PostgreSQL devices table: one row per device, presence merged into it."""

    def __init__(self) -> None:
        self.rows = {DEV: {"org_id": ORG, "state": "offline", "boot_reason": "power_on", "last_seen_at": None}}
        self.reads = 0
        self.flushes: list[tuple[float, list[dict]]] = []

    async def get_any(self, device_id):
        self.reads += 1
        row = self.rows.get(device_id)
        return dict(row) if row is not None else None

    async def write_presence(self, batch: list[dict]) -> None:
        self.flushes.append((trio.current_time(), copy.deepcopy(batch)))
        for row in batch:
            self.rows[row["id"]].update(state=row["state"], boot_reason=row["boot_reason"],
                                        last_seen_at=row["last_seen_at"])


class FakeUsage:
    """Stands in for the metering tables: which (org, day, device) were marked active."""

    def __init__(self) -> None:
        self.active: list[tuple] = []

    async def add_many(self, rows: list[dict]) -> None:
        pass

    async def mark_active_many(self, rows: list[dict]) -> None:
        self.active += [(r["org_id"], r["day"], r["device_id"]) for r in rows]


class LinkStub:
    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self.closed_at: float | None = None
        self.close_code: int | None = None

    def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed_at = trio.current_time()
        self.close_code = code


class RecordingRegistry(Registry):
    def __init__(self, supervisor) -> None:
        super().__init__(supervisor)
        self.forgotten: list[tuple[object, float]] = []

    def _forget(self, actor) -> None:
        self.forgotten.append((actor.key, trio.current_time()))
        super()._forget(actor)


@contextlib.asynccontextmanager
async def hub(settings: Settings = SETTINGS, actor_class: type[DeviceActor] = DeviceActor):
    devices = FakeDevices()
    s = stand_in(settings=settings, clock=TestClock(), devices=devices,
                 presence=WriteBehind(devices.write_presence, interval=0.5, name="presence rows"))
    s.stores.usage = FakeUsage()
    s.meter = Meter(s.stores.usage, interval=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.presence.run)
        await nursery.start(s.meter.run)
        s.nursery = nursery
        s.supervisor = Supervisor(nursery, backoff_initial=1.0)
        s.registry = RecordingRegistry(s.supervisor)

        async def actor() -> DeviceActor:
            return await s.registry.get(("device", DEV), lambda: actor_class(DEV, s))

        s.actor = actor
        yield s
        nursery.cancel_scope.cancel()


def connect(s, actor, conn_id="c1", boot_reason="power_on", **kw) -> LinkStub:
    """What the device link does: register the link, then tell the actor."""
    link = s.links[DEV] = LinkStub(conn_id)
    actor.tell(LinkUp(conn_id, boot_reason, FACTS, **kw))
    return link


def drain(sub) -> list[dict]:
    events = []
    while True:
        try:
            events.append(sub.receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return events


def state_event(state: str, seconds: float, boot: str = "power_on") -> dict:
    stamp = at(seconds).strftime("%Y-%m-%dT%H:%M:%S.") + f"{at(seconds).microsecond // 1000:03d}Z"
    return {"kind": "device.state", "deviceId": str(DEV), "at": stamp,
            "payload": {"state": state, "online": state in ("online", "maintenance"), "bootReason": boot}}


# -- link up, presence, events ------------------------------------------------------------------
async def test_link_up_is_online_and_writes_the_presence_row_with_facts(autojump_clock):
    with trio.fail_after(30):
        async with hub() as s:
            actor = await s.actor()
            assert await actor.ask(GetLive(), timeout=1) == {
                "state": "offline", "online": False, "bootReason": "power_on", "lastSeenAt": None,
                "connectedAt": None, "facts": None}
            await trio.sleep(1.2)
            connect(s, actor)
            assert await actor.ask(GetLive(), timeout=1) == {
                "state": "online", "online": True, "bootReason": "power_on", "lastSeenAt": at(1.2),
                "connectedAt": at(1.2), "facts": FACTS}
            await trio.sleep(1)
            # written behind at the next flush (every 0.5 s from t=0), once
            assert s.stores.devices.flushes == [(1.5, [{
                "id": DEV, "online": True, "state": "online", "boot_reason": "power_on",
                "last_seen_at": at(1.2), "connected_at": at(1.2), "firmware": "1.2.3",
                "architecture": "arm64", "tunnel_public_key": "pk-base64", "facts": FACTS}])]


async def test_state_changes_and_device_events_are_published_to_device_and_org_topics(autojump_clock):
    with trio.fail_after(30):
        async with hub() as s:
            actor = await s.actor()
            dev_sub, org_sub = s.events.subscribe(("device", DEV)), s.events.subscribe(("org", ORG))
            other = s.events.subscribe(("org", uuid.uuid4()))
            await trio.sleep(1)
            connect(s, actor)
            actor.tell(DeviceEvent("workload", {"status": "running"}))
            await trio.sleep(1)
            actor.tell(LinkDown("c1"))
            await actor.ask(GetLive(), timeout=1)
            expected = [state_event("online", 1),
                        {"kind": "device.event.workload", "deviceId": str(DEV), "at": "2026-01-05T12:00:01.000Z",
                         "payload": {"status": "running"}},
                        state_event("offline", 2)]
            assert drain(dev_sub) == expected
            assert drain(org_sub) == expected
            assert drain(other) == []


async def test_maintenance_hello_is_live_maintenance(autojump_clock):
    with trio.fail_after(30):
        async with hub() as s:
            actor = await s.actor()
            connect(s, actor, boot_reason="memtest", maintenance=True)
            live = await actor.ask(GetLive(), timeout=1)
            assert (live["state"], live["online"], live["bootReason"]) == ("maintenance", True, "memtest")


# -- heartbeats ---------------------------------------------------------------------------------
async def test_heartbeat_silence_is_offline_exactly_at_last_seen_plus_timeout(autojump_clock):
    with trio.fail_after(60):
        async with hub() as s:
            actor = await s.actor()
            sub = s.events.subscribe(("device", DEV))
            link = connect(s, actor)
            for t in (1, 2, 3.5):
                await trio.sleep_until(t)
                actor.tell(Heartbeat("c1"))
            assert (await sub.receive.receive())["payload"]["state"] == "online"
            offline = await sub.receive.receive()
            assert offline == state_event("offline", 3.5 + SETTINGS.heartbeat_timeout)
            assert trio.current_time() == 6.5
            assert link.closed_at == 6.5 and link.close_code == 4002  # heartbeat timeout, its own code
            live = await actor.ask(GetLive(), timeout=1)
            assert (live["state"], live["lastSeenAt"]) == ("offline", at(3.5))
            await trio.sleep(1)
            assert s.stores.devices.flushes[-1][1][0]["online"] is False
            assert s.stores.devices.rows[DEV]["last_seen_at"] == at(3.5)


async def test_drop_link_leaves_a_newer_link_alone(autojump_clock):
    with trio.fail_after(60):
        async with hub() as s:
            actor = await s.actor()
            old = connect(s, actor, "c1")
            await trio.sleep(1)
            new = connect(s, actor, "c2")  # the newest connection wins: the machine drops c1
            await actor.ask(GetLive(), timeout=1)
            assert new.closed_at is None   # the link table already holds c2; c1's socket is not ours
            assert old.closed_at is None
            actor.tell(LinkDown("c1"))     # the old socket closing changes nothing
            assert (await actor.ask(GetLive(), timeout=1))["state"] == "online"
            await trio.sleep(10)
            assert new.closed_at == 1 + SETTINGS.heartbeat_timeout


# -- commands -----------------------------------------------------------------------------------
async def test_reboot_answered_by_the_device_is_rebooting_then_online_with_the_new_boot_reason(autojump_clock):
    with trio.fail_after(60):
        async with hub() as s:
            actor = await s.actor()
            connect(s, actor)
            calls = []

            async def device(subj, payload):
                calls.append((subj, payload, trio.current_time()))
                await trio.sleep(0.25)
                return {"accepted": True}

            s.bus.subscribe(subject(str(DEV), ">"), device)
            await trio.sleep(1)
            assert await actor.ask(Reboot(), timeout=10) == {"accepted": True}
            assert trio.current_time() == 1.25
            assert calls == [(f"cmd.{DEV}.reboot", {}, 1)]
            live = await actor.ask(GetLive(), timeout=1)
            assert (live["state"], live["online"]) == ("rebooting", False)
            await trio.sleep(5)  # well past the heartbeat timeout: rebooting does not expect heartbeats
            assert (await actor.ask(GetLive(), timeout=1))["state"] == "rebooting"
            connect(s, actor, "c2", boot_reason="reboot")
            live = await actor.ask(GetLive(), timeout=1)
            assert (live["state"], live["bootReason"], live["connectedAt"]) == ("online", "reboot", at(6.25))


async def test_rebooting_device_that_never_returns_is_offline_after_the_reboot_timeout(autojump_clock):
    with trio.fail_after(120):
        async with hub() as s:
            actor = await s.actor()
            sub = s.events.subscribe(("device", DEV))
            connect(s, actor)

            async def device(subj, payload):
                return {}

            s.bus.subscribe(subject(str(DEV), ">"), device)
            await trio.sleep(1)
            await actor.ask(Reboot(), timeout=10)
            assert [e["payload"]["state"] for e in drain(sub)] == ["online", "rebooting"]
            offline = await sub.receive.receive()
            assert offline == state_event("offline", 1 + SETTINGS.reboot_timeout)
            assert trio.current_time() == 21


async def test_reboot_with_no_responder_is_device_offline(autojump_clock):
    with trio.fail_after(30):
        async with hub() as s:
            actor = await s.actor()
            with pytest.raises(DeviceOffline) as info:
                await actor.ask(Reboot(), timeout=10)  # no link at all: refused by the machine
            assert info.value.code == "device_offline"
            connect(s, actor)  # the actor thinks it is online, but nobody holds cmd.<id>.>
            start = trio.current_time()
            with pytest.raises(DeviceOffline) as info:
                await actor.ask(Reboot(), timeout=10)
            assert info.value.code == "device_offline"
            assert trio.current_time() == start
            assert (await actor.ask(GetLive(), timeout=1))["state"] == "online"


async def test_reboot_that_the_device_never_answers_is_device_timeout_after_command_timeout(autojump_clock):
    with trio.fail_after(60):
        async with hub() as s:
            actor = await s.actor()

            async def silent(subj, payload):
                await trio.sleep_forever()

            s.bus.subscribe(subject(str(DEV), ">"), silent)
            await trio.sleep(3)
            connect(s, actor)
            with pytest.raises(DeviceTimeout) as info:
                await actor.ask(Reboot(), timeout=10)
            assert trio.current_time() == 3 + SETTINGS.command_timeout
            assert info.value.code == "device_timeout"
            # the failed reboot is forgotten: a link drop now is offline, not rebooting
            actor.tell(LinkDown("c1"))
            assert (await actor.ask(GetLive(), timeout=1))["state"] == "offline"


async def test_device_error_from_the_device_reaches_the_asker(autojump_clock):
    with trio.fail_after(30):
        async with hub() as s:
            actor = await s.actor()
            connect(s, actor)
            refusal = DeviceRefused("a memory test is running", code="busy")

            async def refusing(subj, payload):
                raise refusal

            s.bus.subscribe(subject(str(DEV), ">"), refusing)
            with pytest.raises(DeviceRefused) as info:
                await actor.ask(Reboot(), timeout=10)
            assert info.value is refusal and info.value.code == "busy"
            assert (await actor.ask(GetLive(), timeout=1))["state"] == "online"
            assert s.registry.supervisor.restarts_total == 0


async def test_send_is_answered_with_the_device_payload_and_changes_no_state(autojump_clock):
    with trio.fail_after(30):
        async with hub() as s:
            actor = await s.actor()
            with pytest.raises(DeviceOffline):
                await actor.ask(Send("ping", {}), timeout=10)
            connect(s, actor)

            async def device(subj, payload):
                return {"pong": payload["n"], "subject": subj}

            s.bus.subscribe(subject(str(DEV), ">"), device)
            assert await actor.ask(Send("ping", {"n": 7}), timeout=10) == {"pong": 7, "subject": f"cmd.{DEV}.ping"}
            assert (await actor.ask(GetLive(), timeout=1))["state"] == "online"


async def test_unexpected_failure_of_a_command_answers_the_asker_at_once(autojump_clock):
    with trio.fail_after(60):
        async with hub() as s:
            actor = await s.actor()
            connect(s, actor)

            async def broken(subj, payload):
                raise ConnectionResetError("websocket went away mid-send")

            s.bus.subscribe(subject(str(DEV), ">"), broken)
            with pytest.raises((ActorCrashed, DeviceRefused, DeviceOffline)):
                await actor.ask(Reboot(), timeout=10)
            assert trio.current_time() == 0
            await trio.sleep(2)  # the actor comes back (backoff 1 s) and answers again
            assert (await actor.ask(GetLive(), timeout=1))["state"] == "online"


class SpinGuardedDeviceActor(DeviceActor):
    """Parks instead of spinning if ``on_deadline`` keeps firing without virtual time passing: on
    trio's autojump clock a hot loop would otherwise never let time advance, and the test would hang."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.deadline_calls: list[float] = []

    async def on_deadline(self) -> None:
        self.deadline_calls.append(trio.current_time())
        if len(self.deadline_calls) > 50 and self.deadline_calls[-50] == trio.current_time():
            await trio.sleep_forever()
        await super().on_deadline()


async def _crash_with_a_reboot_pending(s, actor) -> dict:
    """A reboot is in flight (the device is slow to answer) when the actor crashes at t=1."""
    outcome: dict = {}

    async def slow_device(subj, payload):
        await trio.sleep_forever()

    s.bus.subscribe(subject(str(DEV), ">"), slow_device)

    async def ask_reboot():
        try:
            await actor.ask(Reboot(), timeout=10)
        except Exception as exc:
            outcome["error"], outcome["at"] = exc, trio.current_time()

    s.nursery.start_soon(ask_reboot)
    await trio.sleep(1)
    actor.tell(object())  # not a message it knows: a crash
    return outcome


async def test_crash_while_a_command_is_pending_answers_its_asker(autojump_clock):
    with trio.fail_after(60):
        async with hub() as s:
            actor = await s.actor()
            connect(s, actor)
            outcome = await _crash_with_a_reboot_pending(s, actor)
            await trio.sleep(20)
            assert isinstance(outcome["error"], ActorCrashed)
            assert outcome["at"] <= 2  # by the restart (crash at 1 + backoff 1), not at the ask timeout


async def test_actor_that_crashed_with_a_command_pending_still_passivates(autojump_clock):
    with trio.fail_after(1000):
        async with hub(actor_class=SpinGuardedDeviceActor) as s:
            actor = await s.actor()
            connect(s, actor)
            await _crash_with_a_reboot_pending(s, actor)
            await trio.sleep(20)
            actor.tell(LinkDown("c1"))
            del s.links[DEV]
            await trio.sleep(DeviceActor.idle_timeout + 10)
            assert len(actor.deadline_calls) <= 2
            assert s.registry.lookup(("device", DEV)) is None


# -- restart and passivation --------------------------------------------------------------------
async def test_restarted_actor_rebuilds_from_storage_and_the_link_table(autojump_clock):
    with trio.fail_after(30):
        async with hub() as s:
            actor = await s.actor()
            connect(s, actor, boot_reason="watchdog")
            await trio.sleep(1)  # presence flushed to "storage" at 0.5
            actor.tell(object())  # not a message it knows: a crash
            await trio.sleep(2)
            assert actor.restarts == 1 and s.stores.devices.reads == 2
            live = await actor.ask(GetLive(), timeout=1)
            # the link is still registered, so it is online; seen at the restart (1 + backoff 1)
            assert (live["state"], live["bootReason"], live["lastSeenAt"]) == ("online", "watchdog", at(2))
            actor.tell(Heartbeat("c1"))  # the surviving socket's heartbeats are recognised
            await trio.sleep(2.5)
            assert (await actor.ask(GetLive(), timeout=1))["lastSeenAt"] == at(3)


async def test_restarted_actor_of_a_maintenance_device_stays_in_maintenance(autojump_clock):
    with trio.fail_after(30):
        async with hub() as s:
            actor = await s.actor()
            connect(s, actor, boot_reason="memtest", maintenance=True)
            await trio.sleep(1)
            assert s.stores.devices.rows[DEV]["state"] == "maintenance"  # flushed to "storage"
            actor.tell(object())  # a crash
            await trio.sleep(2)
            assert actor.restarts == 1
            assert (await actor.ask(GetLive(), timeout=1))["state"] == "maintenance"


async def test_idle_offline_actor_passivates_after_idle_timeout(autojump_clock):
    with trio.fail_after(1000):
        async with hub() as s:
            first = await s.actor()
            connect(s, first)
            await trio.sleep(10)
            first.tell(LinkDown("c1"))
            del s.links[DEV]
            await trio.sleep(DeviceActor.idle_timeout + 1)
            assert s.registry.forgotten == [(("device", DEV), 10 + DeviceActor.idle_timeout)]
            assert first.stopped and s.registry.lookup(("device", DEV)) is None
            second = await s.actor()
            assert second is not first and s.stores.devices.reads == 2
            assert (await second.ask(GetLive(), timeout=1))["state"] == "offline"


async def test_online_actor_does_not_passivate(autojump_clock):
    with trio.fail_after(1000):
        async with hub() as s:
            actor = await s.actor()
            connect(s, actor)
            for t in range(1, int(DeviceActor.idle_timeout) * 2):
                await trio.sleep_until(t)
                actor.tell(Heartbeat("c1"))
            assert s.registry.forgotten == [] and s.registry.lookup(("device", DEV)) is actor


# -- metering -------------------------------------------------------------------------------------
async def test_a_connected_device_is_metered_active_once_per_utc_day(autojump_clock):
    """Billing counts devices seen connected per UTC day: the link-up marks today, heartbeats on the
    same day mark nothing more, the first heartbeat after midnight marks the new day."""
    with trio.fail_after(13 * 3600):  # virtual time
        settings = Settings(heartbeat_interval=3600.0)  # no heartbeat timeout within the test
        async with hub(settings) as s:
            actor = await s.actor()
            connect(s, actor)
            for _ in range(3):
                await trio.sleep(60)
                actor.tell(Heartbeat("c1"))
            await trio.sleep(2)
            day1 = EPOCH.date()
            assert s.stores.usage.active == [(ORG, day1, DEV)]
            # EPOCH is 12:00 UTC: hourly heartbeats; the twelfth falls after midnight
            for hour in range(12):
                await trio.sleep(3600)
                actor.tell(Heartbeat("c1"))
                await trio.sleep(2)
                if hour < 11:
                    assert len(s.stores.usage.active) == 1
            assert s.stores.usage.active == [(ORG, day1, DEV), (ORG, day1 + dt.timedelta(days=1), DEV)]


# -- system facts (issue 37 item 9) -------------------------------------------------------------
async def test_a_telemetry_sample_replaces_the_system_facts_and_a_cut_is_a_protocol_error(autojump_clock):
    with trio.fail_after(30):
        async with hub() as s:
            actor = await s.actor()
            said: list[str] = []

            async def protocol_error(what: str) -> None:
                said.append(what)

            actor.delivery.protocol_error = protocol_error
            # a sample before any hello has no facts to join: nothing is kept
            actor.tell(DeviceEvent("telemetry", {"system": {"uptimeSeconds": 1}}))
            assert (await actor.ask(GetLive(), timeout=1))["facts"] is None
            connect(s, actor)
            await trio.sleep(2)
            actor.tell(DeviceEvent("telemetry", {"sentAt": "x", "system": {
                "uptimeSeconds": 90.5, "cpuPercent": 400, "ipAddresses": ["192.0.2.9"] * 2 + ["::1x"]}}))
            facts = (await actor.ask(GetLive(), timeout=1))["facts"]
            assert facts == {**FACTS, "system": {
                "uptimeSeconds": 90.5, "ipAddresses": ["192.0.2.9"], "cpuPercent": None, "memoryPercent": None,
                "memoryTotalBytes": None, "diskPercent": None, "diskTotalBytes": None,
                "at": "2026-01-05T12:00:02.000Z"}}
            await trio.sleep(1)
            assert said == ["telemetry: system.ipAddresses: 2 of 3 are not addresses or repeat one, left out; "
                            "system.cpuPercent: out of bounds or of the wrong type, left out"]
            # written behind with the presence row: storage holds what GET device shows
            assert s.stores.devices.flushes[-1][1][0]["facts"] == facts
