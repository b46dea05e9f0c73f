"""``fleethub tunnel --hub URL --device ID|NAME --target NAME [--listen HOST:PORT | --stdio]``.

``--device`` is the device's id or its name (device_client/names.py): a name is looked up among the
devices the credentials may see, and one that several share is refused with their ids.

Credentials as for the other commands that call the hub: ``--pat-id``/``--pat-secret`` (or
FLEETHUB_PAT_ID / FLEETHUB_PAT_SECRET, which keep the secret out of ``ps``), or a bearer token in
FLEETHUB_TOKEN; the organisation with ``--org`` or FLEETHUB_ORG_ID; the hub with ``--hub`` or
FLEETHUB_HUB_URL.

``--listen`` (default 127.0.0.1:0, a free port) binds before the hub is asked, so a port in use costs
no session. The CLI prints one line when the listener is up (with the port it got), runs until Ctrl-C
(exit 0) or until the device or the connection ends the session (exit 1), and deletes the session on
the hub on the way out, printing the bytes each way, the duration and whether the path was direct or
relayed.

``--stdio`` forwards stdin/stdout instead, one connection, for OpenSSH's ProxyCommand:

    ssh -o ProxyCommand='fleethub tunnel --stdio --device %n --target ssh' root@<device name or id>

(``%n``, the host as typed: ssh lowercases ``%h``, and names are case-sensitive.)

It ends (exit 0) when ssh closes the connection or stops it (SIGHUP); it prints nothing but
failures unless ``--verbose``, since whatever it prints lands in the ssh user's terminal.
``--verbose`` or FLEETHUB_TUNNEL_TIMING=1 also prints, at exit, one ``tunnel timing:`` line with
when each step was reached (marks.py; bench/tunnel_product.py splits ``ssh host true`` with it).

Every failure is one line on stderr saying what to do (webrtc/failures.py) and exit 2: the session
never opened. No traceback reaches the user; ``--log-level DEBUG`` shows one for an unexpected fault.

The process runs on asyncio alone, aiortc's loop on the main thread: no trio and no httpx are loaded
(client.py, hubcalls.py), since ssh waits for this start at every connection (issue 35).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable
from typing import Any, Callable, NoReturn

log = logging.getLogger("fleethub.tunnel")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hub", default=None,
                        help="hub base URL, e.g. http://127.0.0.1:8080 (default $FLEETHUB_HUB_URL)")
    parser.add_argument("--device", required=True,
                        help="the device's id or name (a name several devices share is refused: give the id)")
    parser.add_argument("--target", required=True, help="a target the device offers (e.g. ssh) or a port it allows")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--listen", default="127.0.0.1:0",
                       help="local HOST:PORT to listen on (default 127.0.0.1:0: a free port, printed)")
    where.add_argument("--stdio", action="store_true",
                       help="forward stdin/stdout instead of listening (an OpenSSH ProxyCommand)")
    parser.add_argument("--verbose", action="store_true", help="with --stdio: print the ready and closing lines")
    parser.add_argument("--org", default=None, help="organisation id (default $FLEETHUB_ORG_ID)")
    parser.add_argument("--pat-id", default=None, help="PAT id (default $FLEETHUB_PAT_ID)")
    parser.add_argument("--pat-secret", default=None,
                        help="PAT secret (visible in ps; prefer $FLEETHUB_PAT_SECRET)")
    parser.set_defaults(func=command)


def fail(message: str) -> NoReturn:
    """The one line a failure prints, and exit 2 (the session never opened)."""
    print(f"fleethub tunnel: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` with port 0 allowed (the system picks a free one)."""
    from device_client.hostport import parse_hostport

    host, sep, port = text.strip().rpartition(":")
    if sep and port.strip() == "0":
        return parse_hostport(f"{host}:1")[0], 0
    return parse_hostport(text)


def bind_listener(host: str, port: int) -> socket.socket:
    """The listening socket, bound now (before any session exists); a failure is one line."""
    from .failures import one_line
    from .listener import listening_socket

    try:
        return listening_socket(host, port)
    except socket.gaierror as exc:
        fail(one_line(f"--listen {host}:{port}: {exc.strerror}", "address_refused"))
    except OSError as exc:
        code = "address_in_use" if exc.errno == errno.EADDRINUSE else "address_refused"
        what = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be used ({exc.strerror})"
        fail(one_line(f"--listen {host}:{port} {what}", code))


