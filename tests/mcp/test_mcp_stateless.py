"""The stateless revision (2026-07-28), which the SDK's ``mcp.Client`` negotiates by default, against a real
hub and a real agent: the same tools, answers, limits and audit as a session of the handshake revisions.

Why: a tool's result handed to the SDK in wire form lacked the ``resultType`` this revision requires, and
every tool call of a default ``mcp.Client`` failed with "Handler returned an invalid result" while the
tests, all on the handshake revision, passed."""

from __future__ import annotations

import json
import uuid

import httpx
import mcp_types as types
import pytest
import trio
from mcp.shared.exceptions import MCPError

from hub.events import MAX_STREAMS_PER_OWNER
from hub.mcp.listen import MAX_URIS

from tests.hubtools import start_agent, start_hub, wait_for
from tests.mcp.mcptools import (call, endpoint_of, fleet_with_agent, followed_quick_test, operate, pat_headers,
                                stateless_client)

STATELESS = "2026-07-28"


async def test_the_sdks_default_client_operates_the_fleet(nursery, db_url, tmp_path):
    with trio.fail_after(150):
        hub, dev, fleet = await fleet_with_agent(nursery, db_url, tmp_path)
        async with stateless_client(hub.base_url, pat_headers(hub.pat, hub.org_id)) as mcp:
            assert mcp.session.protocol_version == STATELESS
            await operate(mcp, hub, dev, fleet)
            other, token2 = await hub.provision("pump-2")  # a memory test per device per 5 s
            await start_agent(nursery, hub.base_url, token2, tmp_path / "dev2")
            await followed_quick_test(mcp, other)  # progress notifications on the request's own answer
            err, missing = await call(mcp, "get_device", device_id="00000000-0000-4000-8000-000000000000")
            assert err and missing["status"] == 404 and missing["error"] == "not_found"
        endpoint = endpoint_of(hub)
        assert not endpoint._sessions and not endpoint._exchanges  # noqa: SLF001 — it opened no session

        await hub.services.audit_log.flush()
        r = await hub.call("GET", "/v1/audit-events", params={"pathPrefix": f"/v1/devices/{dev}/ping", "limit": 10})
        rows = r.json()["data"]
        assert rows and {(row["details"].get("channel"), row["details"].get("tool")) for row in rows} == {
            ("mcp", "ping_device")}


