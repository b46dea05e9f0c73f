"""Usage over time for the console's billing page: one value per day and product.

``GET /v1/billing/usage`` answers the spec's totals for a period; an operator also wants to see how
devices, tunnel minutes and bytes and registry fallback moved day by day. This reads the same daily
rows the totals are summed from (storage/billing.py ``usage``: ``usage_daily`` and
``device_active_days``), over the last ``DEFAULT_DAYS`` days unless ``from``/``to`` say otherwise (the
spec's rules and limits for those, hub/billing/periods.py), and needs what the totals need: the
billing_viewer relation and a billing profile.
"""

from __future__ import annotations

import datetime as dt

from quart import Blueprint
from quart_schema import hide

from hub.api.billing import UsageQuery, billing_profile, parse_period
from hub.api.common import errors, org, services
from hub.api.validation import query
from hub.auth.authz import require_org
from hub.billing import catalogue, periods

bp = Blueprint("console_usage", __name__)

DEFAULT_DAYS = 30
# What the page charts, in this order: the products an operator watches day by day.
CHARTED = ("active_device", "tunnel_minutes", "tunnel_bytes", "tunnel_relayed_bytes", "registry_fallback_bytes")
METERED_UNITS = {"active_device": "devices", "tunnel_minutes": "minutes", "tunnel_bytes": "bytes",
                 "tunnel_relayed_bytes": "bytes", "registry_fallback_bytes": "bytes"}


@bp.get("/console/api/usage-daily")
@hide
@query(UsageQuery)
@errors(400, 401, 403, 404)
async def usage_daily(query_args: UsageQuery):
    s = services()
    await require_org(s, "billing_viewer")
    await billing_profile(s)  # 404 billing_profile_not_found, as the totals answer
    now = s.clock.now()
    from_, to = query_args.from_, query_args.to
    if from_ is None and to is None:
        today = now.astimezone(dt.timezone.utc).date()
        from_, to = (today - dt.timedelta(days=DEFAULT_DAYS - 1)).isoformat(), today.isoformat()
    days = parse_period(periods.usage_days, from_, to, now)
    await s.meter.flush()  # counts still in the batch belong in what the caller reads
    daily = await s.stores.billing.usage(org().org_id, days.start, days.end)
    dates = [days.start + dt.timedelta(days=i) for i in range((days.end - days.start).days)]
    series = []
    for key in CHARTED:
        product = catalogue.product(key)
        per_day = daily.get(key, {})
        values = [float(per_day.get(d, 0)) for d in dates]
        # what was metered each day, not the billed unit (device_month, GB): the page formats bytes itself
        series.append({"product": key, "unit": METERED_UNITS[key],
                       "description": product.description, "values": values, "total": sum(values)})
    return {"data": {"from": days.start.isoformat(), "to": (days.end - periods.DAY).isoformat(),
                     "days": [d.isoformat() for d in dates], "series": series}}
