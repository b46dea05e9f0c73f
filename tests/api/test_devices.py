"""Devices over REST on a real hub, with real agents connected over WebSocket."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import trio

from tests.hubtools import assert_error, device, metric_value, metrics, start_agent, start_hub, wait_for

FACTS = {"firmware": "robo-os 4.2.0", "architecture": "aarch64"}


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, command_timeout=2)


def parse_time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


async def test_provision_returns_the_token_once(hub):
    with trio.fail_after(20):
        r = await hub.call("POST", "/v1/devices", json={"name": "robot-1", "tags": ["lab", "arm"]})
        assert r.status_code == 201, r.text
        data = r.json()["data"]
        uuid.UUID(data["id"])
        assert data["name"] == "robot-1" and data["tags"] == ["lab", "arm"] and data["fleet_id"] is None
        assert data["online"] is False and data["state"] == "offline" and data["last_seen"] is None
        assert isinstance(data["token"], str) and len(data["token"]) >= 32
        token = data["token"]
        r = await hub.call("GET", f"/v1/devices/{data['id']}")
        assert r.status_code == 200
        assert "token" not in r.json()["data"] and token not in r.text
        r = await hub.call("GET", "/v1/devices")
        assert "token" not in r.json()["data"][0] and token not in r.text
        # two devices never share a token
        _, token2 = await hub.provision("robot-2")
        assert token2 != token


async def test_list_filters_and_pagination(hub, nursery, tmp_path):
    with trio.fail_after(30):
        r = await hub.call("POST", "/v1/fleets", json={"name": "line-a"})
        fleet_a = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/fleets", json={"name": "line-b"})
        fleet_b = r.json()["data"]["id"]
        ids = {}
        for i in range(7):
            fleet = fleet_a if i < 4 else fleet_b
            tags = ["even"] if i % 2 == 0 else ["odd"]
            if i == 0:
                tags.append("first")
            ids[i] = (await hub.provision(f"d{i}", fleet_id=fleet, tags=tags))
        await hub.provision("loose")

        async def listing(query: str = "") -> dict:
            r = await hub.call("GET", "/v1/devices" + query)
            assert r.status_code == 200, r.text
            return r.json()

        body = await listing()
        assert body["pagination"] == {"page": 1, "limit": 10, "total": 8, "totalPages": 1}
        assert [d["name"] for d in body["data"]] == [f"d{i}" for i in range(7)] + ["loose"]

        body = await listing(f"?fleet_id={fleet_a}")
        assert {d["name"] for d in body["data"]} == {"d0", "d1", "d2", "d3"}
        assert all(d["fleet_id"] == fleet_a for d in body["data"])
        assert body["pagination"]["total"] == 4
        body = await listing(f"?fleet_id={fleet_b}&tag=even")
        assert {d["name"] for d in body["data"]} == {"d4", "d6"}
        body = await listing("?tag=first")
        assert [d["name"] for d in body["data"]] == ["d0"]
        body = await listing("?tag=nobody")
        assert body["data"] == [] and body["pagination"]["total"] == 0 and body["pagination"]["totalPages"] == 0
        body = await listing(f"?fleet_id={uuid.uuid4()}")
        assert body["data"] == []

        # pages
        seen = []
        for page in (1, 2, 3):
            body = await listing(f"?limit=3&page={page}")
            assert body["pagination"] == {"page": page, "limit": 3, "total": 8, "totalPages": 3}
            seen += [d["name"] for d in body["data"]]
        assert seen == [f"d{i}" for i in range(7)] + ["loose"]
        body = await listing("?limit=3&page=4")
        assert body["data"] == [] and body["pagination"]["total"] == 8
        body = await listing(f"?fleet_id={fleet_a}&limit=3&page=2")
        assert [d["name"] for d in body["data"]] == ["d3"]
        assert body["pagination"] == {"page": 2, "limit": 3, "total": 4, "totalPages": 2}

        # online: connect two agents for real; the filter follows
        body = await listing("?online=true")
        assert body["data"] == []
        for i in (1, 5):
            await start_agent(nursery, hub.base_url, ids[i][1], tmp_path / f"agent{i}")

        async def two_online() -> bool:
            return {d["name"] for d in (await listing("?online=true"))["data"]} == {"d1", "d5"}

        await wait_for(two_online, timeout=10)
        body = await listing("?online=false")
        assert body["pagination"]["total"] == 6 and all(not d["online"] for d in body["data"])
        body = await listing(f"?online=true&fleet_id={fleet_b}")
        assert [d["name"] for d in body["data"]] == ["d5"]
        body = await listing("?online=true&tag=odd&limit=1")
        assert body["pagination"] == {"page": 1, "limit": 1, "total": 2, "totalPages": 2}

        # invalid query values are 400 with our error body, never 500
        for bad in ("?limit=0", "?limit=100000", "?page=0", "?page=-1", "?limit=abc", "?online=maybe",
                    "?fleet_id=not-a-uuid"):
            r = await hub.call("GET", "/v1/devices" + bad)
            assert_error(r, 400)


async def test_get_shows_live_facts_of_a_connected_agent(hub, nursery, tmp_path):
    with trio.fail_after(30):
        dev_id, token = await hub.provision("robot")
        before = hub.services.clock.now()
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent", facts=FACTS)
        assert running.agent.device_id == dev_id

        async def facts_stored() -> bool:
            d = await device(hub, dev_id)
            return d["online"] and d["firmware"] == FACTS["firmware"]

        await wait_for(facts_stored, timeout=10)
        d = await device(hub, dev_id)
        assert d["state"] == "online"
        assert d["architecture"] == "aarch64"
        assert d["boot_reason"] == "power_on"
        assert d["has_tunnel_identity"] is True
        assert parse_time(d["last_seen"]) >= before - dt.timedelta(seconds=1)
        assert isinstance(d["conditions"], list)
        # the tunnel identity stored (written behind the live state) is the agent's own public key
        async def stored_key():
            row = await hub.services.stores.devices.get_any(uuid.UUID(dev_id))
            return row["tunnel_public_key"] == running.agent.public_key_b64

        await wait_for(stored_key, timeout=5)


async def test_patch_device(hub):
    with trio.fail_after(20):
        dev_id, _ = await hub.provision("old-name", tags=["a"])
        r = await hub.call("POST", "/v1/fleets", json={"name": "f"})
        fleet_id = r.json()["data"]["id"]
        r = await hub.call("PATCH", f"/v1/devices/{dev_id}", json={"name": "new-name"})
        assert r.status_code == 200, r.text
        assert r.json()["data"]["name"] == "new-name" and r.json()["data"]["tags"] == ["a"]
        r = await hub.call("PATCH", f"/v1/devices/{dev_id}", json={"tags": ["b", "c"], "fleet_id": fleet_id})
        assert r.status_code == 200, r.text
        d = await device(hub, dev_id)
        assert (d["name"], d["tags"], d["fleet_id"]) == ("new-name", ["b", "c"], fleet_id)
        assert parse_time(d["updated_at"]) >= parse_time(d["created_at"])
        r = await hub.call("GET", f"/v1/fleets/{fleet_id}")
        assert r.json()["data"]["device_count"] == 1
        # moving out of the fleet
        r = await hub.call("PATCH", f"/v1/devices/{dev_id}", json={"fleet_id": None})
        assert r.status_code == 200 and r.json()["data"]["fleet_id"] is None
        # invalid changes are 400 and change nothing
        for body in ({"name": None}, {"tags": None}, {"name": ""}, {"token": "x"},
                     {"fleet_id": str(uuid.uuid4())}, {"fleet_id": "nope"}):
            r = await hub.call("PATCH", f"/v1/devices/{dev_id}", json=body)
            assert_error(r, 400)
        d = await device(hub, dev_id)
        assert (d["name"], d["tags"], d["fleet_id"]) == ("new-name", ["b", "c"], None)
        r = await hub.call("PATCH", f"/v1/devices/{uuid.uuid4()}", json={"name": "x"})
        assert_error(r, 404, "not_found")


async def test_delete_device_closes_its_link_and_refuses_reconnects(hub, nursery, tmp_path):
    with trio.fail_after(30):
        dev_id, token = await hub.provision("doomed")
        keep_id, keep_token = await hub.provision("kept")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        await start_agent(nursery, hub.base_url, keep_token, tmp_path / "kept")
        await wait_for(lambda: len(hub.services.links) == 2)
        rejects = metric_value(await metrics(hub), "fleethub_device_rejects_total")

        r = await hub.call("DELETE", f"/v1/devices/{dev_id}")
        assert r.status_code == 200, r.text
        assert r.json()["data"] == {"id": dev_id, "deleted": True}
        r = await hub.call("GET", f"/v1/devices/{dev_id}")
        assert_error(r, 404, "not_found")
        r = await hub.call("DELETE", f"/v1/devices/{dev_id}")
        assert_error(r, 404, "not_found")

        await wait_for(lambda: not running.agent.connected, timeout=10)
        assert uuid.UUID(dev_id) not in hub.services.links

        async def refused_again() -> bool:
            text = await metrics(hub)
            return metric_value(text, "fleethub_device_rejects_total") >= rejects + 2

        await wait_for(refused_again, timeout=10)  # it keeps trying, and keeps being refused
        assert not running.agent.connected
        assert uuid.UUID(dev_id) not in hub.services.links
        assert metric_value(await metrics(hub), "fleethub_connected_devices") == 1
        assert "401" in (running.agent.statistics().last_error or "")
        r = await hub.call("GET", "/v1/devices")
        assert [d["id"] for d in r.json()["data"]] == [keep_id]
        assert (await device(hub, keep_id))["online"] is True
