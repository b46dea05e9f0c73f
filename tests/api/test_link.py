"""The device link end to end inside one process: real agents, real WebSockets, a real hub and database.

Covers presence (connect, heartbeats, loss), the handshake (bad tokens, bad first frames), the newest
connection winning, and commands that travel REST → actor → bus → socket → agent and back (reboot, ping).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid

import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from device_client.shared import protocol
from device_client.agent import Agent, link_url
from storage.db import Database
from tests.hubtools import assert_error, device, metric_value, metrics, start_agent, start_hub, wait_for

HEARTBEAT = 0.5  # the hub marks a device offline after 3 missed intervals: 1.5 s
COMMAND_TIMEOUT = 2.0
FACTS = {"firmware": "kiosk-fw 7.1", "architecture": "armv7l"}


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=HEARTBEAT,
                           command_timeout=COMMAND_TIMEOUT)


def parse_time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


async def gauge(hub, name: str, labels=None) -> float:
    return metric_value(await metrics(hub), name, labels)


async def is_online(hub, dev_id: str) -> bool:
    return (await device(hub, dev_id))["online"]


async def is_offline(hub, dev_id: str) -> bool:
    d = await device(hub, dev_id)
    return not d["online"] and d["state"] == "offline"


class _SlowRandom(random.Random):
    """Backoff always picks its ceiling: a replaced agent stays away for the whole test."""

    def uniform(self, a: float, b: float) -> float:
        return b


class StuckRebootAgent(Agent):
    """An agent whose reboot handler never answers. (``DeviceContext.register`` refuses to replace a
    built-in verb, so the handler is overridden here.)"""

    async def _reboot(self, payload):
        await trio.sleep_forever()


async def test_agent_connects_and_its_hello_facts_are_stored(hub, nursery, tmp_path):
    with trio.fail_after(30):
        dev_id, token = await hub.provision("kiosk")
        assert await gauge(hub, "fleethub_connected_devices") == 0
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent", facts=FACTS)
        agent = running.agent
        assert agent.connected and agent.device_id == dev_id
        text = await metrics(hub)
        assert metric_value(text, "fleethub_connected_devices") == 1
        assert metric_value(text, "fleethub_device_connects_total") == 1
        assert metric_value(text, "fleethub_device_rejects_total") == 0
        assert await is_online(hub, dev_id)

        async def stored() -> bool:
            row = await hub.services.stores.devices.get_any(uuid.UUID(dev_id))
            return row["online"] and row["firmware"] is not None

        await wait_for(stored, timeout=10)  # presence is written behind
        row = await hub.services.stores.devices.get_any(uuid.UUID(dev_id))
        assert row["firmware"] == FACTS["firmware"] and row["architecture"] == FACTS["architecture"]
        assert row["boot_reason"] == "power_on" and row["state"] == "online"
        assert row["tunnel_public_key"] == agent.public_key_b64
        assert row["facts"]["agentVersion"]
        d = await device(hub, dev_id)
        assert d["has_tunnel_identity"] is True
        assert (d["firmware"], d["architecture"], d["boot_reason"]) == (FACTS["firmware"], "armv7l", "power_on")


async def test_heartbeats_keep_a_device_online(hub, nursery, tmp_path):
    with trio.fail_after(30):
        dev_id, token = await hub.provision("steady")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        first_seen = parse_time((await device(hub, dev_id))["last_seen"])
        # Twice the heartbeat timeout: without heartbeats the hub would have dropped it by now.
        await trio.sleep(2 * 3 * HEARTBEAT)
        d = await device(hub, dev_id)
        assert d["online"] and d["state"] == "online"
        assert parse_time(d["last_seen"]) > first_seen
        stats = running.agent.statistics()
        assert stats.heartbeats_sent >= 4 and stats.links == 1 and stats.link_failures == 0
        assert await gauge(hub, "fleethub_device_connects_total") == 1, "never dropped and reconnected"
        assert await gauge(hub, "fleethub_connected_devices") == 1


async def test_killed_agent_goes_offline(hub, nursery, tmp_path):
    with trio.fail_after(30):
        dev_id, token = await hub.provision("fragile")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        assert await is_online(hub, dev_id)
        await running.kill()
        await wait_for(lambda: is_offline(hub, dev_id), timeout=10)
        assert await gauge(hub, "fleethub_connected_devices") == 0

        async def row_offline() -> bool:
            r = await hub.call("GET", "/v1/devices?online=false")
            return [x["id"] for x in r.json()["data"]] == [dev_id]

        await wait_for(row_offline, timeout=10)
        d = await device(hub, dev_id)
        assert d["last_seen"] is not None and d["boot_reason"] == "power_on"


async def test_silent_link_is_dropped_after_missed_heartbeats(hub, tmp_path):
    """A socket that stays open but sends nothing after its hello is declared dead."""
    with trio.fail_after(30):
        dev_id, token = await hub.provision("mute")
        headers = [(b"authorization", f"Bearer {token}".encode())]
        async with open_websocket_url(link_url(hub.base_url), extra_headers=headers) as ws:
            await ws.send_message(protocol.encode(protocol.Hello(firmware="raw", architecture="x")))
            welcome = protocol.decode(await ws.get_message())
            assert isinstance(welcome, protocol.Welcome)
            assert welcome.deviceId == dev_id and welcome.heartbeatInterval == HEARTBEAT
            assert await is_online(hub, dev_id)
            started = trio.current_time()
            with pytest.raises(ConnectionClosed):
                with trio.fail_after(10):
                    while True:
                        await ws.get_message()
            elapsed = trio.current_time() - started
            assert elapsed >= 3 * HEARTBEAT - 0.3, f"dropped too early ({elapsed:.2f}s)"
        await wait_for(lambda: is_offline(hub, dev_id), timeout=5)
        assert await gauge(hub, "fleethub_connected_devices") == 0


async def test_bad_token_is_refused_and_never_accepted(hub, nursery, tmp_path):
    with trio.fail_after(30):
        dev_id, _ = await hub.provision("victim")
        running = await start_agent(nursery, hub.base_url, "not-a-device-token", tmp_path / "agent", wait=False)

        async def refused_twice() -> bool:
            return await gauge(hub, "fleethub_device_rejects_total") >= 2

        await wait_for(refused_twice, timeout=10)
        # the hub counts a refusal before its answer reaches the agent: wait for the agent's own count
        await wait_for(lambda: running.agent.statistics().link_failures >= 2, timeout=10)
        stats = running.agent.statistics()
        assert stats.links == 0 and not running.agent.connected and stats.link_failures >= 2
        assert "401" in stats.last_error
        text = await metrics(hub)
        assert metric_value(text, "fleethub_device_connects_total") == 0
        assert metric_value(text, "fleethub_connected_devices") == 0
        assert hub.services.links == {}
        assert not await is_online(hub, dev_id)
        await running.kill()
        # a handshake with no token at all, and with a PAT instead of a device token
        for headers in ([], [(b"authorization", f"Bearer {hub.pat[1]}".encode())]):
            with pytest.raises(ConnectionRejected) as info:
                async with open_websocket_url(link_url(hub.base_url), extra_headers=headers):
                    pass
            assert info.value.status_code == 401
        assert await gauge(hub, "fleethub_device_connects_total") == 0


async def test_first_frame_must_be_a_hello(hub):
    with trio.fail_after(30):
        dev_id, token = await hub.provision("confused")
        headers = [(b"authorization", f"Bearer {token}".encode())]
        async with open_websocket_url(link_url(hub.base_url), extra_headers=headers) as ws:
            await ws.send_message(protocol.encode(protocol.Event(kind="heartbeat")))
            with pytest.raises(ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 4400
        assert not await is_online(hub, dev_id)
        assert await gauge(hub, "fleethub_device_connects_total") == 0


async def test_a_plain_get_of_the_link_is_426_and_the_refusal_has_a_json_body(hub):
    """The link is served in front of Quart (hub/asgi_websocket.py); what is not a WebSocket still
    gets the hub's own answer, and a refused handshake says why in JSON."""
    with trio.fail_after(30):
        dev_id, token = await hub.provision("plain")
        r = await hub.client.get(link_url(hub.base_url).replace("ws://", "http://"),
                                 headers={"Authorization": f"Bearer {token}"})
        assert_error(r, 426, "upgrade_required")
        assert r.headers["X-Request-ID"]
        with pytest.raises(ConnectionRejected) as info:
            async with open_websocket_url(link_url(hub.base_url), extra_headers=[(b"authorization", b"Bearer dev_x")]):
                pass
        assert info.value.status_code == 401
        assert json.loads(info.value.body) == {"error": "unauthenticated",
                                               "message": "a valid device token is required"}
        assert not await is_online(hub, dev_id)
        # a WebSocket on a path no route takes (Quart's, not the link's) is a 404 with the JSON body
        for path in ("/v1/device/link%00", "/nonexistent"):
            with pytest.raises(ConnectionRejected) as info:
                async with open_websocket_url(hub.base_url.replace("http://", "ws://") + path):
                    pass
            assert info.value.status_code == 404 and json.loads(info.value.body)["error"] == "not_found"


