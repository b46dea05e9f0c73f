"""Fleets over REST on a real hub and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
import trio

from tests.hubtools import assert_error, start_hub


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path)


async def make_config(hub, org_id: str, name: str) -> str:
    """A configuration row (its REST API is another issue; fleets only reference it)."""
    config_id = uuid.uuid4()
    now = hub.services.clock.now()
    await hub.services.db.execute(
        "INSERT INTO configurations (id, org_id, name, created_at, updated_at) VALUES ($1, $2, $3, $4, $4)",
        config_id, uuid.UUID(org_id), name, now)
    return str(config_id)


async def test_create_get_list(hub):
    with trio.fail_after(20):
        config_id = await make_config(hub, hub.org_id, "base")
        r = await hub.call("POST", "/v1/fleets", json={
            "name": "warehouse", "description": "pick robots", "tags": ["eu", "prod"], "architecture": "aarch64",
            "config_id": config_id, "registry_proxy": True})
        assert r.status_code == 201, r.text
        created = r.json()["data"]
        uuid.UUID(created["id"])
        assert created == {**created, "name": "warehouse", "description": "pick robots", "tags": ["eu", "prod"],
                           "architecture": "aarch64", "config_id": config_id, "registry_proxy": True,
                           "device_count": 0}
        assert created["created_at"] and created["updated_at"]
        r = await hub.call("GET", f"/v1/fleets/{created['id']}")
        assert r.status_code == 200
        assert r.json()["data"] == created

        r = await hub.call("POST", "/v1/fleets", json={"name": "minimal"})
        assert r.status_code == 201, r.text
        minimal = r.json()["data"]
        assert (minimal["description"], minimal["tags"], minimal["architecture"], minimal["config_id"],
                minimal["registry_proxy"]) == ("", [], None, None, False)

        await hub.provision("in-fleet", fleet_id=created["id"])
        await hub.provision("in-fleet-2", fleet_id=created["id"])
        r = await hub.call("GET", "/v1/fleets")
        body = r.json()
        assert [f["name"] for f in body["data"]] == ["warehouse", "minimal"]
        assert [f["device_count"] for f in body["data"]] == [2, 0]
        assert body["pagination"] == {"page": 1, "limit": 10, "total": 2, "totalPages": 1}
        r = await hub.call("GET", "/v1/fleets?limit=1&page=2")
        body = r.json()
        assert [f["name"] for f in body["data"]] == ["minimal"]
        assert body["pagination"] == {"page": 2, "limit": 1, "total": 2, "totalPages": 2}


async def test_duplicate_name_is_409_per_org(hub):
    with trio.fail_after(20):
        r = await hub.call("POST", "/v1/fleets", json={"name": "dup"})
        assert r.status_code == 201
        r = await hub.call("POST", "/v1/fleets", json={"name": "dup", "description": "again"})
        body = assert_error(r, 409)
        assert "dup" in body["message"]
        r = await hub.call("GET", "/v1/fleets")
        assert r.json()["pagination"]["total"] == 1
        # renaming onto an existing name is a conflict too
        r = await hub.call("POST", "/v1/fleets", json={"name": "other"})
        other_id = r.json()["data"]["id"]
        r = await hub.call("PATCH", f"/v1/fleets/{other_id}", json={"name": "dup"})
        assert_error(r, 409)
        r = await hub.call("GET", f"/v1/fleets/{other_id}")
        assert r.json()["data"]["name"] == "other"
        # another organisation may use the same name
        s = hub.services
        org2 = await s.stores.orgs.create_org("Second", s.clock.now())
        pat = await hub.new_user("admin", str(org2["id"]))
        headers = {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1], "X-Organization-ID": str(org2["id"])}
        r = await hub.call("POST", "/v1/fleets", json={"name": "dup"}, headers=headers)
        assert r.status_code == 201, r.text


async def test_unknown_or_foreign_config_is_400(hub):
    with trio.fail_after(20):
        s = hub.services
        org2 = await s.stores.orgs.create_org("Second", s.clock.now())
        foreign = await make_config(hub, str(org2["id"]), "theirs")
        for config_id in (foreign, str(uuid.uuid4())):
            r = await hub.call("POST", "/v1/fleets", json={"name": "f", "config_id": config_id})
            body = assert_error(r, 400)
            assert "config_id" in body["message"]
        r = await hub.call("POST", "/v1/fleets", json={"name": "f", "config_id": "nope"})
        assert_error(r, 400)
        r = await hub.call("GET", "/v1/fleets")
        assert r.json()["data"] == []
        r = await hub.call("POST", "/v1/fleets", json={"name": "f"})
        fleet_id = r.json()["data"]["id"]
        r = await hub.call("PATCH", f"/v1/fleets/{fleet_id}", json={"config_id": foreign})
        assert_error(r, 400)
        r = await hub.call("GET", f"/v1/fleets/{fleet_id}")
        assert r.json()["data"]["config_id"] is None


async def test_patch_fleet_fields(hub):
    with trio.fail_after(20):
        r = await hub.call("POST", "/v1/fleets", json={"name": "f", "tags": ["a"]})
        fleet = r.json()["data"]
        fid = fleet["id"]
        config_id = await make_config(hub, hub.org_id, "cfg")
        changes = [
            ({"name": "renamed"}, {"name": "renamed"}),
            ({"description": "now described"}, {"description": "now described"}),
            ({"tags": ["x", "y"]}, {"tags": ["x", "y"]}),
            ({"architecture": "x86_64"}, {"architecture": "x86_64"}),
            ({"registry_proxy": True}, {"registry_proxy": True}),
            ({"registry_proxy_mode": "always"}, {"registry_proxy_mode": "always"}),
            ({"config_id": config_id}, {"config_id": config_id}),
            ({"registry_proxy": False, "architecture": None}, {"registry_proxy": False, "architecture": None}),
            ({"config_id": None}, {"config_id": None}),
        ]
        expected = dict(fleet)
        for body, effect in changes:
            r = await hub.call("PATCH", f"/v1/fleets/{fid}", json=body)
            assert r.status_code == 200, (body, r.text)
            expected.update(effect)
            got = r.json()["data"]
            assert {k: got[k] for k in effect} == effect
            r = await hub.call("GET", f"/v1/fleets/{fid}")
            stored = r.json()["data"]
            assert {k: v for k, v in stored.items() if k != "updated_at"} == \
                {k: v for k, v in expected.items() if k != "updated_at"}
        assert stored["updated_at"] >= fleet["updated_at"]
        # invalid changes are refused and change nothing
        for body in ({"name": None}, {"tags": None}, {"registry_proxy": None}, {"description": None},
                     {"name": ""}, {"colour": "red"}, {"registry_proxy": "yes please"},
                     {"registry_proxy_mode": "sometimes"}, {"registry_proxy_mode": None}):
            r = await hub.call("PATCH", f"/v1/fleets/{fid}", json=body)
            assert_error(r, 400)
        r = await hub.call("GET", f"/v1/fleets/{fid}")
        assert r.json()["data"] == stored
        r = await hub.call("PATCH", f"/v1/fleets/{uuid.uuid4()}", json={"name": "ghost"})
        assert_error(r, 404, "not_found")
        r = await hub.call("GET", f"/v1/fleets/{uuid.uuid4()}")
        assert_error(r, 404, "not_found")
