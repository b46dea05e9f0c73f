"""A version a device rejected is not sent again, and the files of the version it rolled back to stay.
Real hub, PostgreSQL and agents; the agent is restarted on its own data directory as a reboot is.

Before the fix, each reconnect sent the rejected version again (the device restarted its workload into
the same failing health check and rolled back, at every link), a cancelled rollout left its devices
assigned the cancelled version, and the hello's file reconcile removed the secret file of the
configuration the device had rolled back to (its deliveries went with the new assignment)."""

from __future__ import annotations

import base64
import logging
import sys
import uuid

import trio

from tests.api.test_rollouts import FAILING, HEALTHY, config, fleet_with_agents, rollout_state
from tests.hubtools import device, start_agent, start_hub, wait_for

TOKEN_PATH = "/var/lib/fleethub/secrets/db-token"
SETTLE = 4.0  # seconds after a reconnect in which a re-sent version would have been applied (1.2 s check)


def applies_of(caplog, version_id: str) -> int:
    """config.apply commands of this version the agents carried out (configs.py logs each result)."""
    return sum(1 for r in caplog.records
               if r.name == "fleethub.agent.configs" and f"version {version_id}:" in r.getMessage())


async def with_token_file(hub, cid: str) -> None:
    r = await hub.call("POST", f"/v1/configurations/{cid}/secret-files",
                       json={"path": TOKEN_PATH, "content_base64": base64.b64encode(b"t0ken").decode()})
    assert r.status_code == 201, r.text


async def assign_and_wait(hub, agents, cid: str, vid: str) -> None:
    for dev in agents:
        r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid})
        assert r.status_code == 202, r.text

    async def applied():
        for dev, a in agents.items():
            if ((await device(hub, dev))["configuration"]["applied_version_id"] != vid
                    or not (a.agent.root / TOKEN_PATH.lstrip("/")).exists()):
                return False
        return True

    await wait_for(applied, timeout=30, interval=0.2)


async def reboot(nursery, hub, agents, dev, tmp_path, name):
    await agents[dev].kill()

    async def offline():
        return not (await device(hub, dev))["online"]

    await wait_for(offline, timeout=15, interval=0.2)
    agents[dev] = await start_agent(nursery, hub.base_url, agents[dev].agent.config.token, tmp_path / name)
    await trio.sleep(SETTLE)


async def test_cancel_after_a_failed_canary_leaves_the_device_on_what_it_runs(nursery, db_url, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 2)
        cid, v1 = await config(hub, "app", HEALTHY)
        await with_token_file(hub, cid)
        await assign_and_wait(hub, agents, cid, v1)
        r = await hub.call("POST", f"/v1/configurations/{cid}/versions", json={"spec": {"workload": FAILING}})
        assert r.status_code == 201, r.text
        v2 = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 5})
        rid = r.json()["data"]["id"]

        async def paused():
            return (await rollout_state(hub, rid))["state"] == "paused"

        await wait_for(paused, timeout=60, interval=0.2)
        canary = next(d["device_id"] for d in (await rollout_state(hub, rid))["devices"] if d["step"] == "failed")
        assert applies_of(caplog, v2) == 1
        r = await hub.call("POST", f"/v1/rollouts/{rid}/cancel")
        assert r.status_code == 200 and r.json()["data"]["state"] == "cancelled"
        await reboot(nursery, hub, agents, canary, tmp_path, agents[canary].agent.config.data_dir.name)
        assert applies_of(caplog, v2) == 1, "the rejected version was sent again after the reconnect"
        assert agents[canary].agent.configs.version_applied() == v1
        assert (agents[canary].agent.root / TOKEN_PATH.lstrip("/")).read_bytes() == b"t0ken"
        for dev in agents:  # the canary rolled back to v1, the other was never touched: both are on v1
            conf = (await device(hub, dev))["configuration"]
            assert (conf["version_id"], conf["applied_version_id"], conf["status"]) == (v1, v1, "applied"), conf


