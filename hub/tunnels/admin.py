"""``fleethub admin tunnel-entitle``: an organisation's tunnel entitlement, written straight to storage.

    tunnel-entitle ORG [--enabled|--disabled] [--relay|--no-relay] [--max-sessions N]
                       [--max-sessions-per-device N] [--bandwidth-bps N] [--max-session-seconds N]
                       [--default LIMIT ...]

Options not given keep their stored value; ``--default max_sessions`` (repeatable) puts a limit back
to the deployment default (hub/tunnels/limits.py). A running hub reads the entitlement on every
open and renew, so the change applies to the next one. Prints the entitlement with defaults applied.
"""

from __future__ import annotations

import argparse
import datetime as dt
import uuid

from hub.tunnels.limits import DEFAULTS, Entitlement

COMMANDS = frozenset({"tunnel-entitle"})


def add_parsers(asub) -> None:
    a = asub.add_parser("tunnel-entitle", help="set an organisation's tunnel entitlement and limits")
    a.add_argument("org", help="organisation id")
    a.add_argument("--enabled", dest="enabled", action="store_true", default=None,
                   help="the organisation may open tunnels")
    a.add_argument("--disabled", dest="enabled", action="store_false", help="it may not")
    a.add_argument("--relay", dest="relay_allowed", action=argparse.BooleanOptionalAction, default=None,
                   help="may sessions use the TURN relay")
    for name in DEFAULTS:
        a.add_argument("--" + name.replace("_", "-"), dest=name, type=_positive, default=None,
                       help=f"{LIMITS[name]} (deployment default {DEFAULTS[name]})")
    a.add_argument("--default", dest="defaults", action="append", choices=sorted(DEFAULTS), default=[],
                   help="put this limit back to the deployment default")


LIMITS = {"max_sessions": "open sessions in the organisation",
          "max_sessions_per_device": "open sessions on one device",
          "bandwidth_bps": "bytes per second one session may carry, each direction",
          "max_session_seconds": "seconds one session may last, renewals included"}


def _positive(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


async def run(s, args: argparse.Namespace, now: dt.datetime) -> dict:
    try:
        org_id = uuid.UUID(args.org)
    except ValueError:
        raise SystemExit(f"not an organisation id: {args.org!r}") from None
    if await s.stores.orgs.get_org(org_id) is None:
        raise SystemExit(f"no organisation {org_id}")
    changes = {name: getattr(args, name) for name in ("enabled", "relay_allowed", *DEFAULTS)
               if getattr(args, name) is not None}
    changes.update({name: None for name in args.defaults})
    row = await s.tunnels.store.set_entitlement(org_id, changes, now)
    return {"org_id": str(org_id), **Entitlement.of(row).view()}
