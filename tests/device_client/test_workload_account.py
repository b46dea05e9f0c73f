"""Workloads of simulated devices run as an unprivileged account, away from the hub's keys.

A configuration's workload is a command an organisation editor chose. On a simulator that shares the
hub's host as root (``fleethub demo``), it must not run as root nor read the hub's signing key, its
secret-file key, the database password, the device tokens of sim.json or the agent's identity key.
The workload here tries each with ``cat`` and reports what it managed to read.
"""

from __future__ import annotations

import base64
import os
import shutil
import stat
import tempfile
from functools import partial
from pathlib import Path

import pytest
import trio

from device_client.sim import run_sim
from device_client.workload import Workload
from device_client.workload_account import RunAs, simulator_user
from device_client.workload_spec import parse_spec
from tests.hubtools import FAST_BACKOFF, start_hub, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another account needs root")

NOBODY = RunAs.lookup("nobody")


@pytest.fixture
def shared_dir():
    """Not tmp_path: pytest resets its base directory to 0700 whenever a pytest session starts, and
    the workload's account must pass through the parents of its device root."""
    root = Path(tempfile.mkdtemp(prefix="fleethub-test-account-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def prober(targets: list[str]) -> dict:
    """A workload that records its uid, every target it could read, and its own secret file."""
    script = "\n".join([
        'V="$FLEETHUB_VOLUMES_DIR"',
        'id -u > "$V/uid.tmp" && mv "$V/uid.tmp" "$V/uid"',
        ': > "$V/leaks"',
        'for f in "$@"; do',
        '  if [ -d "$f" ]; then ls "$f" >/dev/null 2>&1 && echo "listed $f" >> "$V/leaks"',
        '  else cat "$f" >/dev/null 2>&1 && echo "read $f" >> "$V/leaks"; fi',
        'done',
        'T="$FLEETHUB_SECRETS_DIR/app-token"; i=0',
        'while [ ! -e "$T" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done',  # files may follow the start
        'cat "$T" > "$V/token" 2>&1',
        'echo done > "$V/done"',
        'exec sleep 600',
    ])
    return {"command": ["sh", "-c", script, "prober", *targets],
            "healthCheck": {"command": ["sh", "-c", '[ "$(id -u)" != 0 ]'], "graceSeconds": 0.2,
                            "timeoutSeconds": 5}}


async def test_a_workload_runs_as_its_account_and_the_health_check_too(shared_dir):
    data_dir = shared_dir / "dev"
    secrets = data_dir / "root/var/lib/fleethub/secrets"
    secrets.mkdir(parents=True)
    (secrets / "app-token").write_text("tok-0")
    data_dir.chmod(0o700)
    key = shared_dir / "hub-key"
    key.write_bytes(b"hub secret")
    key.chmod(0o600)
    workload = Workload(data_dir, data_dir / "root", run_as=NOBODY)
    volumes = data_dir / "root/var/lib/fleethub/volumes"
    with trio.fail_after(20):
        await workload.start(parse_spec({"workload": prober([str(key)])}))
        health = await workload.wait_healthy(10)
        assert health.healthy, health.detail  # the health check found a uid other than 0
        await wait_for(lambda: (volumes / "done").exists(), timeout=10)
        await workload.stop()
    assert int((volumes / "uid").read_text()) == NOBODY.uid
    assert (volumes / "leaks").read_text() == ""
    assert (volumes / "token").read_text() == "tok-0"
    assert stat.S_IMODE(data_dir.stat().st_mode) & 0o077 == 0o001, "others may pass, never list"
    assert (volumes.stat().st_uid, volumes.stat().st_gid) == (NOBODY.uid, NOBODY.gid)


def test_the_simulators_account_is_never_root(monkeypatch):
    assert simulator_user().uid == NOBODY.uid  # the default
    monkeypatch.setenv("FLEETHUB_WORKLOAD_USER", "root")
    with pytest.raises(ValueError, match="must not run as root"):
        simulator_user()
    monkeypatch.setenv("FLEETHUB_WORKLOAD_USER", "no-such-user-here")
    with pytest.raises(ValueError, match="no user"):
        simulator_user()


async def test_a_simulated_workload_is_not_root_and_cannot_read_the_hubs_keys(
        nursery, db_url, embedded_pg, shared_dir):
    hub_dir = shared_dir  # as in `fleethub demo`: the simulator's devices live in the hub's data dir
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, hub_dir, heartbeat_interval=0.5)
        dev, token = await hub.provision("sim-probe")
        device_dir = hub_dir / "devices" / dev
        targets = [hub_dir / "jwt-ed25519.pem", hub_dir / "secret-files.key", hub_dir / "sim.json",
                   device_dir / "identity.key", device_dir / "state.json", hub_dir, hub_dir / "devices"]
        if embedded_pg is not None:
            targets.append(embedded_pg.password_file)
        agents = await nursery.start(partial(run_sim, hub.base_url, 1, hub_dir, devices=[(dev, token)],
                                             agent_options=FAST_BACKOFF))
        assert agents[0].workload.run_as == NOBODY
        assert all(t.exists() for t in targets), "a file that is not there proves nothing"

        r = await hub.call("POST", "/v1/configurations",
                           json={"name": "probe", "spec": {"workload": prober([str(t) for t in targets])}})
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        # a secret the workload must read, asked for root and 0400: the simulated device gives it
        # to the workload's account, so the unprivileged workload still starts with it
        r = await hub.call("POST", f"/v1/configurations/{cid}/secret-files", json={
            "path": "/var/lib/fleethub/secrets/app-token", "content_base64": base64.b64encode(b"tok-1").decode(),
            "mode": "0400", "uid": 0, "gid": 0})
        assert r.status_code == 201, r.text
        r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid})
        assert r.status_code == 202, r.text
        volumes = device_dir / "root/var/lib/fleethub/volumes"
        await wait_for(lambda: (volumes / "done").exists(), timeout=30)

    assert int((volumes / "uid").read_text()) == NOBODY.uid != 0
    assert (volumes / "leaks").read_text() == "", "the workload read the hub's or the agent's secrets"
    assert (volumes / "token").read_text() == "tok-1"
    assert stat.S_IMODE(hub_dir.stat().st_mode) == 0o711, "others may pass, never list"
    for target in targets:
        if target.is_file():
            assert stat.S_IMODE(target.stat().st_mode) == 0o600, target
