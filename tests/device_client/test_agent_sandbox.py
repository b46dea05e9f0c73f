"""The agent inside the sandbox of packaging/systemd/fleethub-agent.service, approximated without
systemd (this machine has none running): a private mount namespace in which

- ``/`` is read-only except the data dir (ProtectSystem=strict with StateDirectory=); /dev, /proc and
  /sys are mounts of their own and stay as they are, as under systemd;
- ``/tmp`` is a fresh tmpfs (PrivateTmp=yes);
- ``/home`` and ``/run/user`` are empty (ProtectHome=yes; ``/root`` stays, because this machine's Python
  lives there, which a device's does not: docs/agent.md installs under /opt);
- no new privileges (NoNewPrivileges=yes, through setpriv).

The agent links, delivers a secret file, runs the workload as another account (which cannot write
outside the data dir either), re-executes itself for a reboot, and ``--check`` run inside sees
what the sandbox allows. It does not prove systemd's own behaviour; it proves the agent's work fits
in what those settings leave."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from device_client.workload_account import RunAs
from tests.hubtools import start_hub, wait_for

ROOT = Path(__file__).resolve().parents[2]
FLEETHUB = [sys.executable, "-m", "hub.cli"]

# $2: the checkout and the venv when they lie under /tmp (a CI clone may): the fresh /tmp would hide
# the very program under test, so they are carried into it, read-only, through a bind of the old /tmp
SANDBOX = r"""
set -e
data=$1; keep=$2; shift 2
mount --bind "$data" "$data"
if [ -n "$keep" ]; then mount --bind /tmp /mnt; fi
mount -o remount,bind,ro /
mount -t tmpfs -o mode=1777 tmpfs /tmp
for k in $keep; do
    mkdir -p "$k"; mount --bind "/mnt${k#/tmp}" "$k"; mount -o remount,bind,ro "$k"
done
for d in /home /run/user; do if [ -d "$d" ]; then mount -t tmpfs -o ro,mode=0755 tmpfs "$d"; fi; done
exec setpriv --no-new-privs -- "$@"
"""


def _namespaces_work() -> bool:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        return False
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           "mount -t tmpfs tmpfs /mnt && mount -o remount,bind,ro /mnt"],
                          capture_output=True, timeout=30)
    return done.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_work(), reason="needs root and mount namespaces")


def _under_tmp() -> str:
    paths = {str(p) for p in (ROOT, Path(sys.prefix)) if Path("/tmp") in p.parents}
    return " ".join(p for p in sorted(paths) if not any(q != p and p.startswith(q + "/") for q in paths))


def _sandboxed(data: Path, *argv: str) -> list[str]:
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", SANDBOX, "sandbox", str(data), _under_tmp(),
            *argv]


@pytest.fixture
def base():
    """Not under /tmp (the sandbox's /tmp is its own) nor under pytest's 0700 tmp_path (the workload's
    account passes through the parents of its device root)."""
    path = Path(tempfile.mkdtemp(prefix="fleethub-sandbox-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


WORKLOAD = "\n".join([
    'V="$FLEETHUB_VOLUMES_DIR"',
    'id -u > "$V/uid"',
    # /var/tmp is writable by everyone, outside the sandbox
    'if touch /var/tmp/fleethub-sandbox-escape 2>/dev/null; then echo escaped > "$V/escape"; fi',
    'T="$FLEETHUB_SECRETS_DIR/app-token"; i=0',
    'while [ ! -e "$T" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done',
    'cat "$T" > "$V/token" 2>&1',
    'echo done > "$V/done"',
    'exec sleep 600',
])


async def test_the_agent_does_its_work_inside_the_units_sandbox(nursery, db_url, tmp_path, base):
    escape = Path("/var/tmp/fleethub-sandbox-escape")
    assert not escape.exists()
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        dev, token = await hub.provision("sandboxed")
        data, elsewhere = base / "data", base / "elsewhere"
        data.mkdir(mode=0o700)
        elsewhere.mkdir()
        token_file = base / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEETHUB_WORKLOAD_USER": "nobody"}
        env.pop("FLEETHUB_DEVICE_TOKEN", None)
        flags = ["--hub", hub.base_url, "--token-file", str(token_file)]

        # --check inside: the data dir is writable, anywhere else is not
        done = await trio.run_process(_sandboxed(data, *FLEETHUB, "agent", "--check", *flags, "--data-dir",
                                                 str(data)), env=env, cwd=ROOT, check=False,
                                      capture_stdout=True, capture_stderr=True)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
        done = await trio.run_process(_sandboxed(data, *FLEETHUB, "agent", "--check", *flags, "--data-dir",
                                                 str(elsewhere)), env=env, cwd=ROOT, check=False,
                                      capture_stdout=True, capture_stderr=True)
        assert done.returncode == 1
        assert f"FAIL data dir: {elsewhere} is not writable: Read-only file system" in done.stdout.decode()

        agent = await trio.lowlevel.open_process(_sandboxed(data, *FLEETHUB, "agent", *flags, "--data-dir",
                                                            str(data)), env=env, cwd=ROOT,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            async def online(reason: str) -> bool:
                r = await hub.call("GET", f"/v1/devices/{dev}")
                row = r.json()["data"]
                return row["online"] and row["boot_reason"] == reason

            await wait_for(lambda: online("power_on"), timeout=30)

            r = await hub.call("POST", "/v1/configurations", json={"name": "boxed", "spec": {"workload": {
                "command": ["sh", "-c", WORKLOAD], "healthCheck": {"graceSeconds": 0.2, "timeoutSeconds": 5}}}})
            assert r.status_code == 201, r.text
            cid = r.json()["data"]["id"]
            r = await hub.call("POST", f"/v1/configurations/{cid}/secret-files", json={
                "path": "/var/lib/fleethub/secrets/app-token", "content_base64": base64.b64encode(b"tok-1").decode(),
                "mode": "0440", "uid": 0, "gid": RunAs.lookup("nobody").gid})
            assert r.status_code == 201, r.text
            r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid})
            assert r.status_code == 202, r.text
            volumes = data / "root/var/lib/fleethub/volumes"
            await wait_for(lambda: (volumes / "done").exists(), timeout=30)
            assert int((volumes / "uid").read_text()) == RunAs.lookup("nobody").uid
            assert (volumes / "token").read_text() == "tok-1"
            assert not (volumes / "escape").exists() and not escape.exists()

            # a reboot re-executes the agent in place: in the same sandbox, without new privileges
            r = await hub.call("POST", f"/v1/devices/{dev}/reboot")
            assert r.status_code == 202, r.text
            await wait_for(lambda: online("reboot"), timeout=30)
            assert agent.returncode is None
        finally:
            agent.send_signal(signal.SIGTERM)  # as systemctl stop: the agent stops its workload and leaves
            with trio.move_on_after(20):
                await agent.wait()
            if agent.returncode is None:
                agent.kill()
                await agent.wait()
            escape.unlink(missing_ok=True)
        assert agent.returncode == 0
