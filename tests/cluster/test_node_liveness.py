"""Issue 38 item 6: after a PostgreSQL outage no node declares live nodes dead. While the database was
frozen no node could renew its liveness row; the first node back used to find the others' rows stale
and mark their devices offline. A node now judges silence on the database's clock and only the silence
it was in contact to witness (hub/cluster/nodes.py ``Contact``); a node really killed is still found."""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
import uuid

import httpx
import trio

from hub.cluster.nodes import Contact
from storage.db import Database
from storage.embedded import EmbeddedPostgres
from tests.api.test_db_freeze import server_pids, signal_all
from tests.cluster.clustertools import seed
from tests.hubtools import metric_value, start_agent, wait_for
from tests.ports import free_port

T0 = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone.utc)
LEASE = 1.5  # the nodes' FLEETHUB_NODE_LEASE_SECONDS: a renewal every 0.5 s
FROZEN_FOR = 6.0  # longer than the lease and the storage call bound (4.5 s): every renewal fails meanwhile


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_contact_judges_nothing_before_a_whole_lease_in_contact():
    c = Contact(lease=3.0)
    assert [c.renewed(at(t)) for t in (0, 1, 2)] == [None, None, None]
    assert c.renewed(at(3)) == at(0)  # in contact for a lease: a row older than that is a dead node
    assert c.renewed(at(4.9)) == at(1.9)  # a slow round (1.9 s, under two rounds) is no outage


def test_contact_counts_silence_only_from_the_end_of_its_own_outage():
    c = Contact(lease=3.0)
    for t in (0, 1, 2, 3, 4):
        c.renewed(at(t))
    # 20 s without a renewal of our own: the others could not renew theirs either
    assert c.renewed(at(24)) is None
    assert c.renewed(at(25)) is None and c.renewed(at(26)) is None
    assert c.renewed(at(27)) == at(24)  # a lease since we were back: the others have had three rounds


async def _online(db: Database, device_ids: list[str]) -> dict[str, bool]:
    rows = await db.fetch("SELECT id, online FROM devices WHERE id = ANY($1::uuid[])",
                            [uuid.UUID(d) for d in device_ids])
    return {str(r["id"]): r["online"] for r in rows}


async def test_a_frozen_database_makes_no_node_dead_and_a_killed_node_is_still_found(nats_server, tmp_path, nodes):
    # A private server: the suite's shared one must not freeze under other tests.
    pg = EmbeddedPostgres(tmp_path / "pg", port=free_port())
    await trio.to_thread.run_sync(pg.start)
    frozen: list[int] = []
    try:
        with trio.fail_after(150):
            org_id, headers = await seed(pg.dsn, tmp_path / "hub")  # migrates before the nodes start
            env = {"FLEETHUB_NODE_LEASE_SECONDS": str(LEASE)}
            a, b = nodes("a", pg.dsn, nats_server.url, **env), nodes("b", pg.dsn, nats_server.url, **env)
            db = Database(pg.dsn, min_size=1, max_size=1)
            await db.open()
            async with httpx.AsyncClient(timeout=10) as client, trio.open_nursery() as nursery:
                await a.ready(client)
                await b.ready(client)
                devices, agents = [], []
                for node in (a, b):
                    r = await client.post(node.url + "/v1/devices", json={"name": f"on-{node.name}"},
                                          headers=headers)
                    assert r.status_code == 201, r.text
                    devices.append(r.json()["data"]["id"])
                    agents.append(await start_agent(nursery, node.url, r.json()["data"]["token"],
                                                    tmp_path / f"agent-{node.name}"))

                async def all_online() -> bool:
                    return all((await _online(db, devices)).values())
                await wait_for(all_online, timeout=20)
                await trio.sleep(2 * LEASE)  # both nodes in contact long enough to judge others

                await db.close()  # its connection would freeze with the rest
                frozen = server_pids(pg.data_dir)
                signal_all(frozen, signal.SIGSTOP)
                await trio.sleep(FROZEN_FOR)
                signal_all(frozen, signal.SIGCONT)
                frozen = []
                db = Database(pg.dsn, min_size=1, max_size=1)
                await db.open()

                # Every round of both nodes for three leases, plus a renewal that was cut by the call
                # bound just before the thaw: before the fix, the first node back marked the other's
                # device offline within a round.
                watch_until = time.monotonic() + 3 * LEASE + 5
                while time.monotonic() < watch_until:
                    online = await _online(db, devices)
                    assert all(online.values()), f"a live node's device was marked offline: {online}"
                    await trio.sleep(0.1)
                for node in (a, b):
                    text = (await client.get(node.url + "/metrics")).text
                    assert metric_value(text, "fleethub_cluster_dead_nodes_total") == 0, node.proc.log_tail()

                # A node really killed is still found: its device goes offline within the bound.
                await agents[1].kill()  # the device goes with its node: nobody writes its LinkDown
                os.kill(b.proc.pid, signal.SIGKILL)
                b.proc.popen.wait(10)
                killed = time.monotonic()

                async def b_device_offline() -> bool:
                    return not (await _online(db, devices))[devices[1]]
                await wait_for(b_device_offline, timeout=20, interval=0.05)
                took = time.monotonic() - killed
                print(f"killed node's device offline {took:.2f} s after SIGKILL (lease {LEASE} s)")
                assert (await _online(db, devices))[devices[0]], "the live node's device went offline"
                text = (await client.get(a.url + "/metrics")).text
                assert metric_value(text, "fleethub_cluster_dead_nodes_total") == 1
                await db.close()
                nursery.cancel_scope.cancel()
    finally:
        signal_all(frozen, signal.SIGCONT)
        await trio.to_thread.run_sync(pg.stop)
