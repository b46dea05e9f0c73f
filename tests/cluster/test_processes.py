"""Hub nodes as separate ``fleethub serve`` processes on one database and a real nats-server."""

from __future__ import annotations

import httpx
import trio

from tests.cluster.clustertools import seed
from tests.hubtools import start_agent, wait_for


async def test_rest_on_one_process_reaches_a_device_linked_to_another(nats_server, db_url, tmp_path, nodes):
    with trio.fail_after(60):
        org_id, headers = await seed(db_url, tmp_path / "hub")
        a, b = nodes("a", db_url, nats_server.url), nodes("b", db_url, nats_server.url)
        async with httpx.AsyncClient(timeout=10) as client, trio.open_nursery() as nursery:
            await a.ready(client)
            await b.ready(client)
            r = await client.post(a.url + "/v1/devices", json={"name": "edge"}, headers=headers)
            assert r.status_code == 201, r.text
            device_id, token = r.json()["data"]["id"], r.json()["data"]["token"]
            agent = await start_agent(nursery, a.url, token, tmp_path / "agent")
            for _ in range(100):
                r = await client.post(f"{b.url}/v1/devices/{device_id}/ping", headers=headers)
                if r.status_code != 503:
                    break
                await trio.sleep(0.05)
            assert r.status_code == 200, r.text + b.proc.log_tail()
            await agent.kill()
            nursery.cancel_scope.cancel()


async def test_a_killed_node_restarted_under_its_id_marks_its_devices_offline(nats_server, db_url, tmp_path, nodes):
    import os
    import signal
    with trio.fail_after(60):
        org_id, headers = await seed(db_url, tmp_path / "hub")
        a, b = nodes("a", db_url, nats_server.url), nodes("b", db_url, nats_server.url)
        async with httpx.AsyncClient(timeout=10) as client, trio.open_nursery() as nursery:
            await a.ready(client)
            await b.ready(client)
            r = await client.post(a.url + "/v1/devices", json={"name": "edge"}, headers=headers)
            device_id, token = r.json()["data"]["id"], r.json()["data"]["token"]
            agent = await start_agent(nursery, a.url, token, tmp_path / "agent")

            async def online_on_b() -> bool:
                return (await client.get(f"{b.url}/v1/devices/{device_id}", headers=headers)).json()["data"]["online"]
            await wait_for(online_on_b, timeout=10)
            await agent.kill()  # the device goes away with its node: nobody writes its LinkDown
            os.kill(a.proc.pid, signal.SIGKILL)
            a.proc.popen.wait(10)
            assert await online_on_b()  # the row still says online: its node died holding it
            again = nodes("a", db_url, nats_server.url)  # the same node id, a new process
            again_ready = again.ready(client)  # it marks what node "a" held offline before it serves
            await again_ready

            async def offline_on_b() -> bool:  # B's row cache may hold the old row up to 2 s (storage/rowcache.py)
                return not await online_on_b()
            await wait_for(offline_on_b, timeout=5)
            nursery.cancel_scope.cancel()


async def test_a_killed_node_that_never_comes_back_has_its_devices_marked_offline(nats_server, db_url, tmp_path,
                                                                                   nodes):
    """Issue 17, presence: a node dies for good (any id); the survivors find its liveness row expired and
    mark offline the devices whose link it held, instead of leaving them online for ever."""
    import os
    import signal
    with trio.fail_after(60):
        org_id, headers = await seed(db_url, tmp_path / "hub")
        lease = {"FLEETHUB_NODE_LEASE_SECONDS": "1.5"}
        a, b = nodes("a", db_url, nats_server.url, **lease), nodes("b", db_url, nats_server.url, **lease)
        async with httpx.AsyncClient(timeout=10) as client, trio.open_nursery() as nursery:
            await a.ready(client)
            await b.ready(client)
            r = await client.post(a.url + "/v1/devices", json={"name": "edge"}, headers=headers)
            device_id, token = r.json()["data"]["id"], r.json()["data"]["token"]
            agent = await start_agent(nursery, a.url, token, tmp_path / "agent")

            async def online_on_b() -> bool:
                return (await client.get(f"{b.url}/v1/devices/{device_id}", headers=headers)).json()["data"]["online"]
            await wait_for(online_on_b, timeout=10)
            await agent.kill()  # the device goes away with its node: nobody writes its LinkDown
            os.kill(a.proc.pid, signal.SIGKILL)
            a.proc.popen.wait(10)

            async def offline_on_b() -> bool:  # a lease (1.5 s), a renewal round, B's 2 s row cache
                return not await online_on_b()
            await wait_for(offline_on_b, timeout=15)
            metrics = (await client.get(b.url + "/metrics")).text
            assert "fleethub_cluster_dead_nodes_total 1.0" in metrics, metrics
            nursery.cancel_scope.cancel()


async def test_an_agent_given_every_node_fails_over_when_its_node_is_killed(nats_server, db_url, tmp_path, nodes):
    """Issue 17, failures: SIGKILL of the node a device is linked to; the agent, given both nodes'
    URLs, moves on to the other and the device is online there; the survivor serves its commands."""
    import os
    import signal
    with trio.fail_after(90):
        org_id, headers = await seed(db_url, tmp_path / "hub")
        a, b = nodes("a", db_url, nats_server.url), nodes("b", db_url, nats_server.url)
        async with httpx.AsyncClient(timeout=10) as client, trio.open_nursery() as nursery:
            await a.ready(client)
            await b.ready(client)
            r = await client.post(a.url + "/v1/devices", json={"name": "edge"}, headers=headers)
            device_id, token = r.json()["data"]["id"], r.json()["data"]["token"]
            running = await start_agent(nursery, f"{a.url},{b.url}", token, tmp_path / "agent")
            assert running.agent.hub_url == a.url
            os.kill(a.proc.pid, signal.SIGKILL)
            a.proc.popen.wait(10)

            async def pinged_on_b() -> bool:
                r = await client.post(f"{b.url}/v1/devices/{device_id}/ping", headers=headers)
                return r.status_code == 200
            await wait_for(pinged_on_b, timeout=30, interval=0.2)
            assert running.agent.hub_url == b.url and running.agent.connected
            got = (await client.get(f"{b.url}/v1/devices/{device_id}", headers=headers)).json()["data"]
            assert got["online"] is True, got
            await running.kill()
            nursery.cancel_scope.cancel()
