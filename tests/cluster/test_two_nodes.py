"""Two hub nodes in this test process, each on its own NATS connection, sharing one database and a
real nats-server; a real agent linked to node A is reached through node B's REST API."""

from __future__ import annotations

import json
import uuid

import trio

from hub.cluster.topology import ClusterNode
from tests.hubtools import assert_error, open_hub, start_agent, start_hub, wait_for


async def two_nodes(nursery, db_url: str, data, nats_url: str, **settings):
    """Node "a" with its test client, and node "b" (services, base URL), on one database and one NATS."""
    a = await start_hub(nursery, db_url, data, nats_url=nats_url, node_id="a", **settings)
    b_services, b_url = await open_hub(nursery, db_url, data, nats_url=nats_url, node_id="b", **settings)
    return a, b_services, b_url


async def test_a_command_on_node_b_reaches_a_device_linked_to_node_a(nats_server, db_url, tmp_path):
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            # one data dir: the nodes share the key files (signing keys, the secret box), as docs/cluster.md says
            data = tmp_path / "hub"
            a, b_services, b_url = await two_nodes(nursery, db_url, data, nats_server.url)
            assert (a.services.node_id, b_services.node_id) == ("a", "b")
            assert a.services.bus is not b_services.bus and isinstance(a.services.topology, ClusterNode)

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


async def _row(s, device_id: str) -> dict:
    return dict(await s.db.fetchrow("SELECT online, state, link_epoch, link_node FROM devices WHERE id = $1",
                                    uuid.UUID(device_id)))


async def test_a_device_that_moves_to_node_b_is_let_go_by_node_a_and_stays_online(nats_server, db_url, tmp_path):
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            data = tmp_path / "hub"
            a, b_services, b_url = await two_nodes(nursery, db_url, data, nats_server.url)
            device_id, token = await a.provision("edge-1")
            dev = uuid.UUID(device_id)
            first = await start_agent(nursery, a.base_url, token, tmp_path / "agent-a")
            await wait_for(lambda: dev in a.services.links)
            await wait_for(lambda: _online_at(a.services, device_id, "a"), timeout=20)

            # the same device (its token) now reaches node B: A closes its socket within a second
            second = await start_agent(nursery, b_url, token, tmp_path / "agent-b")
            moved = trio.current_time()
            await wait_for(lambda: dev not in a.services.links, timeout=1)
            assert trio.current_time() - moved < 1
            assert a.services.metrics.cluster_takeovers == 1 and dev in b_services.links

            # A's actor saw its link go down and wrote "offline" behind, with the old epoch: no row
            # matches it. Wait past A's write-behind flushes, then the row is B's, online.
            await trio.sleep(1.5)
            row = await _row(a.services, device_id)
            assert (row["online"], row["link_node"], row["link_epoch"]) == (True, "b", 2), row
            # and node A's API answers from the row, not from its stale actor
            r = await a.call("GET", f"/v1/devices/{device_id}")
            assert r.json()["data"]["online"] is True, r.text

            await first.kill()
            await second.kill()
            nursery.cancel_scope.cancel()


async def _online_at(s, device_id: str, node: str) -> bool:
    row = await _row(s, device_id)
    return row["online"] and row["link_node"] == node


async def _next_events(lines, kinds: set[str], limit: int = 50) -> list[dict]:
    """Read SSE data lines until an event of each kind in ``kinds`` arrived."""
    seen: list[dict] = []
    async for line in lines:
        if line.startswith("data: "):
            event = json.loads(line[6:])
            seen.append(event)
            if kinds <= {e.get("kind") for e in seen} or len(seen) >= limit:
                return seen
    return seen


async def test_an_event_published_on_node_a_reaches_a_stream_on_node_b(nats_server, db_url, tmp_path):
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            data = tmp_path / "hub"
            a, b_services, b_url = await two_nodes(nursery, db_url, data, nats_server.url)
            device_id, token = await a.provision("edge-1")
            url = f"{b_url}/v1/devices/{device_id}/events"
            async with a.client.stream("GET", url, headers=a.headers) as r:
                assert r.status_code == 200
                lines = r.aiter_lines()
                assert (await _next_events(lines, {"device.snapshot"}))[0]["kind"] == "device.snapshot"
                await wait_for(lambda: ("device", uuid.UUID(device_id)) in b_services.events._remote, timeout=5)
                await trio.sleep(0.2)  # B's interest reaches the NATS server
                agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent")  # linked to A
                events = await _next_events(lines, {"device.state"})
                state = [e for e in events if e["kind"] == "device.state"]
                assert state and state[-1]["deviceId"] == device_id, events
                assert b_services.events.from_other_nodes >= 1 and uuid.UUID(device_id) not in b_services.links
            await agent.kill()
            nursery.cancel_scope.cancel()


