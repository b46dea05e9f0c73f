"""/v1/mcp over Streamable HTTP with the SDK's client, against a real hub and real device agents."""

from __future__ import annotations

import json

import httpx
import mcp_types as types
import pytest
import trio
from mcp.shared.exceptions import MCPError

from tests.hubtools import start_agent, start_hub, wait_for
from tests.mcp.mcptools import call, fleet_with_agent, http_session, operate, pat_headers

async def test_tools_over_streamable_http(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub, dev, fleet = await fleet_with_agent(nursery, db_url, tmp_path)
        async with http_session(hub.base_url, pat_headers(hub.pat, hub.org_id)) as mcp:
            await operate(mcp, hub, dev, fleet)

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


async def test_a_devices_state_is_a_resource_to_subscribe_to(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        dev, token = await hub.provision("pump-1")
        agent = await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
        updated: list[str] = []

        async def heard(message) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                updated.append(str(message.params.uri))

        uri = f"fleethub://devices/{dev}/state"
        async with http_session(hub.base_url, pat_headers(hub.pat, hub.org_id), message_handler=heard) as mcp:
            state = await mcp.read_resource(uri)
            assert json.loads(state.contents[0].text)["data"]["online"] is True
            await mcp.subscribe_resource(uri)
            await agent.kill()  # the device goes offline: an event on its stream
            await wait_for(lambda: uri in updated, timeout=30)
            await mcp.unsubscribe_resource(uri)
            with pytest.raises(MCPError):
                await mcp.subscribe_resource("fleethub://devices/00000000-0000-4000-8000-000000000000/state")
