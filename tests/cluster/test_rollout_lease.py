"""A rollout's owner node is SIGKILLed mid-rollout: another node takes its lease over when it expires
and finishes the rollout from where storage has it, every device updated (its workload started for
the version) exactly once. Real node processes, nats-server, PostgreSQL and agents."""

from __future__ import annotations

import os
import signal
import uuid

import httpx
import trio

from device_client.shared.paths import VOLUMES_DIR
from tests.cluster.clustertools import seed
from tests.e2e.killtools import COUNTING_WORKLOAD, workload_starts
from tests.hubtools import start_agent, wait_for

DEVICES = 4
LEASE = {"FLEETHUB_ROLLOUT_LEASE_SECONDS": "1.5", "FLEETHUB_HEARTBEAT_INTERVAL": "0.5"}


async def test_a_killed_owner_s_rollout_goes_on_at_another_node_once_per_device(
        nats_server, db_url, tmp_path, nodes):
    with trio.fail_after(120):
        org_id, headers = await seed(db_url, tmp_path / "hub")
        a = nodes("a", db_url, nats_server.url, **LEASE)
        b = nodes("b", db_url, nats_server.url, **LEASE)
        async with httpx.AsyncClient(timeout=10) as client, trio.open_nursery() as nursery:
            await a.ready(client)
            await b.ready(client)

            async def call(node, method, path, **kw):
                return await client.request(method, node.url + path, headers=headers, **kw)

            fleet = (await call(a, "POST", "/v1/fleets", json={"name": "f"})).json()["data"]["id"]
            agents, dirs = [], {}
            for i in range(DEVICES):
                r = await call(a, "POST", "/v1/devices", json={"name": f"d{i}", "fleet_id": fleet})
                dev, token = r.json()["data"]["id"], r.json()["data"]["token"]
                dirs[dev] = tmp_path / f"dev{i}"
                # where COUNTING_WORKLOAD logs its starts (fleethub sim makes it; an in-process agent does not)
                (dirs[dev] / "root" / VOLUMES_DIR.lstrip("/")).mkdir(parents=True)
                # the devices are linked to B, which survives; the rollout is A's
                agents.append(await start_agent(nursery, b.url, token, dirs[dev]))
            async def all_online():  # B's presence rows, written behind, are what A's eligibility reads
                rows = (await call(a, "GET", "/v1/devices")).json()["data"]
                return len(rows) == DEVICES and all(d["online"] and d["architecture"] for d in rows)
            await wait_for(all_online, timeout=10, interval=0.1)
            r = await call(a, "POST", "/v1/configurations", json={"name": "app", "spec": {"workload": COUNTING_WORKLOAD}})
            cid, vid = r.json()["data"]["id"], r.json()["data"]["version"]["id"]
            r = await call(a, "POST", "/v1/rollouts", json={"fleet_ids": [fleet], "configuration_id": cid, "batch_size": 1})
            assert r.status_code == 201, r.text
            rid = r.json()["data"]["id"]
            owner = await _owner(db_url, rid)
            # A's: a rollout is born with its creator's lease, in the transaction that stores it (epoch 1,
            # or later if a stall let the 1.5 s lease lapse and A took it again); B's must come after it.
            assert owner is not None and owner[0] == "a", owner

            async def state(node) -> dict:
                return (await call(node, "GET", f"/v1/rollouts/{rid}")).json()["data"]

            async def canary_done() -> bool:
                return (await state(b))["counts"]["succeeded"] >= 1
            await wait_for(canary_done, timeout=60, interval=0.1)
            os.kill(a.proc.pid, signal.SIGKILL)  # mid-rollout: the canary settled, the rest not yet
            a.proc.popen.wait(10)
            assert (await state(b))["state"] == "running"
            killed = trio.current_time()

            async def b_holds() -> bool:
                now = await _owner(db_url, rid)
                return now is not None and now[0] == "b" and now[1] > owner[1]
            await wait_for(b_holds, timeout=10, interval=0.1)  # one lease time plus a renewal round
            # one lease time (1.5 s) plus a renewal round (0.5 s), with room for a loaded 2-core machine
            assert trio.current_time() - killed < 8

            async def completed() -> bool:
                return (await state(b))["state"] == "completed"
            await wait_for(completed, timeout=60, interval=0.2)
            await wait_for(lambda: _owner_is_none(db_url, rid), timeout=5)  # settled: B let its lease go
            final = await state(b)
            assert final["counts"]["succeeded"] == DEVICES
            for dev, d in dirs.items():
                assert workload_starts(d) == [vid], (dev, workload_starts(d))
            for agent in agents:
                await agent.kill()


async def _owner(db_url: str, rollout_id: str):
    import asyncpg

    def read():
        import asyncio

        async def q():
            conn = await asyncpg.connect(db_url)
            try:
                row = await conn.fetchrow("SELECT owner, epoch FROM rollout_leases WHERE rollout_id = $1",
                                          uuid.UUID(rollout_id))
                return (row["owner"], row["epoch"]) if row else None
            finally:
                await conn.close()
        return asyncio.run(q())
    return await trio.to_thread.run_sync(read)


async def _owner_is_none(db_url: str, rollout_id: str) -> bool:
    return await _owner(db_url, rollout_id) is None
