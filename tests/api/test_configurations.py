"""Configurations and versions over a real hub and PostgreSQL (no devices involved)."""

from __future__ import annotations

import uuid

import trio

from tests.hubtools import start_hub

SPEC = {"ports": [{"port": 8080, "protocol": "tcp"}], "image": "registry.local/app:1"}


async def test_create_get_update_version_delete(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        r = await hub.call("POST", "/v1/configurations", json={"name": "kiosk", "description": "Kiosk app",
                                                               "tags": ["eu"], "spec": SPEC})
        assert r.status_code == 201, r.text
        c = r.json()["data"]
        assert c["name"] == "kiosk" and c["currentVersion"] == 1 and c["status"] == "active"
        assert c["version"]["version"] == 1 and c["version"]["spec"]["image"] == "registry.local/app:1"
        assert c["version"]["spec"]["ports"] == [{"port": 8080, "protocol": "tcp"}]
        cid = c["id"]
        r = await hub.call("GET", f"/v1/configurations/{cid}")
        assert r.status_code == 200 and r.json()["data"]["version"]["version"] == 1
        # metadata only: no new version
        r = await hub.call("PUT", f"/v1/configurations/{cid}", json={"description": "new", "tags": []})
        assert r.status_code == 200 and r.json()["data"]["currentVersion"] == 1
        assert r.json()["data"]["description"] == "new"
        # a spec: a new version
        r = await hub.call("PUT", f"/v1/configurations/{cid}", json={"spec": {"ports": [{"port": "9090"}]}})
        assert r.status_code == 200 and r.json()["data"]["currentVersion"] == 2
        assert r.json()["data"]["version"]["spec"]["ports"] == [{"port": 9090}]
        r = await hub.call("POST", f"/v1/configurations/{cid}/versions", json={"spec": SPEC})
        assert r.status_code == 201 and r.json()["data"]["version"] == 3
        r = await hub.call("GET", f"/v1/configurations/{cid}/versions")
        assert [v["version"] for v in r.json()["data"]] == [3, 2, 1]
        r = await hub.call("DELETE", f"/v1/configurations/{cid}")
        assert r.status_code == 200
        assert (await hub.call("GET", f"/v1/configurations/{cid}")).status_code == 404


async def test_create_validation(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        cases = [
            (b"{nope", 400, "malformed_json"),
            ({"name": "a", "spec": SPEC, "extra": 1}, 400, "unknown_field"),
            ({"spec": SPEC}, 400, "missing_field"),
            ({"name": "a"}, 400, "missing_field"),
            ({"name": "a", "spec": "text"}, 400, None),
            ({"name": "a", "spec": {"ports": [{"port": 0}]}}, 400, "invalid_spec"),
            ({"name": "a", "spec": {"ports": [{"port": 65536}]}}, 400, "invalid_spec"),
            ({"name": "a", "spec": {"ports": [{"port": "80a"}]}}, 400, "invalid_spec"),
            ({"name": "a", "spec": {"ports": [{"port": 80.5}]}}, 400, "invalid_spec"),
            ({"name": "a", "spec": {"ports": [{"port": True}]}}, 400, "invalid_spec"),
            ({"name": "a", "spec": SPEC, "fleetId": str(uuid.uuid4())}, 400, "invalid_reference"),
        ]
        for payload, status, code in cases:
            kw = {"content": payload} if isinstance(payload, bytes) else {"json": payload}
            r = await hub.call("POST", "/v1/configurations", **kw)
            assert r.status_code == status, (payload, r.text)
            if code:
                assert r.json()["error"] == code, (payload, r.text)
        ok = await hub.call("POST", "/v1/configurations", json={"name": "a", "spec": {"ports": [{"port": "65535"}]}})
        assert ok.status_code == 201 and ok.json()["data"]["version"]["spec"]["ports"] == [{"port": 65535}]
        dup = await hub.call("POST", "/v1/configurations", json={"name": "a", "spec": SPEC})
        assert dup.status_code == 409
        # the spec rides in config.apply beside the files: bounded when saved (device_client/shared/protocol.py)
        from device_client.shared.protocol import CONFIG_SPEC_MAX_BYTES
        at_limit = {"blob": "x" * (CONFIG_SPEC_MAX_BYTES - 100)}  # the stored spec adds a few defaults
        r = await hub.call("POST", "/v1/configurations", json={"name": "big", "spec": at_limit})
        assert r.status_code == 201, r.text[:200]
        over = {"blob": "x" * CONFIG_SPEC_MAX_BYTES}
        r = await hub.call("POST", "/v1/configurations", json={"name": "bigger", "spec": over})
        assert r.status_code == 400 and r.json()["error"] == "invalid_spec" and "over the limit" in r.json()["message"]
        r = await hub.call("PUT", f"/v1/configurations/{ok.json()['data']['id']}", json={"spec": over})
        assert r.status_code == 400 and r.json()["error"] == "invalid_spec"
        no_org = {k: v for k, v in hub.headers.items() if k != "X-Organization-ID"}
        r = await hub.call("POST", "/v1/configurations", headers=no_org, json={"name": "b", "spec": SPEC})
        assert r.status_code == 400
        assert (await hub.call("GET", "/v1/configurations/not-a-uuid")).status_code == 400
        assert (await hub.call("GET", f"/v1/configurations/{uuid.uuid4()}")).status_code == 404


async def test_list_search_sort_and_summary_pagination(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        for i, name in enumerate(["alpha", "beta", "gamma", "delta_x"]):
            r = await hub.call("POST", "/v1/configurations",
                               json={"name": name, "description": f"number {i}", "spec": {}})
            assert r.status_code == 201
        r = await hub.call("GET", "/v1/configurations")
        body = r.json()
        assert body["pagination"] == {"page": 1, "limit": 10, "total": 4, "totalPages": 1}
        r = await hub.call("GET", "/v1/configurations", params={"sortBy": "name", "sortOrder": "asc", "limit": 2})
        assert [c["name"] for c in r.json()["data"]] == ["alpha", "beta"]
        assert r.json()["pagination"]["totalPages"] == 2
        r = await hub.call("GET", "/v1/configurations", params={"search": "number 2"})
        assert [c["name"] for c in r.json()["data"]] == ["gamma"]
        r = await hub.call("GET", "/v1/configurations", params={"search": "_"})  # literal, not a wildcard
        assert [c["name"] for c in r.json()["data"]] == ["delta_x"]
        for bad in ({"page": 0}, {"limit": "x"}, {"sortBy": "nope"}, {"sortOrder": "up"}, {"status": "gone"}):
            assert (await hub.call("GET", "/v1/configurations", params=bad)).status_code == 400, bad
        r = await hub.call("GET", "/v1/configurations/summary", params={"page": "zero", "limit": -3})
        assert r.status_code == 200 and r.json()["pagination"]["page"] == 1 and r.json()["pagination"]["limit"] == 10
        cid = r.json()["data"][0]["id"]
        await hub.call("PUT", f"/v1/configurations/{cid}", json={"status": "archived"})
        r = await hub.call("GET", "/v1/configurations", params={"status": "archived"})
        assert [c["id"] for c in r.json()["data"]] == [cid]