async def test_removing_a_member_on_node_a_takes_effect_on_node_b_at_once(nats_server, db_url, tmp_path):
    """Access changes reach every node: PostgreSQL NOTIFY on the shared database (hub/services.py
    ``invalidate``), which is already cluster-wide; B's cached access is forgotten, not waited out."""
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            data = tmp_path / "hub"
            a, b_services, b_url = await two_nodes(nursery, db_url, data, nats_server.url)
            pat_id, secret = await a.new_user("member")
            theirs = {"X-API-Token-ID": pat_id, "X-API-Secret-Key": secret, "X-Organization-ID": a.org_id}
            assert (await a.client.get(f"{b_url}/v1/devices", headers=theirs)).status_code == 200  # B caches it
            user_id = await a.services.db.fetchval("SELECT user_id FROM pats WHERE id = $1", pat_id)
            r = await a.call("DELETE", f"/v1/members/{user_id}")
            assert r.status_code == 200, r.text
            await wait_for(lambda: _refused(a.client, f"{b_url}/v1/devices", theirs), timeout=2)
            nursery.cancel_scope.cancel()


async def _refused(client, url: str, headers: dict) -> bool:
    return (await client.get(url, headers=headers)).status_code == 403


async def test_a_rollout_run_by_node_a_updates_devices_linked_to_node_b(nats_server, db_url, tmp_path):
    from tests.api.test_rollouts import HEALTHY, config, rollout_state
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            data = tmp_path / "hub"
            a = await start_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="a", heartbeat_interval=0.5)
            b_services, b_url = await open_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="b",
                                               heartbeat_interval=0.5)
            fid = (await a.call("POST", "/v1/fleets", json={"name": "f"})).json()["data"]["id"]
            agents = []
            for i in range(2):
                dev, token = await a.provision(f"d{i}", fleet_id=fid)
                agents.append(await start_agent(nursery, b_url, token, tmp_path / f"d{i}"))
            cid, vid = await config(a, "app", HEALTHY)

            async def all_online():  # B's presence rows, written behind, are what A's eligibility reads
                rows = (await a.call("GET", "/v1/devices")).json()["data"]
                return all(d["online"] and d["architecture"] for d in rows)
            await wait_for(all_online, timeout=10, interval=0.1)
            r = await a.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1})
            rid = r.json()["data"]["id"]
            assert uuid.UUID(rid) in a.services.topology.fences  # A took the lease: A runs it

            async def done():
                return (await rollout_state(a, rid))["state"] == "completed"
            try:
                await wait_for(done, timeout=40, interval=0.2)
            except trio.TooSlowError:
                raise AssertionError(await rollout_state(a, rid)) from None
            assert [x.agent.configs.version_applied() for x in agents] == [vid, vid], (await rollout_state(a, rid))
            for x in agents:
                await x.kill()
            nursery.cancel_scope.cancel()


async def test_readyz_and_metrics_name_the_node_its_nats_state_devices_and_leases(nats_server, db_url, tmp_path):
    from tests.hubtools import metric_value, metrics
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a = await start_hub(nursery, db_url, tmp_path / "hub", nats_url=nats_server.url, node_id="a")
            device_id, token = await a.provision("edge-1")
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent")
            ready = (await a.client.get(a.base_url + "/readyz")).json()["data"]
            assert ready["cluster"] == {"node": "a", "nats": "connected", "devices": 1, "rollout_leases": 0}
            text = await metrics(a)
            assert metric_value(text, "fleethub_cluster_node", {"node": "a"}) == 1
            assert metric_value(text, "fleethub_cluster_nats_connected") == 1
            assert metric_value(text, "fleethub_cluster_rollout_leases") == 0
            assert metric_value(text, "fleethub_connected_devices") == 1
            await agent.kill()
            nursery.cancel_scope.cancel()


async def test_a_reboot_asked_of_node_b_is_done_by_node_a_holding_the_device(nats_server, db_url, tmp_path):
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            data = tmp_path / "hub"
            a, b_services, b_url = await two_nodes(nursery, db_url, data, nats_server.url)
            device_id, token = await a.provision("edge-1")
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent")
            await wait_for(lambda: _online_at(a.services, device_id, "a"), timeout=20)
            r = await a.client.post(f"{b_url}/v1/devices/{device_id}/reboot", headers=a.headers)
            assert r.status_code == 202, r.text
            actor = a.services.registry.lookup(("device", uuid.UUID(device_id)))
            assert actor.machine.state.value == "rebooting" or actor.machine.reboot_pending
            # a device linked nowhere: 503 at once, as on one node
            other_id, _ = await a.provision("edge-2")
            r = await a.client.post(f"{b_url}/v1/devices/{other_id}/reboot", headers=a.headers)
            assert_error(r, 503, "device_offline")
            await agent.kill()
            nursery.cancel_scope.cancel()


