"""``fleethub device-test --listen HOST:PORT``: wait for one device, qualify it, print the verdict.

Point the device under test at ``http://HOST:PORT`` (its link URL is ``ws://HOST:PORT/v1/device/link``);
any bearer token is accepted unless ``--token`` names the one expected. Exit status 0 when every rule
passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys

import trio

from ..shared import linkcodes
from .link import Listener
from .report import passed, write
from .scenarios import Options, Qualification

DEFAULT_DEVICE_ID = "6f1c2a52-0d4e-4c35-9d1b-6a7c0e5f9a10"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", required=True, type=parse_listen, metavar="HOST:PORT",
                   help="where the kit listens for the device")
    p.add_argument("--token", help="the bearer token the device must send (default: any)")
    p.add_argument("--device-id", default=DEFAULT_DEVICE_ID, help="the device id the kit's welcome gives")
    p.add_argument("--heartbeat", type=float, default=1.0, help="welcome.heartbeatInterval (seconds)")
    p.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the device's first connection")
    p.add_argument("--reconnect-timeout", type=float, default=60.0,
                   help="seconds the device has to come back after a reboot, drain or close")
    p.add_argument("--superseded-wait", type=float, default=linkcodes.SUPERSEDED_BACKOFF,
                   help="least seconds the device must stay away after close 4001")
    p.add_argument("--backoff-min", type=float, default=1.0,
                   help="X1: least seconds the device stays away in all over 6 reconnects after close 4002")
    p.add_argument("--drain-window", type=float, default=2.0,
                   help="X3: the reconnect window the kit's close 4004 states (seconds)")
    p.add_argument("--slowest-backoff", type=float, default=10.0,
                   help="T2, X5, X7: least seconds the device must stay away after a 401, close 4003 or close 4426 "
                        "(the document's slowest backoff, the device's backoff cap)")
    p.add_argument("--file-owner", default=(0, 0), type=parse_owner, metavar="UID:GID", help="owner of the files the kit writes")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="the verdicts as text (default) or as JSON")


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"HOST:PORT wanted, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def parse_owner(value: str) -> tuple[int, int]:
    uid, _, gid = value.partition(":")
    if not uid.isdigit() or not (gid or uid).isdigit():
        raise argparse.ArgumentTypeError(f"UID:GID (numbers) wanted, got {value!r}")
    return int(uid), int(gid or uid)


def options_from(args: argparse.Namespace) -> Options:
    return Options(heartbeat=args.heartbeat, first_timeout=args.wait, reconnect_timeout=args.reconnect_timeout,
                   superseded_wait=args.superseded_wait, file_owner=args.file_owner,
                   backoff_min_total=args.backoff_min, drain_window=args.drain_window,
                   slowest_backoff=args.slowest_backoff)


async def qualify(listener: Listener, options: Options, *, task_status=trio.TASK_STATUS_IGNORED):
    """Listen, run the scenarios against the first device that connects, return the verdicts."""
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.serve)
        task_status.started(listener)
        verdicts = await Qualification(listener, options).run()
        nursery.cancel_scope.cancel()
    return verdicts


async def main(args: argparse.Namespace) -> int:
    host, port = args.listen
    listener = Listener(host, port, token=args.token, device_id=args.device_id)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.serve)
        print(f"device-test: waiting for a device at ws://{host}:{listener.port}/v1/device/link "
              f"(point it at http://{host}:{listener.port})", file=sys.stderr, flush=True)
        verdicts = await Qualification(listener, options_from(args)).run()
        nursery.cancel_scope.cancel()
    write(verdicts, sys.stdout, fmt=args.format)
    return 0 if passed(verdicts) else 1
