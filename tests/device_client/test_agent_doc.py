"""docs/agent.md's commands as written: the block that creates a device and keeps its token, the one
that installs the token, and the one that checks the device with the unit's settings, run by bash
against a real hub. Only the system's paths move into the test's directory (and the installed
``fleethub`` becomes this tree's), so the page cannot drift from the hub or the CLI."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import sys
from pathlib import Path

import pytest
import trio

from tests.hubtools import start_hub

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "agent.md"
ENV_EXAMPLE = ROOT / "packaging" / "systemd" / "agent.env"

pytestmark = pytest.mark.skipif(not all(map(shutil.which, ("bash", "curl", "jq", "shred"))),
                                reason="the page's commands need bash, curl, jq and shred")


def _block(containing: str) -> str:
    """The one ```sh block of the page that contains ``containing``."""
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S) if containing in b]
    return block


def _moved(script: str, tmp: Path) -> str:
    """The page's paths under ``tmp``; the installed fleethub is this tree's, run by this Python."""
    script = script.replace("/opt/fleethub/venv/bin/fleethub", f"{shlex.quote(sys.executable)} -m hub.cli")
    script = script.replace("-o root -g root ", "")  # the test's own user is the owner
    for path in ("/etc/fleethub", "/var/lib/fleethub"):
        script = script.replace(path, str(tmp) + path)
    return script


async def _bash(script: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    done = await trio.run_process(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, check=False,
                                  env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                                  capture_stdout=True, capture_stderr=True)
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def test_the_pages_token_and_check_commands_work_as_written(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        workstation, device = tmp_path / "workstation", tmp_path / "device"
        workstation.mkdir()
        device.mkdir()
        env = {"HUB": hub.base_url, "PAT_ID": hub.pat[0], "PAT_SECRET": hub.pat[1], "ORG": hub.org_id}

        # 2. the device's token: created on the workstation, shown nowhere, kept 0600
        code, out = await _bash(_block("POST"), workstation, env)
        assert code == 0, out
        token_file = workstation / "kiosk-17.token"
        assert token_file.read_text().startswith("dev_") and stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert token_file.read_text().strip() not in out
        token = token_file.read_text().strip()
        r = await hub.call("GET", "/v1/devices")
        assert [d["name"] for d in r.json()["data"]] == ["kiosk-17"]

        # ... copied to the device and installed there, the copy shredded
        shutil.copy(token_file, device / "kiosk-17.token")
        code, out = await _bash(_moved(_block("install -m 0600"), tmp_path), device, {})
        assert code == 0, out
        installed = tmp_path / "etc/fleethub/token"
        assert installed.read_text().strip() == token and stat.S_IMODE(installed.stat().st_mode) == 0o600
        assert not (device / "kiosk-17.token").exists()

        # 3. and 8.: the example environment file with this hub, then the check with the unit's settings
        (tmp_path / "etc/fleethub/agent.env").write_text(
            ENV_EXAMPLE.read_text().replace("https://hub.example.com", hub.base_url)
            .replace("FLEETHUB_WORKLOAD_USER=fleethub-workload", "FLEETHUB_WORKLOAD_USER=nobody"))
        code, out = await _bash(_moved(_block("--check"), tmp_path), device, {})
        assert code == 0, out
        lines = out.splitlines()
        assert [line.split(":")[0] for line in lines] == [
            "ok   token", "ok   hub", "ok   clock", "ok   data dir", "ok   device root", "ok   workload",
            "ok   tunnels", "ok   containers"], out
        assert f"ok   token: read from {installed}" in lines
        assert "ok   tunnels: ssh off (--ssh), shell off (--tunnel-shell), web=127.0.0.1:80" in lines
        assert token not in out
