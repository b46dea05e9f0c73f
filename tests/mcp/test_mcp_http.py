"""/v1/mcp over Streamable HTTP with the SDK's client, against a real hub and real device agents."""

from __future__ import annotations

import sys

import httpx
import trio

from tests.hubtools import start_agent, start_hub, wait_for
from tests.mcp.mcptools import call, http_session, pat_headers

HEALTHY = {"command": [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
           "healthCheck": {"timeoutSeconds": 2, "graceSeconds": 0.2}}
CLOSED = {"enabled": True, "timezone": "UTC", "start_time": "00:00", "end_time": "00:01", "days_of_week": ["Monday"]}


async def test_tools_over_streamable_http(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fleet = (await hub.call("POST", "/v1/fleets", json={"name": "edge"})).json()["data"]["id"]
        dev, token = await hub.provision("pump-1", fleet_id=fleet)
        await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
        async with http_session(hub.base_url, pat_headers(hub.pat, hub.org_id)) as mcp:
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert {"list_devices", "ping_device", "start_memory_test", "pause_rollout"} <= set(tools)
            assert tools["list_devices"].annotations.read_only_hint is True
            assert tools["reboot_device"].annotations.destructive_hint is True
            assert tools["list_devices"].output_schema["required"] == ["data"]

            err, page = await call(mcp, "list_devices")
            assert not err and [d["id"] for d in page["data"]] == [dev]
            assert page["pagination"]["limit"] == 20

            err, pong = await call(mcp, "ping_device", device_id=dev)
            assert not err and pong["data"]["deviceId"] == dev and pong["data"]["roundTripMs"] >= 0

            err, started = await call(mcp, "start_memory_test", device_id=dev, impact="running", quick=True,
                                      maxBytes=1 << 20)
            assert not err, started
            run_id = started["data"]["runId"]

            async def finished() -> bool:
                err, status = await call(mcp, "memory_test_status", device_id=dev)
                assert not err, status
                return any(r.get("runId") == run_id for r in status["data"]["history"])

            await wait_for(finished, timeout=60, interval=0.3)
            err, results = await call(mcp, "memory_test_results", device_id=dev)
            assert not err and results["data"]["results"][0]["runId"] == run_id

            # a test boot is refused as the spec says, as a tool error
            err, refused = await call(mcp, "start_memory_test", device_id=dev, impact="stopped", placement="offline")
            assert err and refused["status"] == 403 and refused["error"] == "operator_required"

            # a rollout held by a closed window, paused through MCP
            await hub.call("PUT", f"/v1/fleets/{fleet}/update-window", json=CLOSED)
            r = await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": {"workload": HEALTHY}})
            cid = r.json()["data"]["id"]
            r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fleet], "configuration_id": cid})
            assert r.status_code == 201, r.text
            rid = r.json()["data"]["id"]
            err, paused = await call(mcp, "pause_rollout", rollout_id=rid)
            assert not err and paused["data"]["state"] == "paused"

        # the REST path's audit, naming the MCP server and the tool
        await hub.services.audit_log.flush()
        r = await hub.call("GET", "/v1/audit-events", params={"pathPrefix": f"/v1/devices/{dev}/memory-test",
                                                              "method": "POST", "limit": 10})
        rows = r.json()["data"]
        assert {row["details"].get("channel") for row in rows} == {"mcp"}
        refused_row = [row for row in rows if row["status"] == 403]
        assert refused_row and refused_row[0]["details"]["tool"] == "start_memory_test"
        assert refused_row[0]["details"]["plan"]["mode"] == "test_boot"


async def test_a_member_who_sees_one_fleet_sees_nothing_of_the_other(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        fleets, devices = {}, {}
        for name in ("a", "b"):
            fleets[name] = (await hub.call("POST", "/v1/fleets", json={"name": name})).json()["data"]["id"]
            devices[name], _ = await hub.provision(f"dev-{name}", fleet_id=fleets[name])
        member = await hub.new_user("member")
        me_headers = {"X-API-Token-ID": member[0], "X-API-Secret-Key": member[1], "X-Organization-ID": hub.org_id}
        me = (await hub.call("GET", "/v1/me", headers=me_headers)).json()["data"]["userId"]
        r = await hub.call("POST", "/v1/relations", json={"object_type": "fleet", "object_id": fleets["a"],
                                                          "relation": "viewer", "subject_type": "user",
                                                          "subject_id": me})
        assert r.status_code == 201, r.text
        async with http_session(hub.base_url, pat_headers(member, hub.org_id)) as mcp:
            err, page = await call(mcp, "list_devices")
            assert not err and [d["id"] for d in page["data"]] == [devices["a"]]
            err, fl = await call(mcp, "list_fleets")
            assert not err and [f["id"] for f in fl["data"]] == [fleets["a"]]
            err, other = await call(mcp, "get_device", device_id=devices["b"])
            err2, missing = await call(mcp, "get_device", device_id="00000000-0000-4000-8000-000000000000")
            assert err and err2 and other == missing and other["status"] == 404
            err, pong = await call(mcp, "ping_device", device_id=devices["b"])
            assert err and pong == {**missing}
            # viewer on fleet a is not editor: an action there is refused
            err, refused = await call(mcp, "reboot_device", device_id=devices["a"])
            assert err and refused["status"] == 403


async def test_unauthenticated_gets_the_resource_metadata_hint(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        async with httpx.AsyncClient() as client:
            r = await client.post(hub.base_url + "/v1/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert r.status_code == 401
            hint = r.headers["www-authenticate"]
            assert hint.startswith("Bearer ") and "resource_metadata=" in hint
            url = hint.split('resource_metadata="')[1].split('"')[0]
            meta = (await client.get(url)).json()
            assert meta["resource"] == hub.base_url + "/v1/mcp"
            server = meta["authorization_servers"][0]
            asm = (await client.get(server + "/.well-known/oauth-authorization-server")).json()
            assert asm["token_endpoint"] == hub.base_url + "/v1/oauth/token"
            assert "client_credentials" in asm["grant_types_supported"]
            r = await client.post(hub.base_url + "/v1/mcp", headers={"Authorization": "Bearer nope"},
                                  json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert r.status_code == 401 and "resource_metadata=" in r.headers["www-authenticate"]
