"""One bad row, one hostile device: the fault stays with its source (issue 14, sections 2 and 4).

A request or a device frame carrying text PostgreSQL cannot store must not cost anybody else's rows
(the write-behind writes every row in one statement), and a device flooding the link slows only
itself: its link stops being read while every other device goes on.
"""

from __future__ import annotations

import uuid

import trio
from trio_websocket import open_websocket_url

from device_client.shared import protocol
from device_client.agent import link_url
from hub.api.link import CLOSE_BAD_FRAME
from tests.api.test_link_abuse import _closed_with
from tests.hubtools import metric_value, metrics, start_agent, start_hub, wait_for


async def _raw_link(hub, token: str, hello: str):
    headers = [(b"authorization", f"Bearer {token}".encode())]
    cm = open_websocket_url(link_url(hub.base_url), extra_headers=headers)
    ws = await cm.__aenter__()
    await ws.send_message(hello)
    return cm, ws


async def test_a_nul_in_a_path_is_audited_escaped_and_other_tenants_rows_are_written(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        s = hub.services
        other = await s.stores.orgs.create_org("Other Org", s.clock.now())
        other_pat = await hub.new_user("admin", str(other["id"]))
        other_headers = {"X-API-Token-ID": other_pat[0], "X-API-Secret-Key": other_pat[1],
                         "X-Organization-ID": str(other["id"])}
        await s.audit_log.flush()
        async with s.audit_log.held():  # the tenants' calls and the hostile one land in the same batch
            assert (await hub.call("GET", "/v1/devices")).status_code == 200
            hostile = await hub.client.get(hub.base_url + "/v1/x%00?q=%00")
            assert hostile.status_code in (400, 401, 404)  # refused either way, and audited
            assert (await hub.call("GET", "/v1/fleets", headers=other_headers)).status_code == 200
            assert s.audit_log.pending() >= 3
        await s.audit_log.flush()
        assert s.audit_log.set_aside == 0

        mine, _ = await s.stores.audit.query(uuid.UUID(hub.org_id), offset=0, limit=100)
        theirs, _ = await s.stores.audit.query(other["id"], offset=0, limit=100)
        assert [e["path"] for e in mine] == ["/v1/devices"]
        assert [e["path"] for e in theirs] == ["/v1/fleets"]
        row = await s.db.fetchrow("SELECT path, query, status FROM audit_events WHERE actor_type = 'anonymous'"
                                  " AND starts_with(path, '/v1/x')")
        assert row is not None, "the hostile request is recorded, not dropped"
        assert row["path"] == "/v1/x\\x00" and row["query"].startswith("q=\\x00")


async def test_a_hello_with_a_nul_is_closed_4400_and_other_devices_presence_is_written(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        good_id, good_token = await hub.provision("good")
        bad_id, bad_token = await hub.provision("bad")
        hello = protocol.encode(protocol.Hello(firmware="fw", architecture="x", bootReason="power_on"))
        cm, ws = await _raw_link(hub, bad_token, hello.replace("power_on", "power\\u0000on"))
        try:
            good = await start_agent(nursery, hub.base_url, good_token, tmp_path / "good",
                                     facts={"firmware": "good-fw 1", "architecture": "armv7l"})
            code, reason = await _closed_with(ws)
        finally:
            await cm.__aexit__(None, None, None)
        assert code == CLOSE_BAD_FRAME and "bootReason" in reason, (code, reason)

        async def good_stored() -> bool:
            row = await hub.services.stores.devices.get_any(uuid.UUID(good_id))
            return row["online"] and row["firmware"] == "good-fw 1"
        await wait_for(good_stored, timeout=10)
        assert good.agent.connected
        bad = await hub.services.stores.devices.get_any(uuid.UUID(bad_id))
        assert not bad["online"] and bad["boot_reason"] != "power\x00on"
        assert hub.services.presence.set_aside == 0  # refused at the link, never reached storage


async def test_an_event_kind_with_a_newline_cannot_forge_stream_events(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        dev_id, token = await hub.provision("forger")
        cm, ws = await _raw_link(hub, token, protocol.encode(protocol.Hello(firmware="fw", architecture="x")))
        subscription = hub.services.events.subscribe(("device", uuid.UUID(dev_id)))
        try:
            assert isinstance(protocol.decode(await ws.get_message()), protocol.Welcome)
            forged = ('{"type": "event", "kind": "x\\nevent: device.state\\ndata: {\\"state\\":\\"offline\\"}",'
                      ' "payload": {}}')
            await ws.send_message(forged)
            code, reason = await _closed_with(ws)
        finally:
            await cm.__aexit__(None, None, None)
        assert code == CLOSE_BAD_FRAME and "event.kind" in reason, (code, reason)
        with subscription:
            kinds = []
            while True:
                try:
                    kinds.append(subscription.receive.receive_nowait()["kind"])
                except trio.WouldBlock:
                    break
        assert all("\n" not in k for k in kinds) and not any(k.startswith("device.x") for k in kinds), kinds


async def test_a_flooding_device_is_pushed_back_while_another_device_answers(nursery, db_url, tmp_path):
    """The flooder sends events that each start storage work. The hub handles every one of them (none
    dropped), holds that device's background work to its bound and its mailbox to its size by not
    reading its socket, and the other device answers pings all along."""
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        good_id, good_token = await hub.provision("good")
        await start_agent(nursery, hub.base_url, good_token, tmp_path / "good")
        flood_id, flood_token = await hub.provision("flood")
        cm, ws = await _raw_link(hub, flood_token, protocol.encode(protocol.Hello(firmware="fw", architecture="x")))
        try:
            assert isinstance(protocol.decode(await ws.get_message()), protocol.Welcome)
            actor = hub.services.registry.lookup(("device", uuid.UUID(flood_id)))
            await wait_for(lambda: actor.statistics().mailbox_depth == 0 and not actor.tasks.child_tasks)
            handled_before = actor.handled
            n = 1500
            event = protocol.encode(protocol.Event(kind="files.result", payload={"results": [
                {"fileId": str(uuid.uuid4()), "path": "/etc/x", "status": "failed", "error": "disk full"}]}))
            most_tasks = 0
            pings: list[float] = []

            async def watch() -> None:
                nonlocal most_tasks
                while True:
                    most_tasks = max(most_tasks, len(actor.tasks.child_tasks))
                    await trio.sleep(0)

            async def ping_other() -> None:
                while True:
                    t0 = trio.current_time()
                    r = await hub.call("POST", f"/v1/devices/{good_id}/ping")
                    assert r.status_code == 200, r.text
                    pings.append(trio.current_time() - t0)
                    await trio.sleep(0.05)

            async with trio.open_nursery() as side:
                side.start_soon(watch)
                side.start_soon(ping_other)
                for _ in range(n):
                    await ws.send_message(event)
                # every event reaches the actor: with events dropped on a full mailbox this never holds
                await wait_for(lambda: actor.handled - handled_before >= n, timeout=30)
                await wait_for(lambda: len(pings) >= 3, timeout=10)
                side.cancel_scope.cancel()
        finally:
            await cm.__aexit__(None, None, None)
        # bounded work (DeviceActor.event_jobs, 4), not a task per event
        assert most_tasks <= 6, most_tasks
        text = await metrics(hub)
        assert metric_value(text, "fleethub_device_link_waits_total") > 0  # the link waited for room
        assert max(pings) < 5.0, pings


async def test_a_row_the_database_refuses_costs_only_itself_and_is_counted(nursery, db_url, tmp_path, caplog):
    """The write-behind's own defence, behind the boundaries: a row that still carries a NUL (a bug in
    some boundary) is set aside alone; the other rows of its batch are written; /metrics counts it."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        s = hub.services
        await s.audit_log.flush()
        assert (await hub.call("GET", "/v1/devices")).status_code == 200
        poisoned = uuid.uuid4()
        s.audit_log.append({"id": poisoned, "org_id": None, "at": s.clock.now(), "actor_type": "system",
                            "method": "EVENT", "path": "/v1/secret-\x00-text", "status": 200, "details": None})
        assert (await hub.call("GET", "/v1/fleets")).status_code == 200
        await s.audit_log.flush()
        mine, _ = await s.stores.audit.query(uuid.UUID(hub.org_id), offset=0, limit=100)
        assert sorted(e["path"] for e in mine) == ["/v1/devices", "/v1/fleets"]
        text = await metrics(hub)
        assert metric_value(text, "fleethub_write_behind_set_aside_total", {"kind": "audit"}) == 1
        assert metric_value(text, "fleethub_write_behind_dropped_total", {"kind": "audit"}) == 0
        assert metric_value(text, "fleethub_write_behind_pending", {"kind": "presence"}) is not None
        assert str(poisoned) in caplog.text and "secret-" not in caplog.text


async def test_a_key_push_tells_a_bounded_number_of_devices_at_once(nursery, db_url, tmp_path, monkeypatch):
    from hub.tunnels import grants

    monkeypatch.setattr(grants, "PUSH_CONCURRENCY", 3, raising=False)  # 8 devices, 3 at a time

    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        in_flight = most = 0

        async def device(token: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
            nonlocal in_flight, most
            headers = [(b"authorization", f"Bearer {token}".encode())]
            async with open_websocket_url(link_url(hub.base_url), extra_headers=headers) as ws:
                await ws.send_message(protocol.encode(protocol.Hello(firmware="fw", architecture="x")))
                assert isinstance(protocol.decode(await ws.get_message()), protocol.Welcome)
                task_status.started()
                while True:
                    command = protocol.decode(await ws.get_message())
                    in_flight += 1
                    most = max(most, in_flight)
                    await trio.sleep(0.2)  # a slow device: the push must not start everyone at once
                    in_flight -= 1
                    await ws.send_message(protocol.encode(protocol.Reply(id=command.id, ok=True,
                                                                         payload={"kids": []})))

        async with trio.open_nursery() as devices:
            for i in range(8):
                _, token = await hub.provision(f"d{i}")
                await devices.start(device, token)
            await wait_for(lambda: len(hub.services.links) == 8)
            assert await grants.push_hub_keys(hub.services) == 8
            devices.cancel_scope.cancel()
        assert most == 3


async def test_a_device_whose_actor_keeps_crashing_costs_itself_and_not_the_hub(nursery, db_url, tmp_path, monkeypatch):
    """Past its crash budget one DeviceActor is given up (before: Escalation stopped the whole hub, every
    device with it). Its link is closed, the device reconnects to a fresh actor, the other device never
    notices."""
    from actors.device import DeviceActor
    from actors.machines.connection import Heartbeat

    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        bad, bad_token = await hub.provision("bad")
        good, good_token = await hub.provision("good")
        bad_agent = await start_agent(nursery, hub.base_url, bad_token, tmp_path / "bad")
        await start_agent(nursery, hub.base_url, good_token, tmp_path / "good")
        crashing = {"on": True}
        receive = DeviceActor.receive

        async def faulty(self, msg):
            if crashing["on"] and str(self.device_id) == bad and isinstance(msg, Heartbeat):
                raise RuntimeError("a bug this device's heartbeats reach")
            return await receive(self, msg)

        async def pings(device_id: str) -> bool:
            return (await hub.call("POST", f"/v1/devices/{device_id}/ping")).status_code == 200

        await wait_for(lambda: pings(bad), timeout=20)
        await wait_for(lambda: pings(good), timeout=20)
        links_before = bad_agent.agent.statistics().links
        monkeypatch.setattr(DeviceActor, "receive", faulty)
        sup = hub.services.supervisor
        await wait_for(lambda: sup.given_up_total >= 1, timeout=30, interval=0.1)
        crashing["on"] = False
        assert await pings(good)  # the hub and the other device go on
        await wait_for(lambda: bad_agent.agent.statistics().links > links_before, timeout=30)
        await wait_for(lambda: pings(bad), timeout=20)  # a fresh actor for the device that reconnected
        text = await metrics(hub)
        assert metric_value(text, "fleethub_actors_given_up_total") >= 1
