"""``fleethub tunnel --hub URL --device ID --target NAME --listen 127.0.0.1:PORT``.

Credentials as for the other commands that call the hub: ``--pat-id``/``--pat-secret`` (or
FLEETHUB_PAT_ID / FLEETHUB_PAT_SECRET, which keep the secret out of ``ps``), or a bearer token in
FLEETHUB_TOKEN; the organisation with ``--org`` or FLEETHUB_ORG_ID. Prints one line when the
listener is up, runs until Ctrl-C (exit 0) or until the device or the connection ends the session
(exit 1), and deletes the session on the hub on the way out. Exit 2: the session never opened.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Callable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hub", required=True, help="hub base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--device", required=True, help="device id")
    parser.add_argument("--target", required=True, help="a target the device offers (e.g. ssh) or a port it allows")
    parser.add_argument("--listen", default="127.0.0.1:0", help="local HOST:PORT to listen on (default 127.0.0.1:0)")
    parser.add_argument("--org", default=None, help="organisation id (default $FLEETHUB_ORG_ID)")
    parser.add_argument("--pat-id", default=None, help="PAT id (default $FLEETHUB_PAT_ID)")
    parser.add_argument("--pat-secret", default=None,
                        help="PAT secret (visible in ps; prefer $FLEETHUB_PAT_SECRET)")
    parser.set_defaults(func=command)


def command(args: argparse.Namespace, run: Callable[[Any], None] | None = None) -> None:
    from device_client.tunnel import parse_hostport

    from .client import Credentials, Ready, TunnelError, run_tunnel

    try:
        listen = parse_hostport(args.listen)
    except ValueError as exc:
        raise SystemExit(f"--listen: {exc}") from None
    credentials = Credentials(org_id=args.org or os.environ.get("FLEETHUB_ORG_ID"),
                              pat_id=args.pat_id or os.environ.get("FLEETHUB_PAT_ID"),
                              pat_secret=args.pat_secret or os.environ.get("FLEETHUB_PAT_SECRET"),
                              bearer=os.environ.get("FLEETHUB_TOKEN"))
    if not ((credentials.pat_id and credentials.pat_secret) or credentials.bearer):
        raise SystemExit("fleethub tunnel needs --pat-id and --pat-secret (or FLEETHUB_PAT_ID and "
                         "FLEETHUB_PAT_SECRET), or FLEETHUB_TOKEN")

    def ready(r: Ready) -> None:
        print(f"tunnel ready: {r.host}:{r.port} -> device {args.device} target {args.target} "
              f"(session {r.session_id}, connected in {r.seconds_to_connect:.3f}s)", flush=True)

    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # every ICE check and HTTP request at INFO drowns the one line a user looks for
        for noisy in ("aioice", "aiortc", "httpx"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    outcome: list[str] = []

    async def main() -> None:
        try:
            outcome.append(await run_tunnel(args.hub, credentials, args.device, args.target,
                                            listen=listen, on_ready=ready))
        except TunnelError as exc:
            outcome.append(f"error: {exc}")

    if run is None:
        from hub.cli import _run as run
    run(main)
    message = outcome[0] if outcome else "stopped"
    print(f"tunnel closed: {message}", file=sys.stderr, flush=True)
    if message.startswith("error:"):
        sys.exit(2)  # never connected: the hub or the device refused, or no ICE path
    if message != "stopped":
        sys.exit(1)  # the device or the connection ended it, not the user