async def test_a_rejected_version_is_not_resent_and_the_running_configurations_file_stays(nursery, db_url, tmp_path,
                                                                                          caplog):
    caplog.set_level(logging.INFO)
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 1)
        (dev,) = agents
        cid, v1 = await config(hub, "app", HEALTHY)
        await with_token_file(hub, cid)
        await assign_and_wait(hub, agents, cid, v1)
        # another configuration, rolled out and rejected: the rollout stops
        cid2, v2 = await config(hub, "next", FAILING)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid2,
                                                         "batch_size": 5})
        assert r.status_code == 201, r.text
        rid = r.json()["data"]["id"]

        async def settled():  # paused by its failure threshold, or settled failed
            st = await rollout_state(hub, rid)
            return st["state"] in ("paused", "failed") and st["counts"]["failed"] == 1

        await wait_for(settled, timeout=60, interval=0.2)
        assert applies_of(caplog, v2) == 1
        conf = (await device(hub, dev))["configuration"]
        assert (conf["version_id"], conf["applied_version_id"], conf["status"]) == (v2, v1, "rejected"), conf

        await reboot(nursery, hub, agents, dev, tmp_path, agents[dev].agent.config.data_dir.name)
        assert applies_of(caplog, v2) == 1, "the rejected version was sent again after the reconnect"
        assert not any("removed" in r.getMessage() for r in caplog.records if r.name.startswith("fleethub.agent"))
        assert (agents[dev].agent.root / TOKEN_PATH.lstrip("/")).read_bytes() == b"t0ken"
        assert agents[dev].agent.configs.version_applied() == v1


async def test_a_directly_assigned_version_the_device_rejected_is_not_resent(nursery, db_url, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        _, agents = await fleet_with_agents(hub, nursery, tmp_path, 1)
        (dev,) = agents
        cid, v1 = await config(hub, "app", HEALTHY)
        await with_token_file(hub, cid)
        await assign_and_wait(hub, agents, cid, v1)
        r = await hub.call("POST", f"/v1/configurations/{cid}/versions", json={"spec": {"workload": FAILING}})
        v2 = r.json()["data"]["id"]
        r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid, "versionId": v2})
        assert r.status_code == 202, r.text

        async def rejected():
            return (await device(hub, dev))["configuration"]["status"] == "rejected"

        await wait_for(rejected, timeout=30, interval=0.2)
        await reboot(nursery, hub, agents, dev, tmp_path, agents[dev].agent.config.data_dir.name)
        assert applies_of(caplog, v2) == 1, "the rejected version was sent again after the reconnect"
        # the assignment stays, shown as rejected, until an operator assigns again
        conf = (await device(hub, dev))["configuration"]
        assert (conf["version_id"], conf["applied_version_id"], conf["status"]) == (v2, v1, "rejected"), conf
        r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid, "versionId": v2})
        assert r.status_code == 202, r.text

        async def tried_again():
            return applies_of(caplog, v2) == 2 and await rejected()

        await wait_for(tried_again, timeout=30, interval=0.2)


async def two_versions(nursery, db_url, tmp_path, fleet: str):
    """A hub, a fleet, and v1 of a healthy configuration beside v2 of a failing one (storage's tests
    below set each device's row by hand: no agents)."""
    hub = await start_hub(nursery, db_url, tmp_path / "hub")
    fid = (await hub.call("POST", "/v1/fleets", json={"name": fleet})).json()["data"]["id"]
    c1, v1 = (uuid.UUID(x) for x in await config(hub, "runs", HEALTHY))
    c2, v2 = (uuid.UUID(x) for x in await config(hub, "next", FAILING))
    return hub, uuid.UUID(hub.org_id), fid, c1, v1, c2, v2


