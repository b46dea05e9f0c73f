"""The ``fleethub`` command: serve | demo | sim | agent | tunnel | device-test | admin."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path

import trio

from hub.settings import Settings


def _logging(level: str, fmt: str) -> None:
    from hub.logs import configure

    configure(level, fmt)


GRACE = 30.0  # seconds a graceful stop may take before it becomes a hard one


async def _until_signalled(main, graceful: bool = False) -> None:
    """Run ``main`` until it ends or SIGINT/SIGTERM arrives; either way everything it started
    (hub, devices, the embedded PostgreSQL) shuts down in order. With ``graceful`` main gets a
    ``stopping`` event: the first signal sets it (main drains and returns, within GRACE seconds),
    a second signal stops at once."""
    stopping = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if graceful and not stopping.is_set():
                        print(f"\n{name}: draining (a second signal stops at once)", file=sys.stderr, flush=True)
                        stopping.set()
                        nursery.cancel_scope.deadline = trio.current_time() + GRACE
                    else:
                        print(f"\n{name}: stopping", file=sys.stderr, flush=True)
                        nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            await (main(stopping=stopping) if graceful else main())
            nursery.cancel_scope.cancel()


def _run(main, graceful: bool = False) -> None:
    trio.run(_until_signalled, main, graceful)


def _settings(args: argparse.Namespace) -> Settings:
    def path(name: str) -> Path | None:
        value = getattr(args, name, None)
        return Path(value) if value else None

    settings = Settings.from_env(data_dir=path("data_dir"), port=getattr(args, "port", None),
                                 host=getattr(args, "host", None), certfile=path("certfile"),
                                 keyfile=path("keyfile"), quic_port=getattr(args, "quic_port", None),
                                 node_id=getattr(args, "node_id", None))
    if (settings.certfile is None) != (settings.keyfile is None):
        raise SystemExit("--certfile and --keyfile go together")
    return settings


def cmd_serve(args: argparse.Namespace) -> None:
    from hub.server import run_hub

    _run(partial(run_hub, _settings(args)), graceful=True)


def cmd_demo(args: argparse.Namespace) -> None:
    from hub.demo import curl_examples, run_demo
    from hub.server import run_hub

    from dataclasses import replace

    # The demo's devices live in this process and stop with it: there is nobody to drain for, so no
    # drain window (it made Ctrl-C take 15 s), and the devices go first, so HTTP has no device
    # sockets left to wait for when it stops.
    settings = replace(_settings(args), drain_window=0.0)
    stop_devices, devices_stopped, hub_stopping = trio.Event(), trio.Event(), trio.Event()

    async def demo_devices(services, base_url, task_status=trio.TASK_STATUS_IGNORED):
        async with trio.open_nursery() as devices:
            task_status.started(await run_demo(
                services, base_url, devices, data_dir=settings.data_dir, devices=args.devices,
                memory_faults=args.memory_fault, memory_budget=args.memory_budget,
                tunnel_shell=args.tunnel_shell))
            await stop_devices.wait()
            devices.cancel_scope.cancel()
        devices_stopped.set()

    async def on_ready(services, base_url, nursery):
        info = await nursery.start(demo_devices, services, base_url)
        print(f"\nfleethub demo is up at {base_url} with {len(info['devices'])} simulated devices.\n"
              f"  organisation  {info['org_id']}\n  fleet         {info['fleet_id']}\n"
              f"  PAT id        {info['pat']['id']}\n  PAT secret    {info['pat']['secret']}\n"
              f"  admin         {info['admin']['email']} / {info['admin']['password']}\n"
              f"  written to    {settings.data_dir / 'demo.json'}\n\nTry:\n{curl_examples(info)}\n\n"
              "Ctrl-C stops the hub, the devices and PostgreSQL.\n", flush=True)

    async def main(stopping: trio.Event) -> None:
        async with trio.open_nursery() as nursery:
            async def devices_first() -> None:
                await stopping.wait()
                stop_devices.set()
                with trio.move_on_after(5):
                    await devices_stopped.wait()
                hub_stopping.set()
            nursery.start_soon(devices_first)
            await run_hub(settings, on_ready=on_ready, stopping=hub_stopping)
            nursery.cancel_scope.cancel()

    _run(main, graceful=True)
    # Everything is closed by now. The interpreter's last garbage collection walked the whole heap
    # (1.8 s of the Ctrl-C); frozen objects are skipped, and the process is about to end anyway.
    import gc
    gc.freeze()


def cmd_cluster(args: argparse.Namespace) -> None:
    from hub.cluster.local import run_local_cluster

    data_dir = Path(args.data_dir or os.environ.get("FLEETHUB_DATA_DIR", ".fleethub-cluster"))

    async def main(stopping: trio.Event) -> None:
        await run_local_cluster(data_dir, args.nodes, args.devices, stopping)

    _run(main, graceful=True)


def cmd_sim(args: argparse.Namespace) -> None:
    from device_client.sim import run_sim

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            agents = await nursery.start(partial(
                run_sim, args.hub, args.devices, Path(args.data_dir), pat_id=args.pat_id,
                pat_secret=args.pat_secret, org_id=args.org, fleet_id=args.fleet,
                registry_bytes_per_minute=args.registry_bytes_per_minute,
                memory_faults=args.memory_fault, memory_budget=args.memory_budget,
                agent_options=_tunnel_options(args)))
            print(f"{len(agents)} simulated devices connected to {args.hub}", flush=True)

    _run(main)


def cmd_agent(args: argparse.Namespace) -> None:
    from device_client.agent import Agent

    token = args.token or (Path(args.token_file).read_text().strip() if args.token_file else None) \
        or os.environ.get("FLEETHUB_DEVICE_TOKEN")
    if not token:
        raise SystemExit("fleethub agent needs --token, --token-file or FLEETHUB_DEVICE_TOKEN")
    from device_client.memtest import agent_config
    from device_client.workload import configured_user

    try:
        workload_user = configured_user(args.workload_user)  # the device operator's choice; default: ours
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    agent = Agent(args.hub, token, Path(args.data_dir), reboot_mode="exec", **_tunnel_options(args),
                  memtest=agent_config(args.memory_fault, args.memory_budget, test_boot=args.memtest_test_boot),
                  workload_user=workload_user)
    _run(agent.run)


def _tunnel_options(args: argparse.Namespace) -> dict:
    """The agent's tunnels: its configuration from the flags and the engine that serves them, which
    the launcher passes in (device_client, the bottom layer, does not import webrtc)."""
    from webrtc.device_tunnel import attach

    return {"tunnel": _tunnel_config(args), "tunnel_engine": attach}


def _tunnel_config(args: argparse.Namespace):
    from device_client.tunnel import TunnelConfig

    try:
        return TunnelConfig.from_flags(args.tunnel_target, args.tunnel_allow_port, args.ssh,
                                       args.tunnel_shell, args.tunnel_shell_user)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def cmd_admin(args: argparse.Namespace) -> None:
    from hub.admin import run_admin

    print(json.dumps(trio.run(run_admin, _settings(args), args), indent=2))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleethub", description=__doc__)
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING")
    parser.add_argument("--log-format", default=None, choices=["text", "json"],
                        help="text (default) or json: one object per line with request id and organisation")
    sub = parser.add_subparsers(dest="command", required=True)
    from device_client.memtest import add_cli_flags as memtest_flags
    from device_client.tunnel import add_arguments as tunnel_flags
    from webrtc.cli_tunnel import add_arguments as tunnel_command

    def hub_args(p: argparse.ArgumentParser, port: int | None = 8080) -> None:
        p.add_argument("--data-dir", default=None, help="where data lives (default $FLEETHUB_DATA_DIR or .fleethub)")
        p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
        p.add_argument("--port", type=int, default=None, help=f"port to bind (default {port})")

    p = sub.add_parser("serve", help="run the hub")
    hub_args(p)
    p.add_argument("--certfile", help="TLS certificate (PEM): serve HTTPS, HTTP/2 and HTTP/3")
    p.add_argument("--keyfile", help="TLS private key (PEM)")
    p.add_argument("--quic-port", type=int, default=None, help="UDP port for HTTP/3 (default: --port)")
    p.add_argument("--node-id", default=None, help="this node's name in a cluster (with FLEETHUB_NATS_URL; "
                                                   "default $FLEETHUB_NODE_ID or generated)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", help="run the hub with a demo organisation and simulated devices")
    hub_args(p)
    p.add_argument("--devices", type=int, default=3, help="simulated devices (default 3)")
    p.add_argument("--tunnel-shell", action="store_true",
                   help="the demo devices offer the shell target (the console's terminal) as this user")
    memtest_flags(p, sim=True)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("cluster", help="run nats-server, PostgreSQL and N hub nodes here, with simulated "
                                       "devices spread over them (docs/cluster.md)")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--devices", type=int, default=6)
    p.add_argument("--data-dir", default=None, help="default $FLEETHUB_DATA_DIR or .fleethub-cluster")
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser("sim", help="run N simulated device agents in one process")
    p.add_argument("--hub", required=True, help="hub base URL, e.g. http://127.0.0.1:8080, or several "
                                                "nodes' URLs comma-separated (each device fails over in turn)")
    p.add_argument("--devices", type=int, default=10)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--pat-id")
    p.add_argument("--pat-secret")
    p.add_argument("--org", help="organisation id (to provision devices)")
    p.add_argument("--fleet", help="fleet id for provisioned devices")
    p.add_argument("--registry-bytes-per-minute", type=int, default=0,
                   help="registry-proxy bytes each device carries per minute (reported for billing)")
    tunnel_flags(p)
    memtest_flags(p, sim=True)
    p.set_defaults(func=cmd_sim)

    p = sub.add_parser("agent", help="run the device agent")
    p.add_argument("--hub", required=True, help="hub base URL, or several nodes' URLs comma-separated: a "
                                                "link that fails before its welcome moves on to the next")
    p.add_argument("--token", help="the device token from POST /v1/devices (visible in ps; prefer "
                                   "--token-file or FLEETHUB_DEVICE_TOKEN on a shared machine)")
    p.add_argument("--token-file", help="a file holding the device token")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--workload-user", help="run configuration workloads as this user (default: "
                                           "FLEETHUB_WORKLOAD_USER, else the agent's own user)")
    tunnel_flags(p)
    memtest_flags(p, sim=False)
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser("tunnel", help="forward local TCP connections to a device target over WebRTC")
    tunnel_command(p)

    p = sub.add_parser("device-test", help="qualify a device: play the hub for it and check the link protocol's "
                                           "rules (docs/device-protocol.md)")
    from device_client.qualify.cli import add_arguments as device_test_args
    device_test_args(p)
    p.set_defaults(func=cmd_device_test)

    p = sub.add_parser("admin", help="create organisations, users and PATs directly in storage")
    hub_args(p)
    asub = p.add_subparsers(dest="admin_command", required=True)
    a = asub.add_parser("create-org")
    a.add_argument("name")
    a.add_argument("--tier", default="standard", choices=["standard", "professional", "enterprise"])
    a = asub.add_parser("create-user")
    a.add_argument("email")
    a.add_argument("--org", required=True, help="organisation id")
    a.add_argument("--role", default="member", choices=["admin", "member"])
    a.add_argument("--name", default="")
    a.add_argument("--password", help="dashboard password (argon2id-hashed); omit for API-only users")
    a = asub.add_parser("create-pat")
    a.add_argument("email")
    a.add_argument("--description", default="")
    a.add_argument("--expires-in-days", type=float, default=None)
    a = asub.add_parser("set-tier", help="an organisation's rate-limit tier")
    a.add_argument("org", help="organisation id")
    a.add_argument("tier", choices=["standard", "professional", "enterprise"])
    a.add_argument("--rate-limit", type=int, default=None, help="requests per hour (enterprise only)")
    a = asub.add_parser("delete-user", help="delete a user: their PATs and sessions stop working at once")
    a.add_argument("email")
    asub.add_parser("rotate-secret-key", help="re-encrypt every secret file under a new key (hub may run)")
    asub.add_parser("rotate-signing-key", help="a new token and grant signing key; tokens signed by the "
                    "previous key stay valid until they expire (hub may run)")
    a = asub.add_parser("backup", help="pg_dump the hub's database to FILE (hub may run; keys not included)")
    a.add_argument("file")
    a = asub.add_parser("restore", help="replace the database's contents with a backup (stop the hub first)")
    a.add_argument("file")
    from hub.billing.admin import add_parsers as add_billing_parsers
    add_billing_parsers(asub)
    from hub.tunnels.admin import add_parsers as add_tunnel_parsers
    add_tunnel_parsers(asub)
    from hub.assistant.admin import add_parsers as add_assistant_parsers
    add_assistant_parsers(asub)
    p.set_defaults(func=cmd_admin)
    return parser


def cmd_device_test(args: argparse.Namespace) -> None:
    from device_client.qualify.cli import main as device_test

    code = trio.run(_until_signalled_result, device_test, args)
    sys.exit(code)


async def _until_signalled_result(main, *args):
    result: list[int] = [1]

    async def run() -> None:
        result[0] = await main(*args)

    await _until_signalled(run)
    return result[0]


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    _logging(args.log_level or Settings.from_env().log_level,
             args.log_format or os.environ.get("FLEETHUB_LOG_FORMAT", "text"))
    try:
        args.func(args)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 — a CLI reports and exits non-zero
        reason = exc
        while isinstance(reason, BaseExceptionGroup) and len(reason.exceptions) == 1:
            reason = reason.exceptions[0]  # say what failed, not "Exceptions from Trio nursery"
        logging.getLogger("fleethub").critical("fatal: %s", reason, exc_info=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
