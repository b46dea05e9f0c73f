"""A configuration's secret files changed while devices already run the configuration: added, replaced
and deleted files reach those devices (a config.apply of the version they run, which restarts nothing
and writes only the files), through an upload, a reconnect and a new rollout. Real hub, PostgreSQL and
device agents."""

from __future__ import annotations

import base64
import sys

import trio

from tests.hubtools import start_agent, start_hub, wait_for

HEALTHY = {"command": [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
           "healthCheck": {"timeoutSeconds": 2, "graceSeconds": 0.2}}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def device_status(hub, curl: str, path: str, dev: str) -> str | None:
    r = await hub.call("GET", curl)
    f = next((f for f in r.json()["data"] if f["path"] == path), None)
    if f is None:
        return None
    return next((d["status"] for d in f["devices"] if d["deviceId"] == dev), None)


async def status_is(hub, curl: str, path: str, dev: str, status: str) -> bool:
    return await device_status(hub, curl, path, dev) == status


async def rollout(hub, fid: str, cid: str) -> None:
    r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1, "force": True})
    assert r.status_code == 201, r.text
    rid = r.json()["data"]["id"]

    async def done():
        return (await hub.call("GET", f"/v1/rollouts/{rid}")).json()["data"]["state"] == "completed"

    await wait_for(done, timeout=30, interval=0.2)


async def test_a_file_added_replaced_or_deleted_reaches_devices_running_the_configuration(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid = (await hub.call("POST", "/v1/fleets", json={"name": "f"})).json()["data"]["id"]
        dev, token = await hub.provision("kiosk", fleet_id=fid)
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
        root = running.agent.root
        r = await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": {"workload": HEALTHY}})
        cid = r.json()["data"]["id"]
        curl = f"/v1/configurations/{cid}/secret-files"
        await rollout(hub, fid, cid)
        pid = running.agent.workload.pid

        # added while the device runs the configuration: pushed, the workload not restarted
        r = await hub.call("POST", curl, json={"path": "/etc/app/added", "content_base64": b64(b"one")})
        assert r.status_code == 201, r.text
        await wait_for(lambda: status_is(hub, curl, "/etc/app/added", dev, "on_device"), timeout=15)
        assert (root / "etc/app/added").read_bytes() == b"one"
        assert running.agent.workload.pid == pid

        # replaced: the new contents reach the device
        r = await hub.call("POST", curl, json={"path": "/etc/app/added", "content_base64": b64(b"two")})
        assert r.status_code == 200
        await wait_for(lambda: status_is(hub, curl, "/etc/app/added", dev, "on_device"), timeout=15)
        assert (root / "etc/app/added").read_bytes() == b"two"

        # added while the device is offline: delivered when it links again (its hello's digests)
        await running.kill()
        r = await hub.call("POST", curl, json={"path": "/etc/app/offline", "content_base64": b64(b"late")})
        assert r.status_code == 201
        assert await device_status(hub, curl, "/etc/app/offline", dev) == "pending"
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
        await wait_for(lambda: status_is(hub, curl, "/etc/app/offline", dev, "on_device"), timeout=15)
        assert (root / "etc/app/offline").read_bytes() == b"late"

        # deleted: removed from the device
        f = next(f for f in (await hub.call("GET", curl)).json()["data"] if f["path"] == "/etc/app/added")
        assert (await hub.call("DELETE", f"{curl}/{f['id']}")).status_code == 200
        await wait_for(lambda: not (root / "etc/app/added").exists(), timeout=15)


async def test_a_new_rollout_of_the_running_version_sends_a_file_left_pending(nursery, db_url, tmp_path):
    """A delivery left pending while the device stays linked (here: set so in storage, as a lost push
    would leave it) goes with the next rollout, although that rollout's version is the one the device
    already runs."""
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid = (await hub.call("POST", "/v1/fleets", json={"name": "f"})).json()["data"]["id"]
        dev, token = await hub.provision("kiosk", fleet_id=fid)
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
        r = await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": {"workload": HEALTHY}})
        cid = r.json()["data"]["id"]
        curl = f"/v1/configurations/{cid}/secret-files"
        r = await hub.call("POST", curl, json={"path": "/etc/app/pending", "content_base64": b64(b"p")})
        assert r.status_code == 201
        await rollout(hub, fid, cid)
        await wait_for(lambda: status_is(hub, curl, "/etc/app/pending", dev, "on_device"), timeout=15)
        (running.agent.root / "etc/app/pending").unlink()
        await hub.services.db.execute("UPDATE secret_file_deliveries SET status = 'pending'")
        await rollout(hub, fid, cid)
        await wait_for(lambda: status_is(hub, curl, "/etc/app/pending", dev, "on_device"), timeout=15)
        assert (running.agent.root / "etc/app/pending").read_bytes() == b"p"
