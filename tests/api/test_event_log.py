"""The event log (issue 33): every streamed event appended once, as CloudEvents, paged from a cursor
with the caller's visibility; SSE ids and Last-Event-ID resume with no gap and no duplicate; 410
past retention. The envelope is checked by the `cloudevents` package, not by our code."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import trio
from cloudevents.core.formats.json import JSONFormat

from device_client.shared.clock import rfc3339
from storage.leases import Fence, LeaseLost
from storage.events import new_event
from tests.hubtools import assert_error, start_agent, start_hub, wait_for


def _creds(pat: tuple[str, str], org_id: str) -> dict[str, str]:
    return {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1], "X-Organization-ID": org_id}


async def _record(hub, device_id: str, n: int, kind: str = "device.event.probe") -> None:
    """n events of a device through the journal, as a DeviceActor publishes them; written when it returns."""
    s = hub.services
    for i in range(n):
        s.journal.record(uuid.UUID(hub.org_id), {"kind": kind, "deviceId": device_id,
                                                 "at": rfc3339(s.clock.now()), "payload": {"n": i}})
    await s.journal.wait_written()


async def _events(hub, headers=None, **params) -> dict:
    r = await hub.call("GET", "/v1/events", params=params, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


async def test_a_linked_devices_events_are_logged_as_cloudevents_in_cursor_order(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        device_id, token = await hub.provision("logged")
        await start_agent(nursery, hub.base_url, token, tmp_path / "agent")

        async def state_logged() -> bool:
            page = await _events(hub, type="io.fleethub.device.state")
            return any(e["subject"] == f"devices/{device_id}" for e in page["data"])

        await wait_for(state_logged, timeout=30)
        await _record(hub, device_id, 3)
        page = await _events(hub)
        events = page["data"]
        for e in events:
            parsed = JSONFormat().read(None, json.dumps(e))  # the reference implementation's checks
            assert parsed.get_specversion() == "1.0" and parsed.get_source() == f"/organizations/{hub.org_id}"
        sequences = [int(e["sequence"]) for e in events]
        assert sequences == list(range(1, len(events) + 1))  # per organisation, from 1, no gap
        assert page["next"] == sequences[-1] and page["oldestCursor"] == 0
        assert [e["data"] for e in events[-3:]] == [{"n": 0}, {"n": 1}, {"n": 2}]
        # a cursor pages on; a prefix type and a subject filter
        after = await _events(hub, after=sequences[-2])
        assert [e["sequence"] for e in after["data"]] == [str(sequences[-1])]
        probes = await _events(hub, type="io.fleethub.device.event.*", subject=f"devices/{device_id}", limit=2)
        assert [e["data"] for e in probes["data"]] == [{"n": 0}, {"n": 1}]
        assert probes["next"] == int(probes["data"][-1]["sequence"])  # a full page ends at its last event
        assert (await _events(hub, subject=f"devices/{uuid.uuid4()}"))["next"] == sequences[-1]
        assert_error(await hub.call("GET", "/v1/events", params={"type": "device.state"}), 400, "invalid_type")
        assert_error(await hub.call("GET", "/v1/events", params={"after": sequences[-1] + 5}), 400,
                     "invalid_cursor")


async def test_a_member_reads_only_the_events_of_fleets_they_may_view(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        fleets = {}
        for name in ("a", "b"):
            r = await hub.call("POST", "/v1/fleets", json={"name": name})
            assert r.status_code == 201, r.text
            fleets[name] = r.json()["data"]["id"]
        mine, _ = await hub.provision("mine", fleet_id=fleets["a"])
        theirs, _ = await hub.provision("theirs", fleet_id=fleets["b"])
        member = await hub.new_user("member")
        me = (await hub.call("GET", "/v1/me", headers=_creds(member, hub.org_id))).json()["data"]["userId"]
        r = await hub.call("POST", "/v1/relations", json={"object_type": "fleet", "object_id": fleets["a"],
                                                          "relation": "viewer", "subject_type": "user",
                                                          "subject_id": me})
        assert r.status_code == 201, r.text
        await _record(hub, mine, 2)
        await _record(hub, theirs, 2)
        # a rollout over both fleets is not the member's: they view only one of its fleets
        s = hub.services
        both = new_event(uuid.UUID(hub.org_id), {"kind": "rollout.state", "rolloutId": str(uuid.uuid4()),
                                                 "at": rfc3339(s.clock.now()), "payload": {}},
                         (uuid.UUID(fleets["a"]), uuid.UUID(fleets["b"])))
        await s.stores.rollouts.record([both])
        seen = await _events(hub, headers=_creds(member, hub.org_id))
        assert {e["subject"] for e in seen["data"]} == {f"devices/{mine}"}
        everything = await _events(hub)
        assert {e["subject"] for e in everything["data"]} == {f"devices/{mine}", f"devices/{theirs}",
                                                              both.subject}
        assert seen["next"] == everything["next"]  # the member's cursor moves past what they may not see


async def test_rollout_events_are_written_only_under_the_rollouts_lease(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        event = new_event(uuid.UUID(hub.org_id), {"kind": "rollout.state", "rolloutId": str(uuid.uuid4()),
                                                  "at": rfc3339(s.clock.now()), "payload": {}}, ())
        try:
            await s.stores.rollouts.record([event], fence=Fence(uuid.uuid4(), "another-node", 1))
        except LeaseLost:
            pass
        else:
            raise AssertionError("an event was written under a lease this node does not hold")
        assert (await _events(hub))["data"] == []


async def _sse(lines, count: int) -> list[tuple[str | None, str, dict]]:
    """The next ``count`` (id, event name, data) of an SSE response's lines; comments skipped."""
    out, ident, name, data = [], None, None, []
    async for line in lines:
        if line.startswith("id:"):
            ident = line[3:].strip()
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and name is not None:
            out.append((ident, name, json.loads("\n".join(data))))
            ident, name, data = None, None, []
            if len(out) == count:
                return out
    raise AssertionError(f"the stream ended after {len(out)} of {count} events")