def take_stdio() -> tuple[int, int]:
    """The ssh stream's fds for the tunnel alone: 0 and 1 are moved aside and /dev/null put in their
    place, so no stray print can corrupt the stream and closing ours reaches ssh as EOF."""
    fd_in, fd_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    return fd_in, fd_out


def run_until_signalled(main: Callable[[], Awaitable[Any]]) -> None:
    """Run ``main`` on a new asyncio loop until it returns or SIGINT, SIGTERM or SIGHUP arrives (ssh
    sends SIGHUP to its ProxyCommand when it exits): the first signal cancels ``main``, which closes
    its session in its own finally; later ones are ignored while it does."""
    import asyncio

    from .closed import exception_handler

    async def runner() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(exception_handler)
        task = asyncio.ensure_future(main())
        signalled: list[int] = []

        def on_signal(signum: int) -> None:
            if not signalled:
                signalled.append(signum)
                task.cancel()

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(signum, on_signal, signum)
        try:
            await task
        except asyncio.CancelledError:
            if not signalled:
                raise
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(signum)

    asyncio.run(runner())


def command(args: argparse.Namespace, run: Callable[[Any], None] | None = None) -> None:
    from .marks import Marks, wanted

    marks = Marks()
    marks.mark("parsed")
    from .client import Credentials, Ready, Summary, TunnelError, run_tunnel
    from .failures import one_line
    from .ice import quiet_ice_logs

    marks.mark("imported")

    hub = args.hub or os.environ.get("FLEETHUB_HUB_URL")
    if not hub:
        fail("no hub: give --hub URL (or FLEETHUB_HUB_URL)")
    if not hub.startswith(("http://", "https://")):
        fail(f"--hub {hub!r} is not a URL; give the hub's base URL, e.g. http://127.0.0.1:8080")
    credentials = Credentials(org_id=args.org or os.environ.get("FLEETHUB_ORG_ID"),
                              pat_id=args.pat_id or os.environ.get("FLEETHUB_PAT_ID"),
                              pat_secret=args.pat_secret or os.environ.get("FLEETHUB_PAT_SECRET"),
                              bearer=os.environ.get("FLEETHUB_TOKEN"))
    if not ((credentials.pat_id and credentials.pat_secret) or credentials.bearer):
        fail(one_line("no credentials", "no_credentials"))
    talk = not args.stdio or args.verbose
    listener = stdio = None
    if args.stdio:
        stdio = take_stdio()
    else:
        try:
            host, port = parse_listen(args.listen)
        except ValueError as exc:
            fail(f"--listen: {exc}; give HOST:PORT, e.g. 127.0.0.1:7022 (port 0: a free one)")
        listener = bind_listener(host, port)

    def ready(r: Ready) -> None:
        where = "stdin/stdout" if args.stdio else f"{r.host}:{r.port}"
        if talk:
            print(f"tunnel ready: {where} -> device {args.device} target {args.target} "
                  f"(session {r.session_id}, connected in {r.seconds_to_connect:.3f}s)",
                  file=sys.stderr if args.stdio else sys.stdout, flush=True)

    summaries: list[Summary] = []
    quiet_ice_logs()
    outcome: list[str] = []
    failure: list[str] = []

    async def main() -> None:
        try:
            outcome.append(await run_tunnel(hub, credentials, args.device, args.target, listener=listener,
                                            stdio=stdio, on_ready=ready, on_summary=summaries.append,
                                            marks=marks))
        except BaseException as exc:  # noqa: BLE001 — reported as one line below
            if isinstance(exc, TunnelError):
                failure.append(one_line(str(exc), exc.code))
            elif isinstance(exc, Exception):
                log.debug("tunnel failed", exc_info=exc)
                failure.append(f"unexpected failure: {type(exc).__name__}: {exc} "
                               "(--log-level DEBUG shows where)")
            else:
                raise  # cancellation (a signal) and KeyboardInterrupt go on as they are

    (run or run_until_signalled)(main)
    marks.mark("closed")
    if args.verbose or wanted():
        print(marks.line(), file=sys.stderr, flush=True)
    if failure:
        fail(failure[0])
    message = outcome[0] if outcome else "stopped"
    if talk:
        totals = f"; {summaries[0].line()}" if summaries else ""
        print(f"tunnel closed: {message}{totals}", file=sys.stderr, flush=True)
    if message not in ("stopped", "done"):
        sys.exit(1)  # the device or the connection ended it, not the user
