"""The systemd unit in packaging/systemd/: systemd accepts it (with the shell target's drop-in), and
its ExecStart is a command line ``fleethub agent`` accepts, so the unit cannot drift from the CLI."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hub.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
UNIT_DIR = ROOT / "packaging" / "systemd"
UNIT = UNIT_DIR / "fleethub-agent.service"
ENV_EXAMPLE = UNIT_DIR / "agent.env"
INSTALLED = "/opt/fleethub/venv/bin/fleethub"  # where docs/agent.md installs the agent


def _settings(path: Path, section: str) -> dict[str, list[str]]:
    """A unit file's settings of one section: name -> every value given (systemd allows repeats)."""
    values: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            continue
        if current == section:
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def _env_example() -> dict[str, str]:
    """The example environment file as systemd reads it (and a shell: a value with spaces is quoted)."""
    env = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            [env[key]] = shlex.split(value)  # one word each: a shell that sources it sets each variable
    return env


def _exec_start_argv(env: dict[str, str], unit: Path = UNIT) -> list[str]:
    """ExecStart as systemd runs it: ${VAR} is one argument, an unbraced $VAR splits on whitespace,
    %d is the credentials directory. A drop-in's empty ExecStart= clears the unit's first."""
    line = [v for v in _settings(unit, "Service")["ExecStart"] if v][-1]
    argv = []
    for word in shlex.split(line):
        unbraced = re.fullmatch(r"\$([A-Z_]+)", word)
        if unbraced:
            argv += env[unbraced.group(1)].split()
            continue
        word = re.sub(r"\$\{([A-Z_]+)\}", lambda m: env[m.group(1)], word)
        argv.append(word.replace("%d", "/run/credentials/fleethub-agent.service"))
    return argv


def test_exec_start_is_a_command_line_the_agent_accepts():
    env = _env_example()
    argv = _exec_start_argv(env)
    assert argv[0] == INSTALLED
    args = build_parser().parse_args(argv[1:])
    assert args.func.__name__ == "cmd_agent" and not args.check
    assert args.hub == env["FLEETHUB_HUB_URL"]
    assert args.token_file == "/run/credentials/fleethub-agent.service/token"
    assert args.token is None, "a token on the command line is visible in ps"
    # the data dir is the one systemd makes and the sandbox leaves writable
    service = _settings(UNIT, "Service")
    assert args.data_dir == "/var/lib/fleethub" and service["StateDirectory"] == ["fleethub"]
    assert service["LoadCredential"] == ["token:/etc/fleethub/token"]
    assert args.tunnel_target == ["web=127.0.0.1:80"]  # FLEETHUB_AGENT_ARGS reached the parser
    # and the same line with --check is the check docs/agent.md runs
    assert build_parser().parse_args([*argv[1:], "--check"]).check


def test_the_device_root_drop_in_is_a_command_line_the_agent_accepts_with_its_own_data_dir():
    from device_client.agentconfig import AgentConfig

    dropin = UNIT_DIR / "fleethub-agent-device-root.conf"
    argv = _exec_start_argv(_env_example(), dropin)
    args = build_parser().parse_args(argv[1:])
    service = _settings(dropin, "Service")
    assert args.device_root == "/" and args.data_dir == "/var/lib/fleethub-agent"
    assert service["StateDirectory"] == ["", "fleethub-agent"] and service["ExecStart"][0] == ""
    assert "/var/lib/fleethub" in service["ReadWritePaths"][0].split()  # the platform directory
    # and the agent takes the pair (a data dir inside the platform directory is refused)
    assert AgentConfig(args.hub, "t", args.data_dir, device_root=args.device_root).device_root == Path("/")


def test_every_variable_the_unit_uses_is_in_the_environment_example():
    [line] = _settings(UNIT, "Service")["ExecStart"]
    used = set(re.findall(r"\$\{?([A-Z_]+)", line))
    assert used and used <= set(_env_example())
    assert "FLEETHUB_DEVICE_TOKEN" not in _env_example(), "the token is a credential, not an environment"


def test_the_sandbox_keeps_what_the_agent_needs():
    service = _settings(UNIT, "Service")
    assert service["ProtectSystem"] == ["strict"] and service["Restart"] == ["always"]
    assert service["LimitMEMLOCK"] == ["infinity"] and service["StandardOutput"] == ["journal"]
    # a memory test writes /proc/sys/vm/drop_caches and /sys/.../soft_offline_page
    assert "ProtectKernelTunables" not in service
    # what test_agent_sandbox.py runs the agent under
    assert {k: service[k] for k in ("PrivateTmp", "ProtectHome", "NoNewPrivileges")} == {
        "PrivateTmp": ["yes"], "ProtectHome": ["yes"], "NoNewPrivileges": ["yes"]}
    shell = _settings(UNIT_DIR / "fleethub-agent-shell.conf", "Service")
    assert {k: v for k, v in shell.items() if k in service} == {k: ["no"] for k in shell}, \
        "the shell's drop-in only lifts settings the unit sets"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit_and_the_shell_drop_in(tmp_path):
    # verify wants ExecStart's program to exist: the one this test runs with stands in for /opt's
    program = Path(sys.executable).parent / "fleethub"
    assert program.exists(), program
    (tmp_path / UNIT.name).write_text(UNIT.read_text().replace(INSTALLED, str(program)))
    dropins = tmp_path / f"{UNIT.name}.d"
    dropins.mkdir()
    shutil.copy(UNIT_DIR / "fleethub-agent-shell.conf", dropins / "shell.conf")
    (dropins / "device-root.conf").write_text(
        (UNIT_DIR / "fleethub-agent-device-root.conf").read_text().replace(INSTALLED, str(program)))
    done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / UNIT.name)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", done.stdout + done.stderr
    # and this check sees a mistake: a value systemd cannot parse, in the drop-in too
    (dropins / "shell.conf").write_text("[Service]\nProtectSystem=maybe\n")
    done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / UNIT.name)], capture_output=True,
                          text=True, timeout=60)
    assert "shell.conf:2: Failed to parse protect system value" in done.stderr
