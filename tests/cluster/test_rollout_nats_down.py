"""The rollout's owner is cut off from NATS mid-rollout (issue 38 item 1), on two in-process nodes
sharing one PostgreSQL and one nats-server, the devices linked to the other node: the cut-off owner
starts no batch whose tells it could not deliver, the node that takes the rollout over re-sends what
is stuck in ``updating``, and the rollout completes with no device failed."""

from __future__ import annotations

import os
import signal
import uuid

import trio

from tests.api.test_rollouts import HEALTHY, config
from tests.cluster.natstools import CuttableLink
from tests.hubtools import open_hub, start_agent, start_hub, wait_for
from tests.proctools import sigstop

DEVICES = 4
SETTINGS = dict(rollout_lease_seconds=1.5, heartbeat_interval=0.5, rollout_resend_after=2.0)


async def test_an_owner_cut_off_from_nats_fails_no_device_and_the_rollout_completes(
        nats_server, db_url, tmp_path):
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            link = await nursery.start(CuttableLink(int(nats_server.url.rsplit(":", 1)[1])).run)
            data = tmp_path / "hub"
            a = await start_hub(nursery, db_url, data, nats_url=link.url, node_id="a", **SETTINGS)
            _, b_url = await open_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="b", **SETTINGS)
            fid = (await a.call("POST", "/v1/fleets", json={"name": "f"})).json()["data"]["id"]
            for i in range(DEVICES):
                _, token = await a.provision(f"d{i}", fleet_id=fid)
                await start_agent(nursery, b_url, token, tmp_path / f"d{i}")  # linked to B; the rollout is A's

            async def all_online():
                rows = (await a.call("GET", "/v1/devices")).json()["data"]
                return len(rows) == DEVICES and all(d["online"] and d["architecture"] for d in rows)

            await wait_for(all_online, timeout=15, interval=0.1)
            cid, _ = await config(a, "app", HEALTHY)
            r = await a.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid,
                                                            "batch_size": 1})
            assert r.status_code == 201, r.text
            rid = r.json()["data"]["id"]
            assert uuid.UUID(rid) in a.services.topology.fences

            async def state() -> dict:
                return (await a.call("GET", f"/v1/rollouts/{rid}")).json()["data"]

            async def canary_done() -> bool:
                return (await state())["counts"]["succeeded"] >= 1

            await wait_for(canary_done, timeout=30, interval=0.05)
            link.cut()  # A, the owner, is cut off from NATS; PostgreSQL it still reaches
            cut_at = trio.current_time()

            async def completed() -> bool:
                return (await state())["state"] == "completed"

            await wait_for(completed, timeout=45, interval=0.2)
            took = trio.current_time() - cut_at
            final = await state()
            assert final["counts"]["succeeded"] == DEVICES and final["counts"]["failed"] == 0, final
            print(f"completed {took:.2f} s after the owner was cut off from NATS")
            nursery.cancel_scope.cancel()


async def test_nats_server_stopped_mid_rollout_fails_no_device_and_the_rollout_completes(
        nats_server, db_url, tmp_path):
    """The chaos run's reproduction: nats-server SIGSTOPped after the canary, for longer than the bus's
    probe takes to notice, with devices linked to both nodes (a command to a device on the asking node
    crosses NATS too). Applies in flight are dropped (pending, not failed), nothing starts while the
    bus is down, and the stuck steps are sent again once it is back."""
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            data = tmp_path / "hub"
            a = await start_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="a", **SETTINGS)
            _, b_url = await open_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="b", **SETTINGS)
            fid = (await a.call("POST", "/v1/fleets", json={"name": "f"})).json()["data"]["id"]
            for i in range(DEVICES):
                _, token = await a.provision(f"d{i}", fleet_id=fid)
                await start_agent(nursery, a.base_url if i % 2 else b_url, token, tmp_path / f"d{i}")

            async def all_online():
                rows = (await a.call("GET", "/v1/devices")).json()["data"]
                return len(rows) == DEVICES and all(d["online"] and d["architecture"] for d in rows)

            await wait_for(all_online, timeout=15, interval=0.1)
            cid, _ = await config(a, "app", HEALTHY)
            r = await a.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid,
                                                            "batch_size": 1})
            assert r.status_code == 201, r.text
            rid = r.json()["data"]["id"]

            async def state() -> dict:
                return (await a.call("GET", f"/v1/rollouts/{rid}")).json()["data"]

            async def canary_done() -> bool:
                return (await state())["counts"]["succeeded"] >= 1

            await wait_for(canary_done, timeout=30, interval=0.05)
            sigstop(nats_server.proc.pid)  # returns once it has stopped
            try:
                await trio.sleep(8)  # past the probe (2 s + 2 s) and several lease times
                during = await state()
            finally:
                os.kill(nats_server.proc.pid, signal.SIGCONT)
            resumed = trio.current_time()
            assert during["counts"]["failed"] == 0, during

            async def completed() -> bool:
                return (await state())["state"] == "completed"

            await wait_for(completed, timeout=60, interval=0.2)
            took = trio.current_time() - resumed
            final = await state()
            assert final["counts"]["succeeded"] == DEVICES and final["counts"]["failed"] == 0, final
            print(f"completed {took:.2f} s after nats-server was resumed (8 s stopped)")
            nursery.cancel_scope.cancel()
