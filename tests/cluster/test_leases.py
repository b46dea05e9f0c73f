"""storage/leases.py on a real PostgreSQL: a lease moves only once expired, and a write fenced by a
lost epoch is refused whole (LeaseLost) while the new holder's goes through."""

from __future__ import annotations

import datetime as dt
import uuid

from types import SimpleNamespace

import pytest
import trio

from hub.cluster import leases
from storage.leases import LeaseLost
from tests.api.test_rollouts import HEALTHY, config
from tests.hubtools import start_agent, start_hub, wait_for


async def test_an_expired_lease_moves_and_the_old_epoch_writes_nothing(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        s = hub.services
        fid = (await hub.call("POST", "/v1/fleets", json={"name": "f"})).json()["data"]["id"]
        dev, token = await hub.provision("d", fleet_id=fid)
        await start_agent(nursery, hub.base_url, token, tmp_path / "d")  # an online device: the rollout has one
        cid, _ = await config(hub, "app", HEALTHY)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1})
        assert r.status_code == 201, r.text
        rid = uuid.UUID(r.json()["data"]["id"])
        # settled first: its own (single-process, unfenced) actor writes nothing more while we test
        await wait_for(lambda: _completed(hub, rid), timeout=20, interval=0.1)
        await wait_for(lambda: s.registry.lookup(("rollout", rid)) is None, timeout=10)
        await _two_holds_at_once_take_one_epoch(s, rid)
        await _a_lease_whose_actor_is_starting_is_kept(s, rid)
        await _a_new_rollout_is_born_with_its_creators_lease(s, rid)
        now = s.clock.now()

        # leases are timed on PostgreSQL's clock: a short one, then real time passes
        old = await s.stores.rollout_leases.acquire(rid, "a", 0.5)
        assert old is not None and old.epoch == 1
        assert await s.stores.rollout_leases.acquire(rid, "b", 10) is None  # still A's
        assert await s.stores.rollout_leases.renew(old, 0.5)
        assert await s.stores.rollout_leases.owner(rid) == "a"
        await trio.sleep(0.7)  # lapsed
        assert await s.stores.rollout_leases.owner(rid) is None
        new = await s.stores.rollout_leases.acquire(rid, "b", 10)  # expired: B's
        assert new is not None and (new.owner, new.epoch) == ("b", 2)
        assert not await s.stores.rollout_leases.renew(old, 10)

        step = [(uuid.UUID(dev), "failed", "written by a node that lost its lease", now)]
        with pytest.raises(LeaseLost):
            await s.stores.rollouts.save(rid, now, state="paused", current_batch=0, reason="stale", accepted_failures=0,
                                  accepted_batch=0, steps=step, fence=old)
        with pytest.raises(LeaseLost):
            await s.stores.rollouts.assign([uuid.UUID(dev)], uuid.UUID(cid), uuid.uuid4(), now, fence=old)
        row = await s.db.fetchrow("SELECT state, reason FROM rollouts WHERE id = $1", rid)
        assert row["reason"] != "stale"
        assert await s.db.fetchval("SELECT step FROM rollout_devices WHERE rollout_id = $1", rid) == "succeeded"
        await s.stores.rollouts.save(rid, now, state="paused", current_batch=0, reason="by b", accepted_failures=0,
                              accepted_batch=0, steps=[], fence=new)
        assert await s.db.fetchval("SELECT reason FROM rollouts WHERE id = $1", rid) == "by b"


def _node_view(s, **over) -> SimpleNamespace:
    """What hub/cluster/leases.py reads of a ClusterNode (hub/cluster/topology.py), as node "a"."""
    return SimpleNamespace(**{"registry": s.registry, "fences": {}, "lease_expiries": {}, "lease_lock": trio.Lock(),
                              "bus": SimpleNamespace(connected=True), "lease_seconds": 10.0,
                              "rollout_leases": s.stores.rollout_leases, "rollouts": s.stores.rollouts, "node_id": "a", **over})


async def _two_holds_at_once_take_one_epoch(s, rid: uuid.UUID) -> None:
    """hub/cluster/leases.py ``hold``, asked twice at once on one node (a rollout's POST and keep()'s
    round finding it): one take, epoch 1, and the fence kept is the lease's. Both took it before, the
    second at epoch 2 over the first. A node's view of the hub: only what hold reads."""
    node = _node_view(s)
    async with trio.open_nursery() as both:
        both.start_soon(leases.hold, node, rid)
        both.start_soon(leases.hold, node, rid)
    row = await s.db.fetchrow("SELECT owner, epoch FROM rollout_leases WHERE rollout_id = $1", rid)
    assert (row["owner"], row["epoch"]) == ("a", 1)
    assert node.fences[rid].epoch == 1
    await s.db.execute("DELETE FROM rollout_leases WHERE rollout_id = $1", rid)  # the test below starts clean


async def _a_lease_whose_actor_is_starting_is_kept(s, rid: uuid.UUID) -> None:
    """keep()'s round while the rollout's actor is still in its on_start (not in the registry yet):
    the lease is renewed, not released as a settled rollout's; once no actor runs or starts, it goes."""
    starting = [True]
    node = _node_view(s, registry=SimpleNamespace(lookup=lambda key: None, starting=lambda key: starting[0]))
    await leases.hold(node, rid)
    await leases._round(node)
    row = await s.db.fetchrow("SELECT owner, epoch FROM rollout_leases WHERE rollout_id = $1", rid)
    assert row is not None and (row["owner"], row["epoch"]) == ("a", 1) and rid in node.fences
    starting[0] = False  # it settled: nothing runs it
    await leases._round(node)
    assert await s.db.fetchrow("SELECT 1 FROM rollout_leases WHERE rollout_id = $1", rid) is None
    assert rid not in node.fences