async def test_sse_resumes_from_last_event_id_with_no_gap_and_no_duplicate(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        device_id, _ = await hub.provision("watched")
        await _record(hub, device_id, 2)  # before the stream: not sent (the snapshot covers them)
        url = f"{hub.base_url}/v1/devices/{device_id}/events"
        async with hub.client.stream("GET", url, headers=hub.headers) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            [(snap_id, name, _)] = await _sse(lines, 1)
            assert name == "device.snapshot" and snap_id == "2"
            await _record(hub, device_id, 3)
            got = await _sse(lines, 2)  # the client reads two of three, then drops
        assert [(i, d["payload"]["n"]) for i, _, d in got] == [("3", 0), ("4", 1)]
        await _record(hub, device_id, 2)  # missed while away
        other, _ = await hub.provision("other")
        await _record(hub, other, 1)  # another subject: never on this stream
        resume = {**hub.headers, "Last-Event-ID": got[-1][0]}
        async with hub.client.stream("GET", url, headers=resume) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            replayed = await _sse(lines, 3)  # no snapshot: what was missed, in order
            await _record(hub, device_id, 1)  # then live
            live = await _sse(lines, 1)
        ids = [int(i) for i, _, _ in replayed + live]
        assert ids == [5, 6, 7, 9]  # 8 is the other device's
        assert [d["payload"]["n"] for _, _, d in replayed + live] == [2, 0, 1, 0]
        assert all(name == "device.event.probe" and d["deviceId"] == device_id for _, name, d in replayed + live)
        r = await hub.call("GET", f"/v1/devices/{device_id}/events", headers={**hub.headers, "Last-Event-ID": "x1"})
        assert_error(r, 400, "invalid_cursor")


async def test_a_cursor_past_retention_answers_410_with_the_oldest_cursor(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        device_id, _ = await hub.provision("old")
        await _record(hub, device_id, 3)
        removed = await s.stores.event_log.prune(s.clock.now() + dt.timedelta(seconds=1), batch=2)
        assert removed == 2  # one batch; the next call takes the rest
        body = assert_error(await hub.call("GET", "/v1/events", params={"after": 1}), 410, "cursor_expired")
        assert body["details"] == {"oldestCursor": 2}
        page = await _events(hub, after=2)
        assert [e["sequence"] for e in page["data"]] == ["3"] and page["oldestCursor"] == 2
        r = await hub.call("GET", f"/v1/devices/{device_id}/events", headers={**hub.headers, "Last-Event-ID": "0"})
        assert assert_error(r, 410, "cursor_expired")["details"] == {"oldestCursor": 2}
        assert await s.stores.event_log.prune(s.clock.now() + dt.timedelta(seconds=1), batch=2) == 1
        assert await s.stores.event_log.prune(s.clock.now() + dt.timedelta(seconds=1), batch=2) == 0


async def test_with_the_log_off_streams_carry_events_live_without_ids(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path, event_log=False)
        device_id, _ = await hub.provision("unlogged")
        assert_error(await hub.call("GET", "/v1/events"), 503, "event_log_off")
        url = f"{hub.base_url}/v1/devices/{device_id}/events"
        async with hub.client.stream("GET", url, headers=hub.headers) as r:
            lines = r.aiter_lines()
            [(snap_id, _, _)] = await _sse(lines, 1)
            await _record(hub, device_id, 1)
            [(event_id, name, data)] = await _sse(lines, 1)
        assert snap_id is None and event_id is None and name == "device.event.probe" and data["payload"] == {"n": 0}
        assert await hub.services.stores.event_log.cursors(uuid.UUID(hub.org_id)) == (0, 0)  # nothing written


class _FlakyLog:
    """An EventLog stand-in: refuses events whose payload says so, and is away while ``away``."""

    def __init__(self) -> None:
        self.written: list[int] = []
        self.away = False
        self.away_after_calls: int | None = None
        self.calls = 0

    async def append(self, events) -> list[int]:
        from storage.db import DatabaseUnavailable

        self.calls += 1
        if self.away or (self.away_after_calls is not None and self.calls > self.away_after_calls):
            raise DatabaseUnavailable("away")
        if any(e.data.get("refuse") for e in events):
            raise ValueError("a row PostgreSQL refuses")
        self.written += [e.data["n"] for e in events]
        return list(range(len(events)))


async def test_the_journal_sets_aside_a_refused_event_and_writes_nothing_twice_across_an_outage():
    from hub.eventlog import Journal
    from hub.events import EventHub

    with trio.fail_after(30):
        flaky, hub = _FlakyLog(), EventHub()
        journal = Journal(flaky, hub)
        org, device = uuid.uuid4(), str(uuid.uuid4())
        heard = hub.subscribe(("device", uuid.UUID(device)))
        at = "2026-11-27T19:00:00.000Z"
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            # one batch of 8 with a refused event in the middle; PostgreSQL goes away during the
            # halves (after the first three appends): what was written before must not be written again
            flaky.away_after_calls = 3
            for n in range(8):
                journal.record(org, {"kind": "device.event.x", "deviceId": device, "at": at,
                                     "payload": {"n": n, "refuse": n == 5}})
            await wait_for(lambda: flaky.calls > 4, timeout=10)
            flaky.away_after_calls = None
            await journal.wait_written()
            nursery.cancel_scope.cancel()
        assert sorted(flaky.written) == [0, 1, 2, 3, 4, 6, 7] and len(flaky.written) == 7
        assert journal.set_aside == 1 and journal.appended == 7
        published = []
        while True:
            try:
                published.append(heard.receive.receive_nowait()["payload"]["n"])
            except trio.WouldBlock:
                break
        assert published == [0, 1, 2, 3, 4, 6, 7]  # in order, once each, the refused one never


async def test_the_journal_writes_a_lone_event_at_once_and_paces_a_steady_stream(autojump_clock):
    """On trio's virtual clock: an event that finds the writer idle is written without waiting; a steady
    stream of 100 events a second is written at most once per PACE (also what arrives while a batch is
    being written waits for the next), and no event waits past PACE."""
    from hub.eventlog import PACE, Journal
    from hub.events import EventHub

    class Timed(_FlakyLog):
        def __init__(self) -> None:
            super().__init__()
            self.at: dict[int, float] = {}

        async def append(self, events) -> list[int]:
            for e in events:
                self.at[e.data["n"]] = trio.current_time()
            await trio.sleep(0.03)  # a write's round trip: events go on arriving meanwhile
            return await super().append(events)

    log, org, device = Timed(), uuid.uuid4(), str(uuid.uuid4())
    journal = Journal(log, EventHub())
    at = "2026-11-27T19:00:00.000Z"
    recorded: dict[int, float] = {}

    def record(n: int) -> None:
        recorded[n] = trio.current_time()
        journal.record(org, {"kind": "device.event.x", "deviceId": device, "at": at, "payload": {"n": n}})

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            await trio.sleep(5)
            record(0)
            await journal.wait_written()
            assert log.at[0] == recorded[0]  # idle for 5 s: written at once
            calls = log.calls
            for n in range(1, 201):  # 2 s at 100 events a second
                record(n)
                await trio.sleep(0.01)
            await journal.wait_written()
            nursery.cancel_scope.cancel()
    assert sorted(log.written) == list(range(201))
    assert log.calls - calls <= 2 / PACE + 2
    assert max(log.at[n] - recorded[n] for n in range(1, 201)) <= PACE + 1e-9
