"""Billing endpoints (spec: Billing and registry fallback): pricing, usage, feature entitlements,
tunnel usage and the registry-fallback overview. Field names are snake_case (DESIGN.md section 12).

Who may call: billing_viewer on the organisation for every read, billing_admin for PUT features
(org admins hold both). The tunnel usage endpoints take Bearer tokens only (a service account's
access token or a tunnel token): a PAT, in either header form, or a dashboard session gets 401
bearer_required. See docs/billing.md for every decision.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from decimal import ROUND_HALF_UP, Decimal

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from quart import Blueprint, g
from quart_schema import document_request, security_scheme

from device_client.shared.clock import rfc3339
from hub.api.common import errors, jsonable, org, services
from hub.api.validation import parse_body, path_values, query, responds
from hub.auth.authz import require_org
from hub.billing import catalogue, periods, state
from hub.billing.devices import push_telemetry_in_background
from hub.billing.features import SELF_SERVE, default, enabled_days
from hub.billing.pricing import PriceBook, price_usage
from hub.errors import BadRequest, Conflict, NotFound, Unauthenticated, Unavailable
from hub.instants import check_instant
from hub.tunnels.auth import also_tunnel_token

bp = Blueprint("billing", __name__, url_prefix="/v1/billing")

UTC = dt.UTC


class UsageQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    from_: str | None = Field(None, alias="from", max_length=64)
    to: str | None = Field(None, max_length=64)


class RegistryQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    start: str | None = Field(None, max_length=64)
    end: str | None = Field(None, max_length=64)


class TunnelUsageQuery(UsageQuery):
    pass


class TunnelRecordsQuery(UsageQuery):
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = Field(None, max_length=512)


class FeatureBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: StrictBool


class Envelope(BaseModel):
    data: dict


def _money(amount: Decimal | None) -> float | None:
    return None if amount is None else float(amount)


def _number(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


# Billed quantities are exact fractions (4 device-days of a 30-day month: 0.1333…); the answer gives
# them to a millionth of a unit, the cost is still computed from the exact value.
BILLED_PLACES = Decimal("0.000001")


def _billed(value: Decimal) -> int | float:
    return _number(value.quantize(BILLED_PLACES, rounding=ROUND_HALF_UP))


def _today(s) -> dt.date:
    return s.clock.now().astimezone(UTC).date()


def parse_period(parse, *args):
    """``parse(*args)`` from hub/billing/periods, its InvalidPeriod as 400 invalid_period (the billing
    routes and the console's usage charts)."""
    try:
        return parse(*args)
    except periods.InvalidPeriod as exc:
        raise BadRequest(str(exc), code="invalid_period") from None


async def billing_profile(s) -> dict:
    """The signed-in organisation's billing profile, or 404 billing_profile_not_found."""
    profile = (await state.org_billing(s, org().org_id)).profile
    if profile is None:
        raise NotFound("this organisation has no billing profile", code="billing_profile_not_found")
    return profile


@bp.get("/pricing")
@responds(Envelope)
@errors(401, 403, 404)
async def get_pricing():
    s = services()
    await require_org(s, "billing_viewer")
    profile = await billing_profile(s)
    today = _today(s)
    book = PriceBook(await s.stores.billing.prices(org().org_id), org().org_id)
    products = []
    for p in catalogue.PRODUCTS:
        price = book.describe(p.key, today)
        products.append({"product": p.key, "unit": p.unit, "description": p.description,
                         "unit_price": _money(price["unit_price"]), "source": price["source"],
                         "effective_from": price["effective_from"] and price["effective_from"].isoformat()})
    return {"data": {"currency": catalogue.CURRENCY, "as_of": today.isoformat(), "plan": profile["plan"],
                     "enterprise": profile["enterprise"], "locked": profile["locked"], "products": products}}


async def _feature_days(s, org_id: uuid.UUID, days: periods.Days, enterprise: bool) -> dict:
    """Paid features as products: quantity 1 on each day the feature was on at any moment — of the
    days the organisation existed up to today: a feature on by default is not billed for the days of
    the period before the organisation was created, nor for days still to come."""
    created = (await s.stores.orgs.get_org(org_id))["created_at"].astimezone(UTC).date()
    lived = periods.Days(max(days.start, created), min(days.end, _today(s) + periods.DAY))
    if lived.count <= 0:
        return {f"feature_{f}": {} for f in catalogue.FEATURES}
    until = dt.datetime.combine(lived.end, dt.time(), UTC)
    history = await s.stores.billing.feature_history(org_id, until)
    out = {}
    for f in catalogue.FEATURES:
        on = enabled_days(history.get(f, []), default(f, enterprise), lived)
        out[f"feature_{f}"] = {d: Decimal(1) for d in on}
    return out


@bp.get("/usage")
@query(UsageQuery)
@responds(Envelope)
@errors(400, 401, 403, 404)
async def get_usage(query_args: UsageQuery):
    s = services()
    await require_org(s, "billing_viewer")
    profile = await billing_profile(s)
    org_id = org().org_id
    days = parse_period(periods.usage_days, query_args.from_, query_args.to, s.clock.now(), profile["anchor_day"])
    await s.meter.flush()  # counts still in the batch belong in what the caller reads
    daily = await s.stores.billing.usage(org_id, days.start, days.end)
    daily.update(await _feature_days(s, org_id, days, profile["enterprise"]))
    book = PriceBook(await s.stores.billing.prices(org_id), org_id)
    lines, total = price_usage(daily, book)
    products = []
    for line in lines:
        p = catalogue.product(line.product)
        segments = [{"from": d.isoformat(), "unit_price": _money(book.price(p.key, d))}
                    for d in [days.start, *book.changes(p.key, days.start, days.end)]]
        cost = line.cost
        products.append({"product": p.key, "unit": p.unit, "quantity": _number(line.quantity),
                         "quantity_unit": p.metered_unit, "billed_quantity": _billed(line.billed),
                         "cost": _money(cost),
                         "cost_cents": None if cost is None else int(cost * 100),
                         "unpriced_quantity": _number(line.unpriced_quantity), "prices": segments})
    return {"data": {"from": days.start.isoformat(), "to": (days.end - periods.DAY).isoformat(),
                     "end_exclusive": days.end.isoformat(), "days": days.count,
                     "currency": catalogue.CURRENCY, "locked": profile["locked"], "products": products,
                     "total": float(total), "total_cents": int(total * 100)}}


@bp.get("/features")
@responds(Envelope)
@errors(401, 403)
async def get_features():
    s = services()
    await require_org(s, "billing_viewer")
    return {"data": (await state.org_billing(s, org().org_id)).view()}


@bp.put("/features/<feature>")
# The spec's path enum: the three it names (audit_log is a feature too, but no more self-serve).
@path_values(feature=("telemetry", "signature_policy", "usb_policy"))
@document_request(FeatureBody)
@responds(Envelope)
@errors(400, 401, 403, 409)
async def put_feature(feature: str):
    s = services()
    await require_org(s, "billing_admin")
    if feature not in catalogue.FEATURES:
        raise BadRequest(f"unknown feature {feature!r}; features: {', '.join(catalogue.FEATURES)}",
                         code="unknown_feature")
    if feature not in SELF_SERVE:
        raise BadRequest(f"{feature} is not self-serve; it is part of the enterprise contract",
                         code="feature_not_self_serve")
    data = await parse_body(FeatureBody)
    org_id = org().org_id
    current = await state.org_billing(s, org_id)
    if current.profile is None:
        raise Conflict("this organisation has no billing profile", code="no_billing_profile")
    await state.ensure_not_locked(s, org_id)
    if current.enabled(feature) != data.enabled:
        await s.stores.billing.record_feature(org_id, feature, data.enabled, "self_serve", s.clock.now())
        await state.changed(s, org_id)
        g.audit_details = {"feature": feature, "enabled": data.enabled}
        if feature == "telemetry":
            s.spawn(push_telemetry_in_background, s, org_id, data.enabled, name="telemetry push")
    return {"data": (await state.org_billing(s, org_id)).view()}


# ---- tunnel usage -------------------------------------------------------------------------------
# Bearer rows of the spec: a service account's token (or a PAT secret sent as Bearer, refused below
# with 401 bearer_required), or a tunnel token.
BEARER_SCHEMES = [{"BearerAuth": []}, {"TunnelToken": []}]


def _bearer_only() -> None:
    if g.principal.via in ("pat", "bearer", "session"):
        exc = Unauthenticated("this endpoint takes a Bearer token (a service account's access token or a "
                              "tunnel token), not a personal API token or a session", code="bearer_required")
        exc.headers["WWW-Authenticate"] = "Bearer"
        raise exc


async def _tunnel_checks(s) -> None:
    _bearer_only()
    await require_org(s, "billing_viewer")
    if not getattr(s.settings, "tunnels_enabled", True):
        raise Unavailable("tunnelling is not available on this deployment", code="tunnels_unavailable")


@bp.get("/tunnel/usage")
@also_tunnel_token
@security_scheme(BEARER_SCHEMES)
@query(TunnelUsageQuery)
@responds(Envelope)
@errors(400, 401, 403, 503)
async def get_tunnel_usage(query_args: TunnelUsageQuery):
    s = services()
    await _tunnel_checks(s)
    since, until = parse_period(periods.tunnel_window, query_args.from_, query_args.to, s.clock.now())
    row = await s.stores.billing.tunnel_summary(org().org_id, since, until)
    seconds = Decimal(row["duration_seconds"])
    return {"data": {"from": rfc3339(since), "to": rfc3339(until), "sessions": row["sessions"],
                     "open_sessions": row["open_sessions"], "devices": row["devices"],
                     "duration_seconds": float(seconds), "minutes": float(seconds / 60),
                     "bytes_in": row["bytes_in"], "bytes_out": row["bytes_out"],
                     "bytes_total": row["bytes_in"] + row["bytes_out"], "relayed_bytes": row["relayed_bytes"]}}


def _encode_cursor(opened_at: dt.datetime, sid: uuid.UUID) -> str:
    raw = json.dumps({"o": opened_at.astimezone(UTC).isoformat(), "i": str(sid)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        # in range and aware (hub/instants.py): 0001-01-01T00:00:00+01:00 overflowed in storage
        opened_at = check_instant(dt.datetime.fromisoformat(raw["o"]))
        return opened_at, uuid.UUID(raw["i"])
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error, UnicodeDecodeError):
        raise BadRequest("cursor: not a cursor this endpoint returned", code="invalid_cursor") from None


def _record(r: dict) -> dict:
    seconds = Decimal(r["duration_seconds"])
    return jsonable({**r, "duration_seconds": float(seconds), "minutes": float(seconds / 60)})


@bp.get("/tunnel/usage/records")
@also_tunnel_token
@security_scheme(BEARER_SCHEMES)
@query(TunnelRecordsQuery)
@responds(Envelope)
@errors(400, 401, 403, 503)
async def get_tunnel_records(query_args: TunnelRecordsQuery):
    s = services()
    await _tunnel_checks(s)
    q = query_args
    since, until = parse_period(periods.tunnel_window, q.from_, q.to, s.clock.now())
    after = _decode_cursor(q.cursor) if q.cursor else None
    rows = await s.stores.billing.tunnel_records(org().org_id, since, until, after, q.limit + 1)
    more = len(rows) > q.limit
    rows = rows[:q.limit]
    cursor = _encode_cursor(rows[-1]["opened_at"], rows[-1]["id"]) if more else None
    return {"data": {"from": rfc3339(since), "to": rfc3339(until), "limit": q.limit,
                     "records": [_record(r) for r in rows], "next_cursor": cursor}}


# ---- registry fallback --------------------------------------------------------------------------

@bp.get("/registry-fallback")
@query(RegistryQuery)
@responds(Envelope)
@errors(400, 401, 403)
async def get_registry_fallback(query_args: RegistryQuery):
    s = services()
    await require_org(s, "billing_viewer")
    days = parse_period(periods.registry_days, query_args.start, query_args.end, s.clock.now())
    await s.meter.flush()
    fleets, usage = await s.stores.billing.registry_fallback(org().org_id, days.start, days.end)
    by_key: dict[str, int] = {}
    by_day: dict[dt.date, int] = {}
    for u in usage:
        n = int(u["quantity"])
        by_key[u["key"]] = by_key.get(u["key"], 0) + n
        by_day[u["day"]] = by_day.get(u["day"], 0) + n
    listed = [{"fleet_id": str(f["id"]), "name": f["name"], "registry_proxy": f["registry_proxy"],
               "registry_proxy_mode": f["registry_proxy_mode"], "bytes": by_key.get(str(f["id"]), 0)}
              for f in fleets]
    listed.sort(key=lambda f: (not f["registry_proxy"], -f["bytes"], f["name"], f["fleet_id"]))
    known = {str(f["id"]) for f in fleets}
    total = sum(by_key.values())
    return {"data": {
        "start": days.start.isoformat(), "end": days.end.isoformat(),
        "fleets": listed,
        "totals": {"bytes": total, "fleets": len(fleets),
                   "fleets_with_proxy": sum(1 for f in fleets if f["registry_proxy"]),
                   # devices without a fleet, and fleets deleted since, still carried data
                   "unattributed_bytes": sum(n for k, n in by_key.items() if k not in known)},
        "daily": [{"day": d.isoformat(), "bytes": by_day.get(d, 0)} for d in days.days()]}}