async def cancelled_rollout(s, org, fid: str, c2, v2, steps: list, now) -> uuid.UUID:
    """A rollout of v2 stored as cancelled, with ``steps`` of (device, step), v2 assigned to each."""
    rid = uuid.uuid4()
    await s.stores.rollouts.create(
        {"id": rid, "org_id": org, "fleet_ids": [uuid.UUID(fid)], "config_id": c2, "version_id": v2,
         "force": True, "batch_size": None, "success_threshold": 0.9, "failure_threshold": 0.1,
         "state": "cancelled", "created_by": "test", "created_by_user": None, "created_at": now, "updated_at": now},
        [(device_id, uuid.UUID(fid), 0, step, None) for device_id, step in steps])
    await s.stores.rollouts.assign([device_id for device_id, _ in steps], c2, v2, now)
    return rid


async def test_release_gives_back_what_each_device_runs_and_nothing_else(nursery, db_url, tmp_path):
    """Storage's half of a cancel, device by device (no agents: the rows are set as each case leaves them)."""
    with trio.fail_after(60):
        hub, org, fid, c1, v1, c2, v2 = await two_versions(nursery, db_url, tmp_path, "rel")
        s = hub.services
        for cid, path in ((c1, "/etc/app/run-token"), (c2, "/etc/app/next-token")):
            r = await hub.call("POST", f"/v1/configurations/{cid}/secret-files",
                               json={"path": path, "content_base64": base64.b64encode(b"x").decode()})
            assert r.status_code == 201, r.text
        names = ["rejected", "never_sent", "applying", "reassigned", "ran_none", "applied_it"]
        dev = {n: uuid.UUID((await hub.provision(n, fleet_id=fid))[0]) for n in names}
        now = s.clock.now()
        for n in names[:-2] + ["applied_it"]:  # each ran v1 of c1
            await s.stores.secrets.assign_config(dev[n], c1, now)
            await s.stores.devices.assign_config(org, dev[n], c1, v1, now)
            await s.stores.devices.set_config_result(dev[n], "applied", None, v1, now, assigned=v1)
        rid = await cancelled_rollout(s, org, fid, c2, v2,
                                      [(dev[n], "failed" if n == "rejected" else "updating") for n in names], now)
        await s.stores.devices.set_config_result(dev["rejected"], "rejected", "health check failed", v1, now,
                                                assigned=v2)
        await s.stores.devices.set_config_result(dev["applying"], "applying", None, v1, now, assigned=v2)
        await s.stores.devices.assign_config(org, dev["reassigned"], c1, v1, now)  # an operator's assignment since
        await s.stores.devices.set_config_result(dev["applied_it"], "applied", None, v2, now, assigned=v2)

        released = await s.stores.rollouts.release(rid, v2, now)
        assert sorted(released) == sorted([dev["rejected"], dev["never_sent"], dev["ran_none"]])
        rows = {n: await s.stores.devices.get_any(dev[n]) for n in names}
        for n in ("rejected", "never_sent"):
            r = rows[n]
            assert (r["config_id"], r["config_version_id"], r["applied_version_id"], r["config_status"],
                    r["config_error"]) == (c1, v1, v1, "applied", None), n
            paths = {f["path"] for f in await s.stores.secrets.expected_on_device(dev[n])}
            assert paths == {"/etc/app/run-token"}, n  # the configuration it runs, not the cancelled one's
        assert (rows["ran_none"]["config_id"], rows["ran_none"]["config_version_id"],
                rows["ran_none"]["config_status"]) == (None, None, None)
        assert await s.stores.secrets.expected_on_device(dev["ran_none"]) == []
        assert (rows["applying"]["config_version_id"], rows["applying"]["config_status"]) == (v2, "applying")
        assert (rows["reassigned"]["config_version_id"], rows["reassigned"]["config_status"]) == (v1, "pending")
        assert (rows["applied_it"]["config_version_id"], rows["applied_it"]["config_status"]) == (v2, "applied")
        steps = {st["device_id"]: st["step"] for st in (await s.stores.rollouts.get_any(rid))[1]}
        assert {n: steps[dev[n]] for n in names} == {
            "rejected": "failed",  # its result stays the rollout's record
            "never_sent": "pending", "ran_none": "pending",  # never updated
            "applying": "updating", "reassigned": "updating", "applied_it": "updating"}  # not released
        assert await s.stores.rollouts.release(rid, v2, now) == []


