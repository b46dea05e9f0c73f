"""``fleethub admin assistant-budget`` and ``fleethub admin staff``: written straight to storage."""

from __future__ import annotations

import argparse
import datetime as dt
import uuid

from hub.assistant.budget import DEFAULT_SOFT_PERCENT

COMMANDS = ("assistant-budget", "staff")


def add_parsers(asub) -> None:
    a = asub.add_parser("assistant-budget", help="an organisation's monthly assistant token budget")
    a.add_argument("org", help="organisation id")
    a.add_argument("--monthly-tokens", type=int, required=True, help="tokens the organisation may use a month")
    a.add_argument("--soft-percent", type=int, default=DEFAULT_SOFT_PERCENT,
                   help="the soft limit, as percent of the budget (default 80)")
    a = asub.add_parser("staff", help="the operator (staff) flag of a user: staff see the assistant's cost")
    a.add_argument("email", help="the user's email")
    flag = a.add_mutually_exclusive_group(required=True)
    flag.add_argument("--on", dest="on", action="store_true", help="make the user staff")
    flag.add_argument("--off", dest="on", action="store_false", help="make the user an ordinary user")


async def run(s, args: argparse.Namespace, now: dt.datetime) -> dict:
    # here, not at the top: `fleethub admin --help` builds add_parsers() on a device too, where asyncpg is not
    # installed (hub/cli.py then says which extra the command needs)
    from storage.assistant import AssistantStore

    store = AssistantStore(s.db)
    if args.admin_command == "assistant-budget":
        if args.monthly_tokens < 0 or not 1 <= args.soft_percent <= 100:
            raise SystemExit("--monthly-tokens must be >= 0 and --soft-percent within 1..100")
        org_id = uuid.UUID(args.org)
        if not await store.set_budget(org_id, args.monthly_tokens, args.soft_percent, now):
            raise SystemExit(f"no organisation {org_id}")
        return {"org_id": str(org_id), "monthly_tokens": args.monthly_tokens, "soft_percent": args.soft_percent}
    user = await store.set_staff(args.email, args.on)
    if user is None:
        raise SystemExit(f"no user {args.email}")
    await s.invalidate(f"user:{user['id']}")  # sessions and PATs cache the flag; running hubs forget it now
    return {"id": str(user["id"]), "email": user["email"], "is_staff": user["is_staff"]}