def _task_names() -> list[str]:
    names, stack = [], [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        names.append(task.name)
        stack.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return names


async def test_a_linked_device_costs_no_task_of_its_own(hub, nursery, tmp_path):
    """A link is hypercorn's connection task and nothing more (hub/asgi_websocket.py): no Quart
    WebSocket nursery with its two tasks, no task of the handler's. Structural, so it cannot flake: a
    change that puts the link back behind Quart, or gives it a task, fails here, before a benchmark."""
    with trio.fail_after(30):
        dev_id, token = await hub.provision("counted")
        await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        await wait_for(lambda: is_online(hub, dev_id), timeout=10)
        names = _task_names()
        assert not [n for n in names if "Websocket" in n or "device_link" in n], names
        # the agent's side of the socket lives in this process too: the hub's side is hypercorn's
        # task_group._handle, whose app call is the link (one per open WebSocket or request)
        assert sum(n.endswith("task_group._handle") for n in names) >= 1


async def test_newest_connection_wins(hub, nursery, tmp_path):
    with trio.fail_after(30):
        dev_id, token = await hub.provision("twin")
        old = await start_agent(nursery, hub.base_url, token, tmp_path / "old", backoff_initial=60,
                                backoff_max=60, rng=_SlowRandom(), facts={"firmware": "old-fw"})
        old_conn = hub.services.links[uuid.UUID(dev_id)].conn_id
        new = await start_agent(nursery, hub.base_url, token, tmp_path / "new", facts={"firmware": "new-fw"})
        assert new.agent.connected
        await wait_for(lambda: not old.agent.connected, timeout=10)
        assert old.agent.statistics().links == 1
        link = hub.services.links[uuid.UUID(dev_id)]
        assert link.conn_id != old_conn
        assert await gauge(hub, "fleethub_connected_devices") == 1
        assert await gauge(hub, "fleethub_device_connects_total") == 2
        # the old link's close does not take the device offline, and commands reach the new agent
        assert await is_online(hub, dev_id)
        await trio.sleep(3 * HEARTBEAT)
        assert await is_online(hub, dev_id), "still online well past the old link's last heartbeat"
        assert new.agent.connected and not old.agent.connected
        r = await hub.call("POST", f"/v1/devices/{dev_id}/ping")
        assert r.status_code == 200, r.text
        assert new.agent.statistics().commands_handled == 1
        assert old.agent.statistics().commands_handled == 0

        async def new_facts() -> bool:
            return (await device(hub, dev_id))["firmware"] == "new-fw"

        await wait_for(new_facts, timeout=5)


async def test_reboot_is_a_real_round_trip(hub, nursery, tmp_path):
    with trio.fail_after(30):
        dev_id, token = await hub.provision("rebooter")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        agent = running.agent
        assert agent.boot_count == 1 and agent.boot_reason == "power_on"
        connects = await gauge(hub, "fleethub_device_connects_total")
        r = await hub.call("POST", f"/v1/devices/{dev_id}/reboot")
        assert r.status_code == 202, r.text
        data = r.json()["data"]
        assert data["deviceId"] == dev_id and data["state"] == "rebooting"
        assert data["device"] == {"rebooting": True}
        # the device acknowledged before the 202; it is now powered off for a moment
        d = await device(hub, dev_id)
        assert d["state"] == "rebooting" and d["online"] is False, d

        async def back_from_reboot() -> bool:
            d = await device(hub, dev_id)
            return d["online"] and d["boot_reason"] == "reboot"

        await wait_for(back_from_reboot, timeout=10)
        assert agent.boot_count == 2 and agent.boot_reason == "reboot" and agent.connected
        assert await gauge(hub, "fleethub_device_connects_total") == connects + 1
        assert await gauge(hub, "fleethub_connected_devices") == 1

        async def row_says_reboot() -> bool:
            row = await hub.services.stores.devices.get_any(uuid.UUID(dev_id))
            return row["boot_reason"] == "reboot" and row["online"]

        await wait_for(row_says_reboot, timeout=5)
        # it rebooted exactly once, and answers commands again
        r = await hub.call("POST", f"/v1/devices/{dev_id}/ping")
        assert r.status_code == 200, r.text
        assert agent.boot_count == 2


async def test_reboot_of_an_offline_device_is_503(hub, nursery, tmp_path):
    with trio.fail_after(30):
        never_id, _ = await hub.provision("never-connected")
        r = await hub.call("POST", f"/v1/devices/{never_id}/reboot")
        assert_error(r, 503, "device_offline")
        r = await hub.call("POST", f"/v1/devices/{never_id}/ping")
        assert_error(r, 503, "device_offline")

        gone_id, token = await hub.provision("gone")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        await running.kill()
        await wait_for(lambda: is_offline(hub, gone_id), timeout=10)
        r = await hub.call("POST", f"/v1/devices/{gone_id}/reboot")
        assert_error(r, 503, "device_offline")
        assert running.agent.boot_count == 1


async def test_reboot_unanswered_is_504_and_the_device_stays_usable(hub, nursery, tmp_path):
    with trio.fail_after(30):
        dev_id, token = await hub.provision("stuck")
        await start_agent(nursery, hub.base_url, token, tmp_path / "agent", agent_cls=StuckRebootAgent)
        started = trio.current_time()
        r = await hub.call("POST", f"/v1/devices/{dev_id}/reboot")
        elapsed = trio.current_time() - started
        assert_error(r, 504, "device_timeout")
        assert COMMAND_TIMEOUT - 0.2 <= elapsed < COMMAND_TIMEOUT + 3, elapsed
        d = await device(hub, dev_id)
        assert d["online"] and d["state"] == "online" and d["boot_reason"] == "power_on"
        r = await hub.call("POST", f"/v1/devices/{dev_id}/ping")
        assert r.status_code == 200, r.text


async def test_ping_returns_the_devices_reply(hub, nursery, tmp_path):
    with trio.fail_after(30):
        dev_id, token = await hub.provision("pingable")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        r = await hub.call("POST", f"/v1/devices/{dev_id}/ping")
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert data["deviceId"] == dev_id
        assert data["device"]["pong"] is True
        parse_time(data["device"]["deviceClock"])
        assert 0 <= data["roundTripMs"] < COMMAND_TIMEOUT * 1000
        assert running.agent.statistics().commands_handled == 1
        r = await hub.call("POST", f"/v1/devices/{dev_id}/ping")
        assert r.status_code == 200 and running.agent.statistics().commands_handled == 2


async def test_a_device_shown_online_shows_its_hello_facts(hub, nursery, tmp_path):
    with trio.fail_after(30):
        for i in range(3):
            dev_id, token = await hub.provision(f"fresh-{i}")
            await start_agent(nursery, hub.base_url, token, tmp_path / f"agent{i}", facts=FACTS)
            first_online = None
            with trio.fail_after(10):
                while first_online is None:
                    d = await device(hub, dev_id)
                    first_online = d if d["online"] else None
                    await trio.sleep(0.01)
            assert first_online["firmware"] == FACTS["firmware"], first_online
            assert first_online["architecture"] == FACTS["architecture"], first_online
            assert first_online["has_tunnel_identity"] is True, first_online


PING_ROUTE = {"route": "POST /v1/devices/<device_id>/ping"}


async def test_a_ping_to_a_warm_device_costs_no_storage_crossing_and_a_fleet_move_is_seen(hub, nursery, tmp_path):
    """What access to a device is decided on is kept where the hub already is (storage/devices.py
    ``identities``), so a ping reads nothing from storage; /metrics says so by route. A move to another
    fleet by any process (here: plain SQL on another connection) is honoured by the next requests."""
    with trio.fail_after(40):
        fleet_a = (await hub.call("POST", "/v1/fleets", json={"name": "fleet-a"})).json()["data"]["id"]
        fleet_b = (await hub.call("POST", "/v1/fleets", json={"name": "fleet-b"})).json()["data"]["id"]
        dev_id, token = await hub.provision("warm", fleet_id=fleet_a)
        await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        pat = await hub.new_user("member")
        member = {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1], "X-Organization-ID": hub.org_id}
        me = (await hub.call("GET", "/v1/me", headers=member)).json()["data"]
        r = await hub.call("POST", "/v1/relations", json={"object_type": "fleet", "object_id": fleet_a,
                                                          "relation": "viewer", "subject_type": "user",
                                                          "subject_id": me["userId"]})
        assert r.status_code == 201, r.text
        assert (await hub.call("POST", f"/v1/devices/{dev_id}/ping", headers=member)).status_code == 200  # warm

        # The record's own cache keeps rows 2 s (storage/rowcache.py): long gone between two pings to
        # a device in a real fleet. The ping must not need it; a GET does, and is counted.
        hub.services.stores.devices.cache.clear()
        assert (await hub.call("GET", f"/v1/devices/{dev_id}", headers=member)).status_code == 200
        get_route = {"route": "GET /v1/devices/<device_id>"}
        assert metric_value(await metrics(hub), "fleethub_http_request_storage_crossings_sum", get_route) >= 1
        hub.services.stores.devices.cache.clear()
        text = await metrics(hub)
        count0 = metric_value(text, "fleethub_http_request_storage_crossings_count", PING_ROUTE)
        sum0 = metric_value(text, "fleethub_http_request_storage_crossings_sum", PING_ROUTE)
        for _ in range(5):
            r = await hub.call("POST", f"/v1/devices/{dev_id}/ping", headers=member)
            assert r.status_code == 200, r.text
        text = await metrics(hub)
        assert metric_value(text, "fleethub_http_request_storage_crossings_count", PING_ROUTE) == count0 + 5
        assert metric_value(text, "fleethub_http_request_storage_crossings_sum", PING_ROUTE) == sum0, \
            "a ping to a warm device crossed to storage"

        other = Database(hub.services.settings.database_url, min_size=1, max_size=1)
        await other.open()
        try:
            await other.execute("UPDATE devices SET fleet_id = $2 WHERE id = $1", uuid.UUID(dev_id),
                                uuid.UUID(fleet_b))
        finally:
            await other.close()

        async def refused() -> bool:
            r = await hub.call("POST", f"/v1/devices/{dev_id}/ping", headers=member)
            return r.status_code == 403
        await wait_for(refused, timeout=5)
