"""Two hub nodes in this test process, each on its own NATS connection, sharing one database and a
real nats-server; a real agent linked to node A is reached through node B's REST API."""

from __future__ import annotations

import trio

from tests.hubtools import assert_error, open_hub, start_agent, start_hub


async def test_a_command_on_node_b_reaches_a_device_linked_to_node_a(nats_server, db_url, tmp_path):
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            # one data dir: the nodes share the key files (signing keys, the secret box), as docs/cluster.md says
            data = tmp_path / "hub"
            a = await start_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="a")
            b_services, b_url = await open_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="b")
            assert (a.services.node_id, b_services.node_id) == ("a", "b")
            assert a.services.bus is not b_services.bus and a.services.clustered

            device_id, token = await a.provision("edge-1")
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent")

            r = await a.client.post(f"{b_url}/v1/devices/{device_id}/ping", headers=a.headers)
            for _ in range(50):  # the link's subscription reaches the server a moment after the welcome
                if r.status_code != 503:
                    break
                await trio.sleep(0.05)
                r = await a.client.post(f"{b_url}/v1/devices/{device_id}/ping", headers=a.headers)
            assert r.status_code == 200, r.text
            assert r.json()["data"]["deviceId"] == device_id
            assert device_id not in {str(k) for k in b_services.links}  # B holds no link: it went over NATS

            # a device linked nowhere: 503 device_offline at once, not the command timeout
            other_id, _ = await a.provision("edge-2")
            started = trio.current_time()
            r = await a.client.post(f"{b_url}/v1/devices/{other_id}/ping", headers=a.headers)
            assert_error(r, 503, "device_offline")
            assert trio.current_time() - started < 2

            await agent.kill()
            nursery.cancel_scope.cancel()
