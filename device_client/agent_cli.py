"""``fleethub agent``: the device agent's flags and its wiring, apart from the hub's commands.

hub/cli.py is the one ``fleethub`` entry and delegates the ``agent`` command here. Everything this
module imports is in the plain distribution (``pip install fleethub``, no ``[hub]`` extra): on a device
the hub's dependencies are not installed (.importlinter, "agent-without-hub";
tests/device_client/test_agent_install.py). The tunnel engine (webrtc/device_tunnel.py) is passed in
by the launcher: device_client is the bottom layer and does not import webrtc.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable


def hub_url_flag(value: str) -> str:
    """``--hub`` as the parser reads it: every URL checked (a typo is a usage error, not a traceback out
    of the agent's start), the value kept as given."""
    from device_client.agentconfig import hub_urls

    try:
        hub_urls(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    from device_client.memtest import add_cli_flags as memtest_flags
    from device_client.tunnel import add_arguments as tunnel_flags

    p.add_argument("--hub", required=True, type=hub_url_flag, help="hub base URL, or several nodes' URLs comma-separated: a "
                                                "link that fails before its welcome moves on to the next")
    p.add_argument("--token", help="the device token from POST /v1/devices (visible in ps; prefer "
                                   "--token-file or FLEETHUB_DEVICE_TOKEN on a shared machine)")
    p.add_argument("--token-file", help="a file holding the device token")
    p.add_argument("--data-dir", required=True, help="where the agent keeps its identity, state and files")
    p.add_argument("--device-root", help="where device paths land: / on a device in service, so a file for "
                                         "/etc/app/key is written at /etc/app/key (default: DATA_DIR/root, a "
                                         "sandbox for trying the agent out); docs/agent.md")
    p.add_argument("--workload-user", help="run configuration workloads as this user (default: "
                                           "FLEETHUB_WORKLOAD_USER, else the agent's own user)")
    p.add_argument("--containers", choices=["podman"], help="run the containers of configuration versions "
                   "with this engine (default: none; such versions are rejected); docs/containers.md")
    p.add_argument("--containers-conf", help="a containers.conf for podman (CONTAINERS_CONF), so the device's "
                                             "/etc/containers stays as it is")
    p.add_argument("--image-budget-mib", type=int, default=2048, help="disk kept for images no container uses "
                   "before the oldest are pruned (default 2048)")
    p.add_argument("--registry-proxy", choices=["off", "fallback", "always"], default="fallback",
                   help="pull images through the hub's registry proxy when the registry fails (fallback, the "
                        "default), always, or never (off); the fleet must have the proxy on; docs/containers.md")
    p.add_argument("--check", action="store_true", help="check the token, the hub, the clock, the data dir, "
                   "the workload user and the tunnel flags; one line each, exit non-zero on a failure")
    tunnel_flags(p)
    memtest_flags(p, sim=False)


def build_agent(args: argparse.Namespace, tunnel_engine: Callable[..., Any]):
    """The Agent that ``fleethub agent`` runs, from its flags (SystemExit with the reason on a bad one)."""
    from device_client.agent import Agent, AgentConfig

    token = args.token or (Path(args.token_file).read_text().strip() if args.token_file else None) \
        or os.environ.get("FLEETHUB_DEVICE_TOKEN")
    if not token:
        raise SystemExit("fleethub agent needs --token, --token-file or FLEETHUB_DEVICE_TOKEN")
    from device_client.memtest import agent_config
    from device_client.workload_account import configured_user

    try:
        workload_user = configured_user(args.workload_user)  # the device operator's choice; default: ours
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    try:
        config = AgentConfig(args.hub, token, Path(args.data_dir), reboot_mode="exec",
                             **tunnel_options(args, tunnel_engine),
                             memtest=agent_config(args.memory_fault, args.memory_budget,
                                                 test_boot=args.memtest_test_boot),
                             workload_user=workload_user, **container_options(args),
                             device_root=Path(args.device_root) if args.device_root else None)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return Agent(config)


def container_options(args: argparse.Namespace) -> dict:
    if not args.containers:
        return {}
    from device_client.engine.podman import Podman

    conf = Path(args.containers_conf) if args.containers_conf else None
    # the env files of ``podman create`` live for an instant in the agent's own 0700 directory, not /tmp
    engine = Podman(conf=conf, scratch=Path(args.data_dir))
    return {"container_engine": engine, "image_budget": max(0, args.image_budget_mib) << 20,
            "registry_proxy": args.registry_proxy}


def tunnel_options(args: argparse.Namespace, tunnel_engine: Callable[..., Any]) -> dict:
    """The agent's tunnels: its configuration from the flags and the engine that serves them."""
    return {"tunnel": tunnel_config(args), "tunnel_engine": tunnel_engine}


def tunnel_config(args: argparse.Namespace):
    from device_client.tunnel import TunnelConfig

    try:
        return TunnelConfig.from_flags(args.tunnel_target, args.tunnel_allow_port, args.ssh,
                                       args.tunnel_shell, args.tunnel_shell_user)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