async def test_stateless_requests_in_flight_are_bounded_per_organisation(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        endpoint = endpoint_of(hub)
        endpoint.max_per_owner = 1
        head = {**pat_headers(hub.pat, hub.org_id), "Accept": "application/json, text/event-stream",
                "Mcp-Protocol-Version": STATELESS, "Mcp-Method": "tools/call", "Mcp-Name": "list_fleets"}
        meta = {"io.modelcontextprotocol/protocolVersion": STATELESS,
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "list_fleets", "arguments": {}, "_meta": meta}}
        async with httpx.AsyncClient(headers=head, timeout=30) as client:
            r = await client.post(hub.base_url + "/v1/mcp", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["result"]["resultType"] == "complete" and not r.json()["result"]["isError"]
            await wait_for(lambda: not endpoint._exchanges, timeout=5)  # noqa: SLF001 — the first has ended
            endpoint._exchanges[("org", uuid.UUID(hub.org_id))] = 1  # noqa: SLF001 — one held open
            r = await client.post(hub.base_url + "/v1/mcp", json=body)
            assert r.status_code == 429 and r.json()["error"] == "too_many_requests", r.text
            assert "in flight" in r.json()["message"]



async def test_hostile_stateless_bodies_get_errors_and_leave_the_hub_serving(nursery, db_url, tmp_path):
    """The JSON path reads the body itself (hub/mcp/endpoint.py ``_stateless``): its bounds must be the SDK's."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        head = {**pat_headers(hub.pat, hub.org_id), "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json", "Mcp-Protocol-Version": STATELESS,
                "Mcp-Method": "tools/call", "Mcp-Name": "get_device"}
        meta = {"io.modelcontextprotocol/protocolVersion": STATELESS,
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}}

        def body(arguments) -> dict:
            return {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                    "params": {"name": "get_device", "arguments": arguments, "_meta": meta}}
        url = hub.base_url + "/v1/mcp"
        async with httpx.AsyncClient(headers=head, timeout=30) as client:
            r = await client.post(url, content=json.dumps(body({"device_id": "x" * (300 * 1024)})))
            assert r.status_code == 413, r.text  # past the body bound, in one chunk or many
            assert r.headers["connection"] == "close"  # the rest of the body is still on the connection
            nested = "[" * 5000 + '"x"' + "]" * 5000  # past any parser's depth
            r = await client.post(url, content='{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": '
                                               '{"name": "get_device", "arguments": {"device_id": ' + nested + "}}}")
            assert r.status_code < 500, r.text
            r = await client.post(url, content=json.dumps(body({"device_id": "pump\u0000"})))
            assert r.status_code == 200 and r.json()["result"]["isError"], r.text
            assert r.json()["result"]["structuredContent"]["status"] == 400
            r = await client.post(url, content=b"{not json")
            assert r.status_code == 400 and r.json()["error"]["code"] == -32700, r.text
            r = await client.post(url, content=json.dumps(body({})))  # and the hub still answers
            assert r.status_code == 200 and r.json()["result"]["isError"], r.text


async def test_the_default_client_follows_a_devices_state_with_listen(nursery, db_url, tmp_path):
    """The 2026-07-28 revision has no resources/subscribe: ``Client.listen`` is how the SDK's default
    client follows a device. Its state is acknowledged only when the caller may view it (a device in
    another organisation is left out exactly like a missing one), an update arrives when the device's
    SSE stream has an event, and the stream holds slots of the organisation's event-stream cap only
    while it is open."""
    from mcp.shared.subscriptions import ResourceUpdated

    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        dev, token = await hub.provision("pump-1")
        agent = await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
        other_org = str((await hub.services.stores.orgs.create_org("Other", hub.services.clock.now()))["id"])
        theirs = await hub.new_user("admin", other_org)
        r = await hub.call("POST", "/v1/devices", json={"name": "theirs"}, headers=pat_headers(theirs, other_org))
        assert r.status_code == 201, r.text
        hidden = r.json()["data"]["id"]
        uri, hidden_uri = f"fleethub://devices/{dev}/state", f"fleethub://devices/{hidden}/state"
        missing_uri = "fleethub://devices/00000000-0000-4000-8000-000000000000/state"
        events = hub.services.events
        before = events.subscriber_count()
        async with stateless_client(hub.base_url, pat_headers(hub.pat, hub.org_id)) as mcp:
            assert mcp.session.protocol_version == STATELESS
            caps = mcp.session.server_capabilities
            assert caps is not None and caps.resources is not None and caps.resources.subscribe is True
            async with mcp.listen(resource_subscriptions=[uri, hidden_uri, missing_uri, "fleethub://openapi.json",
                                                          "https://elsewhere.example/x"]) as sub:
                assert sub.honored.resource_subscriptions == [uri, "fleethub://openapi.json"]
                assert events.subscriber_count() == before + 2  # the stream's slot and the device's feed
                await agent.kill()  # the device goes offline: an event on its stream
                with trio.fail_after(30):
                    event = await sub.__anext__()
                assert event == ResourceUpdated(uri=uri)
            # the client closed the stream: the hub let go of both slots
            await wait_for(lambda: events.subscriber_count() == before, timeout=10)
            state = await mcp.read_resource(uri)
            assert json.loads(state.contents[0].text)["data"]["online"] is False
            # bounded before the acknowledgement, and the hub holds nothing for a refused listen
            too_many = [f"fleethub://devices/{uuid.uuid4()}/state" for _ in range(MAX_URIS + 1)]
            with pytest.raises(MCPError) as refused:
                async with mcp.listen(resource_subscriptions=too_many):
                    pass
            assert refused.value.error.code == types.INVALID_PARAMS and str(MAX_URIS) in refused.value.error.message
            assert events.subscriber_count() == before
            # the organisation's stream cap: the stream's own slot fits, the device's feed does not
            events.max_per_owner = 1
            try:
                with pytest.raises(MCPError) as capped:
                    async with mcp.listen(resource_subscriptions=[uri]):
                        pass
            finally:
                events.max_per_owner = MAX_STREAMS_PER_OWNER
            assert capped.value.error.code == types.INVALID_REQUEST and "event streams" in capped.value.error.message
            assert events.subscriber_count() == before


async def test_hostile_listen_uris_are_left_out_and_hold_nothing(nursery, db_url, tmp_path):
    """A NUL byte, a 10,000-character URI, a device id that is no UUID and the same URI twice: none is
    acknowledged, none is an error of the hub, and the stream holds only its own slot while open."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        events = hub.services.events
        before = events.subscriber_count()
        hostile = ["fleethub://devices/\x00/state", "fleethub://devices/" + "x" * 10_000 + "/state",
                   "fleethub://devices/" + "9" * 100 + "/state", "fleethub://devices/\x00/state"]
        async with stateless_client(hub.base_url, pat_headers(hub.pat, hub.org_id)) as mcp:
            async with mcp.listen(resource_subscriptions=hostile) as sub:
                assert not sub.honored.resource_subscriptions
                assert events.subscriber_count() == before + 1
            await wait_for(lambda: events.subscriber_count() == before, timeout=10)
            err, page = await call(mcp, "list_devices")  # the hub serves on
            assert not err and page["data"] == []