async def test_pause_and_resume_asked_of_node_b_reach_the_rollout_node_a_runs(nats_server, db_url, tmp_path):
    from tests.api.test_rollouts import HEALTHY, config, rollout_state
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            data = tmp_path / "hub"
            a = await start_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="a", heartbeat_interval=0.5)
            b_services, b_url = await open_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="b")
            fid = (await a.call("POST", "/v1/fleets", json={"name": "f"})).json()["data"]["id"]
            dev, token = await a.provision("d0", fleet_id=fid)
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "d0")
            await wait_for(lambda: _online_at(a.services, dev, "a"), timeout=20)
            # a long health-check grace: the device stays in flight, so the rollout is still running to pause
            slow = {**HEALTHY, "healthCheck": {"timeoutSeconds": 8, "graceSeconds": 4}}
            cid, _ = await config(a, "app", slow)
            r = await a.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1})
            rid = r.json()["data"]["id"]
            assert uuid.UUID(rid) in a.services.topology.fences
            r = await a.client.post(f"{b_url}/v1/rollouts/{rid}/pause", headers=a.headers)
            assert r.status_code == 200, r.text
            assert r.json()["data"]["state"] == "paused"
            assert a.services.registry.lookup(("rollout", uuid.UUID(rid))).machine.state.value == "paused"
            assert b_services.registry.lookup(("rollout", uuid.UUID(rid))) is None  # B never ran it
            r = await a.client.post(f"{b_url}/v1/rollouts/{rid}/cancel", headers=a.headers)
            assert r.status_code == 200 and r.json()["data"]["state"] == "cancelled", r.text
            assert (await rollout_state(a, rid))["state"] == "cancelled"
            await agent.kill()
            nursery.cancel_scope.cancel()


async def test_a_memory_test_started_read_and_cancelled_on_node_b_runs_on_the_device_node_a_holds(
        nats_server, db_url, tmp_path):
    """A balancer sends each request to any node: the memory-test machine of the node holding the
    link answers (hub/cluster/asks.py), so start, live status and cancel work from every node."""
    from device_client.memtest import MemtestConfig

    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            data = tmp_path / "hub"
            a, b_services, b_url = await two_nodes(nursery, db_url, data, nats_server.url)
            device_id, token = await a.provision("edge-mem")
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent",
                                      memtest=MemtestConfig(budget=4 << 20))
            await wait_for(lambda: _online_at(a.services, device_id, "a"), timeout=20)
            url = f"{b_url}/v1/devices/{device_id}/memory-test"
            r = await a.client.post(url, headers=a.headers, json={"quick": True})
            assert r.status_code == 202, r.text
            run_id = r.json()["data"]["runId"]
            r = await a.client.post(url, headers=a.headers, json={"quick": True})
            assert r.status_code == 409 and r.json()["error"] == "busy", r.text  # node A's machine said so

            async def done_live() -> bool:
                got = (await a.client.get(url, headers=a.headers)).json()["data"]
                return got["source"] == "live" and got["status"]["runId"] == run_id \
                    and got["status"]["phase"] == "done"
            await wait_for(done_live, timeout=60)

            # the device's own status says done as it sends its result event, which node A then stores:
            # the stored list follows the live read, it does not come with it
            async def stored() -> bool:
                results = (await a.client.get(f"{url}/results", headers=a.headers)).json()["data"]["results"]
                return [x["runId"] for x in results][:1] == [run_id]
            await wait_for(stored, timeout=10)
            r = await a.client.post(f"{url}/cancel", headers=a.headers, json={})
            assert r.status_code == 409, r.text  # nothing runs any more: node A's machine answers
            await agent.kill()
            nursery.cancel_scope.cancel()


async def test_a_key_rotation_reaches_every_node(nats_server, db_url, tmp_path, monkeypatch):
    """``fleethub admin rotate-signing-key`` on the shared key files: every node signs with the new key
    and accepts what any node signed, old key or new (NOTIFY on the shared database)."""
    import argparse

    from hub.admin import run_admin
    from tests.api.test_identity import make_service_account

    monkeypatch.delenv("FLEETHUB_JWT_KEY", raising=False)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a, b, b_url = await two_nodes(nursery, db_url, tmp_path / "hub", nats_server.url)
            sa = await make_service_account(a, [{"relation": "viewer"}])

            async def token_from(base: str) -> str:
                r = await a.client.post(base + "/v1/oauth/token", data={
                    "grant_type": "client_credentials", "client_id": sa["client_id"],
                    "client_secret": sa["client_secret"]})
                assert r.status_code == 200, r.text
                return r.json()["access_token"]

            async def accepted(base: str, token: str) -> bool:
                r = await a.client.get(base + "/v1/devices", headers={"X-Organization-ID": a.org_id,
                                                                      "Authorization": f"Bearer {token}"})
                assert r.status_code in (200, 401), r.text
                return r.status_code == 200

            old = await token_from(b_url)
            result = await run_admin(a.services.settings, argparse.Namespace(admin_command="rotate-signing-key"))
            new_kid = result["kids"][0]
            await wait_for(lambda: a.services.access.signing_keys.kid == new_kid == b.signing_keys.kid, timeout=5)
            new = await token_from(b_url)
            assert new != old
            for base in (a.base_url, b_url):
                assert await accepted(base, old) and await accepted(base, new)
            nursery.cancel_scope.cancel()