SLOW_FAILING = {"command": HEALTHY["command"],
                "healthCheck": {"command": [sys.executable, "-c", "import sys; sys.exit(1)"],
                                "graceSeconds": 3, "timeoutSeconds": 2}}


async def test_a_device_applying_at_the_cancel_finishes_and_is_then_left_on_what_it_runs(nursery, db_url, tmp_path,
                                                                                        caplog):
    caplog.set_level(logging.INFO)
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 2)
        cid, v1 = await config(hub, "app", HEALTHY)
        await with_token_file(hub, cid)
        await assign_and_wait(hub, agents, cid, v1)
        r = await hub.call("POST", f"/v1/configurations/{cid}/versions", json={"spec": {"workload": SLOW_FAILING}})
        v2 = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 5})
        rid = r.json()["data"]["id"]

        async def verifying():
            return any(d["step"] == "verifying" for d in (await rollout_state(hub, rid))["devices"])

        await wait_for(verifying, timeout=30, interval=0.1)
        canary = next(d["device_id"] for d in (await rollout_state(hub, rid))["devices"] if d["step"] == "verifying")
        r = await hub.call("POST", f"/v1/rollouts/{rid}/cancel")
        assert r.status_code == 200 and r.json()["data"]["state"] == "cancelled"
        assert (await device(hub, canary))["configuration"]["version_id"] == v2  # still applying: it finishes

        async def given_back():
            conf = (await device(hub, canary))["configuration"]
            return (conf["version_id"], conf["status"]) == (v1, "applied")

        await wait_for(given_back, timeout=30, interval=0.2)
        assert (await rollout_state(hub, rid))["counts"]["failed"] == 1
        await reboot(nursery, hub, agents, canary, tmp_path, agents[canary].agent.config.data_dir.name)
        assert applies_of(caplog, v2) == 1, "the cancelled version was sent again after the reconnect"
        assert agents[canary].agent.configs.version_applied() == v1


async def test_a_result_that_raced_a_cancel_does_not_land_on_the_version_given_back(nursery, db_url, tmp_path, monkeypatch):
    """The device answers a config.apply twice, by the reply and by a config.result event, and the hub
    records the two in separate tasks. Seen in CI (2026-11-29): one recorded "rejected"; the cancelled
    rollout then gave the device back v1; the other, which had read the row before that, wrote
    "rejected" over v1's "applied", and the device showed a rejection of the version it runs. A result
    lands only while its version is still the one assigned (storage checks it in the same statement)."""
    with trio.fail_after(60):
        hub, org, fid, c1, v1, c2, v2 = await two_versions(nursery, db_url, tmp_path, "race")
        s = hub.services
        dev = uuid.UUID((await hub.provision("racer", fleet_id=fid))[0])
        now = s.clock.now()
        await s.stores.devices.assign_config(org, dev, c1, v1, now)
        await s.stores.devices.set_config_result(dev, "applied", None, v1, now, assigned=v1)
        rid = await cancelled_rollout(s, org, fid, c2, v2, [(dev, "updating")], now)
        await s.stores.devices.set_config_result(dev, "rejected", "health check failed", v1, now,
                                                assigned=v2)  # the first answer

        actor = await s.device_actor(dev)
        read_row, released = s.stores.devices.current, []

        async def read_then_released(device_id):  # the second answer's read, then the cancel's release
            row = await read_row(device_id)
            if not released:
                released.extend(await s.stores.rollouts.release(rid, v2, s.clock.now()))
            return row

        monkeypatch.setattr(s.stores.devices, "current", read_then_released)
        await actor.delivery.record_config_result({
            "status": "rejected", "configId": str(c2), "versionId": str(v2), "error": "health check failed",
            "rolledBackTo": str(v1), "files": []})
        assert released == [dev]
        row = await read_row(dev)
        assert (row["config_version_id"], row["applied_version_id"], row["config_status"], row["config_error"]) == (
            v1, v1, "applied", None), row
