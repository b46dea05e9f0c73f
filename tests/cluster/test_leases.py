"""storage/leases.py on a real PostgreSQL: a lease moves only once expired, and a write fenced by a
lost epoch is refused whole (LeaseLost) while the new holder's goes through."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import trio

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
        now = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)

        old = await s.rollout_leases.acquire(rid, "a", now, 10)
        assert old is not None and old.epoch == 1
        assert await s.rollout_leases.acquire(rid, "b", now + dt.timedelta(seconds=5), 10) is None  # still A's
        assert await s.rollout_leases.renew(old, now + dt.timedelta(seconds=5), 10)
        new = await s.rollout_leases.acquire(rid, "b", now + dt.timedelta(seconds=16), 10)  # expired: B's
        assert new is not None and (new.owner, new.epoch) == ("b", 2)
        assert not await s.rollout_leases.renew(old, now + dt.timedelta(seconds=16), 10)

        step = [(uuid.UUID(dev), "failed", "written by a node that lost its lease", now)]
        with pytest.raises(LeaseLost):
            await s.rollouts.save(rid, now, state="paused", current_batch=0, reason="stale", accepted_failures=0,
                                  accepted_batch=0, steps=step, fence=old)
        with pytest.raises(LeaseLost):
            await s.rollouts.assign([uuid.UUID(dev)], uuid.UUID(cid), uuid.uuid4(), now, fence=old)
        row = await s.db.fetchrow("SELECT state, reason FROM rollouts WHERE id = $1", rid)
        assert row["reason"] != "stale"
        assert await s.db.fetchval("SELECT step FROM rollout_devices WHERE rollout_id = $1", rid) == "succeeded"
        await s.rollouts.save(rid, now, state="paused", current_batch=0, reason="by b", accepted_failures=0,
                              accepted_batch=0, steps=[], fence=new)
        assert await s.db.fetchval("SELECT reason FROM rollouts WHERE id = $1", rid) == "by b"


async def _completed(hub, rid) -> bool:
    return (await hub.call("GET", f"/v1/rollouts/{rid}")).json()["data"]["state"] == "completed"
