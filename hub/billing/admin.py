"""``fleethub admin`` billing commands: profiles, prices and operator-set features, written straight
to storage. A running hub sees profile and feature changes once the change's NOTIFY reaches it
(announced with Services.invalidate; milliseconds); prices are read on every billing request.

    billing-profile ORG --plan P [--enterprise|--no-enterprise] [--anchor-day N] [--locked|--unlocked]
    billing-profiles                                   list every profile
    price PRODUCT AMOUNT [--org ORG] [--from DATE]     list price, or ORG's override, from DATE (default today, UTC)
    prices [--org ORG]                                 the price rows (list prices and overrides)
    feature ORG FEATURE --on|--off                     operator switch of any feature
"""

from __future__ import annotations

import argparse
import datetime as dt
import uuid
from decimal import Decimal, InvalidOperation

from hub.billing import state
from hub.billing.catalogue import BY_KEY, FEATURES

COMMANDS = frozenset({"billing-profile", "billing-profiles", "price", "prices", "feature"})


def add_parsers(asub) -> None:
    a = asub.add_parser("billing-profile", help="create or change an organisation's billing profile")
    a.add_argument("org", help="organisation id")
    a.add_argument("--plan", help="plan name (required when creating)")
    a.add_argument("--enterprise", action=argparse.BooleanOptionalAction, default=None,
                   help="an enterprise account or not")
    a.add_argument("--anchor-day", type=int, default=None, help="billing period start day, 1 to 28")
    a.add_argument("--locked", dest="locked", action="store_true", default=None,
                   help="lock the account until it is settled: feature entitlements cannot change "
                        "(docs/billing.md)")
    a.add_argument("--unlocked", dest="locked", action="store_false", help="undo --locked")
    asub.add_parser("billing-profiles", help="list billing profiles")
    a = asub.add_parser("price", help="set a product's list price, or an organisation's override")
    a.add_argument("product", choices=sorted(BY_KEY), help="the metered product")
    a.add_argument("amount", help="price per the product's unit, e.g. 0.25")
    a.add_argument("--org", help="organisation id: an override for that organisation")
    a.add_argument("--from", dest="effective_from", help="first UTC day the price applies (YYYY-MM-DD)")
    a = asub.add_parser("prices", help="list price rows")
    a.add_argument("--org", help="only list prices and this organisation's overrides")
    a = asub.add_parser("feature", help="switch a feature entitlement for an organisation (operator)")
    a.add_argument("org", help="organisation id")
    a.add_argument("feature", choices=FEATURES, help="the feature to switch")
    on = a.add_mutually_exclusive_group(required=True)
    on.add_argument("--on", dest="enabled", action="store_true", help="entitle the organisation")
    on.add_argument("--off", dest="enabled", action="store_false", help="withdraw the entitlement")


def _org(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise SystemExit(f"not an organisation id: {raw!r}") from None


def _profile_json(p: dict) -> dict:
    return {"org_id": str(p["org_id"]), "plan": p["plan"], "enterprise": p["enterprise"],
            "anchor_day": p["anchor_day"], "locked": p["locked"], "updated_at": p["updated_at"].isoformat()}


async def run(s, args: argparse.Namespace, now: dt.datetime) -> dict:
    cmd = args.admin_command
    if cmd == "billing-profile":
        org_id = _org(args.org)
        if await s.stores.orgs.get_org(org_id) is None:
            raise SystemExit(f"no organisation {org_id}")
        if args.anchor_day is not None and not 1 <= args.anchor_day <= 28:
            raise SystemExit("--anchor-day must be 1 to 28 (every month has the day)")
        try:
            profile = await s.stores.billing.put_profile(org_id, now, plan=args.plan, enterprise=args.enterprise,
                                                  anchor_day=args.anchor_day, locked=args.locked,
                                                  log_events=s.settings.event_log)
        except ValueError as exc:
            raise SystemExit(f"{exc} (--plan)") from None
        await state.changed(s, org_id)
        return _profile_json(profile)
    if cmd == "billing-profiles":
        return {"profiles": [_profile_json(p) for p in await s.stores.billing.profiles()]}
    if cmd == "price":
        try:
            amount = Decimal(args.amount)
        except InvalidOperation:
            raise SystemExit(f"not an amount: {args.amount!r}") from None
        if not amount.is_finite() or amount < 0:
            raise SystemExit("the amount must be a non-negative number")
        org_id = _org(args.org) if args.org else None
        if org_id is not None and await s.stores.orgs.get_org(org_id) is None:
            raise SystemExit(f"no organisation {org_id}")
        try:
            day = dt.date.fromisoformat(args.effective_from) if args.effective_from else now.date()
        except ValueError:
            raise SystemExit("--from must be YYYY-MM-DD") from None
        row = await s.stores.billing.set_price(args.product, org_id, day, amount, now)
        return {"product": row["product"], "org_id": str(org_id) if org_id else None,
                "effective_from": day.isoformat(), "unit_price": str(row["unit_price"]),
                "unit": BY_KEY[args.product].unit}
    if cmd == "prices":
        org_id = _org(args.org) if args.org else None
        rows = await (s.stores.billing.prices(org_id) if org_id else s.stores.billing.all_prices())
        return {"prices": [{"product": r["product"], "org_id": str(r["org_id"]) if r["org_id"] else None,
                            "effective_from": r["effective_from"].isoformat(), "unit_price": str(r["unit_price"])}
                           for r in rows]}
    if cmd == "feature":
        org_id = _org(args.org)
        if await s.stores.orgs.get_org(org_id) is None:
            raise SystemExit(f"no organisation {org_id}")
        await s.stores.billing.record_feature(org_id, args.feature, args.enabled, "operator", now)
        await state.changed(s, org_id)
        view = (await state.org_billing(s, org_id)).view()
        return {"org_id": str(org_id), "feature": args.feature, **view[args.feature]}
    raise SystemExit(f"unknown billing command {cmd}")
