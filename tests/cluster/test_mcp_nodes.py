"""/v1/mcp on every node of a cluster: a session on node B reaches a device linked to node A; a session
belongs to the node that opened it (docs/cluster.md: the balancer pins it by Mcp-Session-Id)."""

from __future__ import annotations

import httpx
import trio

from tests.cluster.test_two_nodes import two_nodes
from tests.hubtools import start_agent, wait_for
from tests.mcp.mcptools import call, http_session, pat_headers


async def test_mcp_on_node_b_pings_a_device_linked_to_node_a(nats_server, db_url, tmp_path):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a, b_services, b_url = await two_nodes(nursery, db_url, tmp_path / "hub", nats_server.url)
            device_id, token = await a.provision("edge-1")
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent")
            async with http_session(b_url, pat_headers(a.pat, a.org_id)) as mcp:
                answers: list = []

                async def pinged() -> bool:
                    err, answer = await call(mcp, "ping_device", device_id=device_id)
                    answers.append(answer)
                    return not err  # 503 for a moment, until the link's subscription reaches the server

                await wait_for(pinged, timeout=10, interval=0.1)
                assert answers[-1]["data"]["deviceId"] == device_id
                assert device_id not in {str(k) for k in b_services.links}

            headers = {**pat_headers(a.pat, a.org_id), "Accept": "application/json, text/event-stream"}
            init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
            async with httpx.AsyncClient(timeout=30) as client:
                r = await client.post(a.base_url + "/v1/mcp", json=init, headers=headers)
                assert r.status_code == 200
                pinned = {**headers, "Mcp-Session-Id": r.headers["mcp-session-id"],
                          "Mcp-Protocol-Version": "2025-11-25"}
                ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
                assert (await client.post(a.base_url + "/v1/mcp", json=ping, headers=pinned)).status_code == 200
                assert (await client.post(b_url + "/v1/mcp", json=ping, headers=pinned)).status_code == 404
            await agent.kill()
            nursery.cancel_scope.cancel()