async def _a_new_rollout_is_born_with_its_creators_lease(s, settled: uuid.UUID) -> None:
    """A rollout created on node A holds A's lease from the transaction that stored it: there is no
    moment when another node's round finds it active and unowned (CI once saw B take a rollout that A's
    POST had just created, between its commit and A's first take)."""
    node = _node_view(s)
    old = dict(await s.db.fetchrow("SELECT * FROM rollouts WHERE id = $1", settled))
    row = {**old, "id": uuid.uuid4(), "state": "pending", "created_at": s.clock.now(), "updated_at": s.clock.now()}
    row = {k: v for k, v in row.items() if k in ("id", "org_id", "fleet_ids", "config_id", "version_id", "force",
                                                  "batch_size", "success_threshold", "failure_threshold", "state", "created_at",
                                                  "updated_at")}
    created = await leases.create_held(node, row, [])
    assert "fence" not in created and node.fences[row["id"]].epoch == 1
    # one transaction wrote both rows: the same xmin
    made = await s.db.fetchval("SELECT xmin::text FROM rollouts WHERE id = $1", row["id"])
    leased = await s.db.fetchrow("SELECT owner, epoch, xmin::text AS xmin FROM rollout_leases WHERE rollout_id = $1",
                                 row["id"])
    assert (leased["owner"], leased["epoch"], leased["xmin"]) == ("a", 1, made)
    assert await s.stores.rollout_leases.acquire(row["id"], "b", 10) is None  # B's round cannot take it
    await leases.hold(node, row["id"])  # A's own round: already held, no second take
    assert await s.db.fetchval("SELECT epoch FROM rollout_leases WHERE rollout_id = $1", row["id"]) == 1
    await s.db.execute("DELETE FROM rollout_leases WHERE rollout_id = $1", row["id"])
    await s.db.execute("UPDATE rollouts SET state = 'cancelled' WHERE id = $1", row["id"])


async def _completed(hub, rid) -> bool:
    return (await hub.call("GET", f"/v1/rollouts/{rid}")).json()["data"]["state"] == "completed"


async def test_a_node_cut_off_from_nats_stops_owning_its_rollout_and_another_takes_it(nats_server, db_url, tmp_path):
    """Node A reaches PostgreSQL but not NATS (its link to the nats-server is cut): it renews nothing,
    its actor stops once its lease lapsed, and node B takes the rollout over with a new epoch. B's clock
    is a minute ahead of A's throughout, which moves no lease."""
    from tests.cluster.natstools import CuttableLink
    from tests.hubtools import open_hub

    lease = dict(rollout_lease_seconds=1.5)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            link = await nursery.start(CuttableLink(int(nats_server.url.rsplit(":", 1)[1])).run)
            data = tmp_path / "hub"
            a = await start_hub(nursery, db_url, data, nats_url=link.url, node_id="a", **lease)
            # B's clock runs a minute ahead, forty lease times: leases are timed on PostgreSQL's clock,
            # so B still sees A's lease as A renews it (on B's own clock it would have lapsed long ago)
            b, _ = await open_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="b",
                                  test_clock_offset=60.0, **lease)
            fid = (await a.call("POST", "/v1/fleets", json={"name": "f"})).json()["data"]["id"]
            _, token = await a.provision("d", fleet_id=fid)
            await start_agent(nursery, a.base_url, token, tmp_path / "d")
            # a window that is closed now: the rollout stays running, its device queued for the window
            opens = (a.services.clock.now() + dt.timedelta(hours=6)).replace(second=0, microsecond=0)
            window = {"enabled": True, "timezone": "UTC", "start_time": opens.strftime("%H:%M"),
                      "end_time": (opens + dt.timedelta(hours=1)).strftime("%H:%M"),
                      "days_of_week": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
                                       "Sunday"]}
            assert (await a.call("PUT", f"/v1/fleets/{fid}/update-window", json=window)).status_code == 200
            cid, _ = await config(a, "app", HEALTHY)
            r = await a.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid,
                                                            "batch_size": 1})
            assert r.status_code == 201, r.text
            rid = uuid.UUID(r.json()["data"]["id"])
            assert rid in a.services.topology.fences
            owner = "SELECT owner, epoch FROM rollout_leases WHERE rollout_id = $1"
            assert tuple(await a.services.db.fetchrow(owner, rid)) == ("a", 1)
            await trio.sleep(2)  # A renews it while connected: B (its clock a minute ahead) does not take it
            assert tuple(await a.services.db.fetchrow(owner, rid)) == ("a", 1)

            link.cut()
            await wait_for(lambda: not a.services.bus.connected, timeout=10)
            cut_at = trio.current_time()
            await wait_for(lambda: rid not in a.services.topology.fences, timeout=10)
            actor = a.services.registry.lookup(("rollout", rid))
            assert actor is None or actor.lost  # A no longer acts as owner
            await wait_for(lambda: _owned_by(b, rid, "b"), timeout=10)
            assert trio.current_time() - cut_at < 6  # one lease time plus a renewal round, with room
            assert (await a.services.db.fetchrow(owner, rid))["epoch"] == 2  # A's epoch is fenced off

            await link.restore()  # back on NATS: A does not take it back while B renews it
            await wait_for(lambda: a.services.bus.connected, timeout=10)
            await trio.sleep(2)
            assert tuple(await a.services.db.fetchrow(owner, rid)) == ("b", 2)
            assert rid not in a.services.topology.fences and rid in b.topology.fences
            nursery.cancel_scope.cancel()


async def _owned_by(s, rid, node: str) -> bool:
    row = await s.db.fetchrow("SELECT owner FROM rollout_leases WHERE rollout_id = $1", rid)
    return row is not None and row["owner"] == node
