"""A configuration version assigned on node B reaches a device that links to node A, whatever A's read
cache still holds of the device's row: what a device is sent, and whether its result counts, are
decided on the row as PostgreSQL holds it (storage/devices.py ``current``), not on a cached copy that
another node's write does not reach until it expires. The fault suite found it: a node killed
mid-rollout, its device linked anew elsewhere, and the rollout waited for good on a result dropped
against a stale row."""

from __future__ import annotations

import sys
import uuid

import trio

from tests.cluster.test_two_nodes import _online_at, two_nodes
from tests.hubtools import start_agent, wait_for

HEALTHY = {"command": [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
           "healthCheck": {"timeoutSeconds": 2, "graceSeconds": 0.2}}


async def _config_row(a, device_id: str) -> dict:
    return dict(await a.services.db.fetchrow(
        "SELECT config_version_id, config_status, applied_version_id FROM devices WHERE id = $1",
        uuid.UUID(device_id)))


async def test_a_version_assigned_on_node_b_is_sent_at_the_devices_next_link_to_node_a(nats_server, db_url, tmp_path):
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            a, b_services, _ = await two_nodes(nursery, db_url, tmp_path / "hub", nats_server.url)
            device_id, token = await a.provision("edge-1")
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent")
            await wait_for(lambda: _online_at(a.services, device_id, "a"), timeout=20)

            versions = []
            for name in ("first", "second"):
                r = await a.call("POST", "/v1/configurations", json={"name": name, "spec": {"workload": HEALTHY}})
                assert r.status_code == 201, r.text
                cid = r.json()["data"]["id"]
                vid = await a.services.db.fetchval("SELECT id FROM configuration_versions WHERE config_id = $1",
                                                   uuid.UUID(cid))
                versions.append((cid, str(vid)))
            r = await a.call("PUT", f"/v1/devices/{device_id}/configuration", json={"configId": versions[0][0]})
            assert r.status_code == 202, r.text

            async def runs(version_id: str) -> bool:
                row = await _config_row(a, device_id)
                return row["config_status"] == "applied" and str(row["applied_version_id"]) == version_id

            await wait_for(lambda: runs(versions[0][1]), timeout=20)

            # Node A has the row cached (a read through its API), for longer than any test step takes:
            # what matters is that a decision never goes by it, not how soon it expires.
            a.services.stores.devices.cache.ttl = 600.0
            assert (await a.call("GET", f"/v1/devices/{device_id}")).status_code == 200
            # Node B assigns the second version in storage only, as a node does whose tell to the
            # device was lost (killed right after its write): the device's next hello must send it.
            await b_services.stores.devices.assign_config(
                uuid.UUID(a.org_id), uuid.UUID(device_id), uuid.UUID(versions[1][0]), uuid.UUID(versions[1][1]),
                b_services.clock.now())
            await agent.kill()
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent")
            await wait_for(lambda: runs(versions[1][1]), timeout=20)
            assert agent.agent.configs.version_applied() == versions[1][1]
            await agent.kill()
            nursery.cancel_scope.cancel()
