"""Feature entitlements: telemetry, signature_policy, usb_policy, audit_log. Pure.

Each feature's state is its newest recorded change (billing_feature_states), or its default when
none was ever recorded:

    telemetry         off   self-serve: billing admins switch it with PUT /v1/billing/features/telemetry
    signature_policy  on for enterprise accounts   set by the operator (fleethub admin feature)
    usb_policy        on for enterprise accounts   set by the operator
    audit_log         on    set by the operator; off makes GET /v1/audit-events answer 403
                            feature_disabled (events are still recorded, only reading is gated)

Telemetry starts off because it is a paid, opt-in feature: agents send telemetry events only while
it is on. audit_log starts on because reading one's own audit log is part of every account; an
operator may turn it off (e.g. an enterprise contract that moves audit to the customer's SIEM).
"""

from __future__ import annotations

import datetime as dt

from hub.billing.catalogue import FEATURES
from hub.billing.periods import Days

SELF_SERVE = frozenset({"telemetry"})
UTC = dt.UTC


def default(feature: str, enterprise: bool) -> bool:
    if feature in ("signature_policy", "usb_policy"):
        return enterprise
    return feature == "audit_log"


def current(feature: str, latest: dict[str, bool], enterprise: bool) -> bool:
    return latest[feature] if feature in latest else default(feature, enterprise)


def view(latest: dict[str, bool], enterprise: bool) -> dict[str, dict]:
    """Every feature, always: {feature: {enabled, self_serve, enterprise}}."""
    return {f: {"enabled": current(f, latest, enterprise), "self_serve": f in SELF_SERVE, "enterprise": enterprise}
            for f in FEATURES}


def enabled_days(changes: list[tuple[dt.datetime, bool]], initial: bool, days: Days) -> list[dt.date]:
    """Days of ``days`` on which the feature was on at any moment. ``changes``: (changed_at,
    enabled) in time order; ``initial``: the state before the first change."""
    out = []
    state, i = initial, 0
    for day in days.days():
        start = dt.datetime.combine(day, dt.time(), UTC)
        end = start + dt.timedelta(days=1)
        while i < len(changes) and changes[i][0] <= start:
            state = changes[i][1]
            i += 1
        on = state
        j = i
        while j < len(changes) and changes[j][0] < end:
            on = on or changes[j][1]
            j += 1
        if on:
            out.append(day)
    return out
