"""Issue 38, a node cut off from PostgreSQL alone is not dead: its NATS link and its device links are
up, so its devices answer commands (they reach it over NATS), though it cannot renew its liveness row.
The other nodes used to reap it a lease later and mark every device it held offline. Every node now
says it is alive on the bus, and a reaper spares the nodes it heard there within the last lease
(hub/cluster/nodes.py ``Heard``); a node silent on both is still reaped (tests/cluster/test_node_liveness.py,
tests/cluster/test_processes.py: a killed node's devices go offline within a lease and a round)."""

from __future__ import annotations

import datetime as dt
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio

from hub.cluster.nodes import Heard
from storage.db import Database
from storage.nodes import ClusterNodes
from tests.cluster.natstools import CuttableLink
from tests.hubtools import open_hub, start_agent, start_hub, wait_for

LEASE = 1.5  # the nodes' node lease: a renewal, and a heartbeat on the bus, every 0.5 s
CUT_FOR = 3 * LEASE + 2  # before the fix, B reaped A one lease and a round (2 s) into the cut


def test_a_node_heard_within_the_lease_is_alive_and_one_heard_before_is_not():
    h = Heard("b", lease=3.0)
    h.heard("a", 10.0)
    h.heard("b", 10.5)  # our own heartbeat, echoed: no evidence of anyone
    assert h.alive(12.0) == {"a"}
    assert h.alive(13.0) == {"a"}  # a whole lease since: still alive (its row may be as old)
    assert h.alive(13.1) == frozenset()
    h.heard("a", 20.0)  # it speaks again: alive again
    assert h.alive(21.0) == {"a"}


def test_a_reaper_cut_off_from_the_bus_trusts_what_it_heard_for_a_lease_only():
    h = Heard("b", lease=3.0)
    for t in range(10, 21):  # a heartbeat a second from a and c, then b's own bus is cut: silence
        h.heard("a", float(t))
        h.heard("c", float(t))
    assert h.alive(22.0) == {"a", "c"}
    # b hears nothing more, whatever a and c do: after a lease, its stale view keeps no one alive, so a
    # node that died during b's cut-off is reaped on its row alone
    assert h.alive(23.5) == frozenset()
    assert h.last == {}  # and forgotten: ids generated at each start do not pile up


async def test_reap_spares_the_rows_of_the_nodes_heard_on_the_bus(db_url):
    db = Database(db_url)
    await db.open()
    try:
        nodes = ClusterNodes(db)
        a_seen = await nodes.renew("a")
        await nodes.renew("b")
        since = a_seen + dt.timedelta(microseconds=1)  # a's row is older: silent on the database
        assert await nodes.reap("b", since, {"a"}) == {}
        assert await db.fetchval("SELECT count(*) FROM cluster_nodes WHERE node = 'a'") == 1
        assert await nodes.reap("b", since, ()) == {"a": 0}
        assert await db.fetchval("SELECT count(*) FROM cluster_nodes WHERE node = 'a'") == 0
    finally:
        await db.close()


def _through(db_url: str, link: CuttableLink) -> str:
    parts = urlsplit(db_url)
    return urlunsplit(parts._replace(netloc=f"{parts.netloc.rsplit(':', 1)[0]}:{link.port}"))


async def _online(db: Database, device_ids: list[str]) -> dict[str, bool]:
    rows = await db.fetch("SELECT id, online FROM devices WHERE id = ANY($1::uuid[])",
                          [uuid.UUID(d) for d in device_ids])
    return {str(r["id"]): r["online"] for r in rows}


@pytest.mark.parametrize("fault", ["cut", "stall"])
async def test_a_node_cut_off_from_postgresql_alone_keeps_its_devices_online(fault, nats_server, db_url, tmp_path):
    """Node A reaches PostgreSQL through a TCP relay, B directly; both reach NATS. The relay is cut
    (connections closed, new ones refused) or stalled (open, passing nothing: every call of A's waits
    out the storage call bound, 4.5 s, three leases) for three leases and more: B must not reap A, and
    A's devices stay online. After it, A's row is renewed and what happened meanwhile (a device that
    left A during the cut) reaches the database from A's write-behind."""
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            link = await nursery.start(CuttableLink(urlsplit(db_url).port).run)
            lease = {"node_lease_seconds": LEASE}
            a = await start_hub(nursery, _through(db_url, link), tmp_path / "hub", nats_url=nats_server.url,
                                node_id="a", **lease)
            b, b_url = await open_hub(nursery, db_url, tmp_path / "hub", nats_url=nats_server.url, node_id="b",
                                      **lease)
            stays, stays_token = await a.provision("stays")
            leaves, leaves_token = await a.provision("leaves")
            await start_agent(nursery, a.base_url, stays_token, tmp_path / "stays")
            leaving = await start_agent(nursery, a.base_url, leaves_token, tmp_path / "leaves")

            async def both_online() -> bool:
                return all((await _online(b.db, [stays, leaves])).values())
            await wait_for(both_online, timeout=20)
            await trio.sleep(2 * LEASE)  # both nodes in contact for a lease: each judges the other's row

            link.cut() if fault == "cut" else link.stall()
            cut_at = trio.current_time()
            pinged = False
            while trio.current_time() - cut_at < CUT_FOR:
                online = await _online(b.db, [stays, leaves])
                assert online[stays], (f"a device linked to a live node was marked offline "
                                       f"{trio.current_time() - cut_at:.2f} s into the cut")
                if not pinged and trio.current_time() - cut_at > LEASE + 1:
                    # past the point where B reaped A before: the device is linked, and answers
                    r = await a.client.post(f"{b_url}/v1/devices/{stays}/ping", headers=a.headers)
                    assert r.status_code == 200, r.text
                    await leaving.kill()  # a device leaves A while A cannot write it down
                    pinged = True
                await trio.sleep(0.1)
            assert b.metrics.cluster_dead_nodes == 0
            assert await b.db.fetchval("SELECT count(*) FROM cluster_nodes WHERE node = 'a'") == 1
            assert (await _online(b.db, [leaves]))[leaves], "B cannot know yet: A has not written it"

            if fault == "cut":
                await link.restore()
            else:
                await link.heal()
            back_at = trio.current_time()

            async def renewed() -> bool:
                return bool(await b.db.fetchval(
                    "SELECT now() - seen_at < make_interval(secs => $1) FROM cluster_nodes WHERE node = 'a'",
                    LEASE))
            await wait_for(renewed, timeout=20, interval=0.1)
            renewed_after = trio.current_time() - back_at

            async def left() -> bool:
                return not (await _online(b.db, [leaves]))[leaves]
            await wait_for(left, timeout=20, interval=0.1)  # A's write-behind flushed it
            print(f"{fault} for {CUT_FOR:.1f} s (lease {LEASE} s): A's device online throughout; after the "
                  f"return, A's row renewed in {renewed_after:.2f} s, the device that left offline in "
                  f"{trio.current_time() - back_at:.2f} s")
            await trio.sleep(2 * LEASE)  # a few rounds of both nodes after the return: nothing reaped
            assert (await _online(b.db, [stays]))[stays]
            assert a.services.metrics.cluster_dead_nodes == 0 and b.metrics.cluster_dead_nodes == 0
            for base in (a.base_url, b_url):
                r = await a.client.post(f"{base}/v1/devices/{stays}/ping", headers=a.headers)
                assert r.status_code == 200, r.text
            nursery.cancel_scope.cancel()
