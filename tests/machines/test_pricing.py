"""Pure billing arithmetic: prices in effect per day, invoice rounding, monthly proration, periods."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pytest

from hub.billing import features, periods
from hub.billing.periods import Days, InvalidPeriod
from hub.billing.pricing import PriceBook, price_usage, to_cents

ORG = uuid.uuid4()
OTHER = uuid.uuid4()
D = dt.date
UTC = dt.UTC


def price(product, amount, day, org=None):
    return {"product": product, "org_id": org, "effective_from": day, "unit_price": Decimal(amount)}


def line(lines, product):
    return next(x for x in lines if x.product == product)


def test_the_price_in_effect_is_the_latest_on_or_before_the_day_override_first():
    book = PriceBook([price("tunnel_minutes", "0.10", D(2026, 1, 1)),
                      price("tunnel_minutes", "0.12", D(2026, 11, 16)),
                      price("tunnel_minutes", "0.05", D(2026, 11, 20), ORG),
                      price("tunnel_minutes", "0.01", D(2026, 11, 1), OTHER)], ORG)
    assert book.price("tunnel_minutes", D(2025, 12, 31)) is None
    assert book.price("tunnel_minutes", D(2026, 11, 15)) == Decimal("0.10")
    assert book.price("tunnel_minutes", D(2026, 11, 16)) == Decimal("0.12")
    assert book.price("tunnel_minutes", D(2026, 11, 20)) == Decimal("0.05")  # this org's override
    assert book.describe("tunnel_minutes", D(2026, 11, 21))["source"] == "override"
    assert book.price("tunnel_bytes", D(2026, 11, 21)) is None
    assert book.changes("tunnel_minutes", D(2026, 11, 1), D(2026, 12, 1)) == [D(2026, 11, 16), D(2026, 11, 20)]


def test_a_price_change_mid_period_prices_each_day_at_its_own_price():
    book = PriceBook([price("tunnel_minutes", "0.10", D(2026, 1, 1)),
                      price("tunnel_minutes", "0.25", D(2026, 11, 16))], ORG)
    daily = {"tunnel_minutes": {D(2026, 11, 15): Decimal(100), D(2026, 11, 16): Decimal(40)}}
    lines, total = price_usage(daily, book)
    m = line(lines, "tunnel_minutes")
    assert m.quantity == 140
    assert m.cost == Decimal("20.00")  # 100 × 0.10 + 40 × 0.25
    assert total == Decimal("20.00")


def test_rounding_is_once_per_line_half_up_and_the_total_adds_the_lines():
    book = PriceBook([price("tunnel_bytes", "0.125", D(2026, 1, 1)),
                      price("registry_fallback_bytes", "0.125", D(2026, 1, 1))], ORG)
    # 1 GB at 0.125 = 0.125 → 0.13 (half up); per-day rounding would have made 2 × 0.0625 → 0.12
    daily = {"tunnel_bytes": {D(2026, 11, 1): Decimal(500_000_000), D(2026, 11, 2): Decimal(500_000_000)},
             "registry_fallback_bytes": {D(2026, 11, 1): Decimal(10**9)}}
    lines, total = price_usage(daily, book)
    assert line(lines, "tunnel_bytes").cost == Decimal("0.13")
    assert line(lines, "tunnel_bytes").billed == Decimal(1)
    assert total == Decimal("0.26")
    assert to_cents(Decimal("0.005")) == Decimal("0.01")
    assert to_cents(Decimal("0.0049")) == Decimal("0.00")


def test_active_devices_are_prorated_per_day_of_each_month_across_a_month_boundary():
    book = PriceBook([price("active_device", "3.00", D(2026, 1, 1))], ORG)
    whole_november = {D(2026, 11, d): Decimal(1) for d in range(1, 31)}
    lines, _ = price_usage({"active_device": whole_november}, book)
    assert line(lines, "active_device").cost == Decimal("3.00")  # a whole month is the monthly price
    # 2 devices Nov 20..30 (11 of 30 days), 1 device Dec 1..10 (10 of 31 days)
    daily = {D(2026, 11, d): Decimal(2) for d in range(20, 31)}
    daily.update({D(2026, 12, d): Decimal(1) for d in range(1, 11)})
    lines, total = price_usage({"active_device": daily}, book)
    exact = 2 * Decimal(3) * 11 / 30 + Decimal(3) * 10 / 31  # 2.2 + 0.967741… = 3.167741…
    assert line(lines, "active_device").cost == Decimal("3.17") == to_cents(exact)
    assert line(lines, "active_device").quantity == 32  # device-days
    assert total == Decimal("3.17")


def test_usage_without_any_price_has_no_cost_and_nothing_metered_costs_zero():
    lines, total = price_usage({"tunnel_minutes": {D(2026, 11, 1): Decimal(5)}}, PriceBook([], ORG))
    assert line(lines, "tunnel_minutes").cost is None
    assert line(lines, "tunnel_minutes").unpriced_quantity == 5
    assert line(lines, "tunnel_bytes").cost == Decimal("0.00")
    assert total == Decimal("0.00")


def test_billing_period_follows_the_anchor_day():
    now = dt.datetime(2026, 11, 22, 6, 0, tzinfo=UTC)
    assert periods.billing_period(now) == Days(D(2026, 11, 1), D(2026, 12, 1))
    assert periods.billing_period(now, 15) == Days(D(2026, 11, 15), D(2026, 12, 15))
    assert periods.billing_period(now, 28) == Days(D(2026, 10, 28), D(2026, 11, 28))
    jan = dt.datetime(2027, 1, 3, tzinfo=UTC)
    assert periods.billing_period(jan, 10) == Days(D(2026, 12, 10), D(2027, 1, 10))
    assert periods.billing_period(dt.datetime(2026, 12, 31, tzinfo=UTC)) == Days(D(2026, 12, 1), D(2027, 1, 1))


def test_usage_range_rules():
    now = dt.datetime(2026, 11, 22, 6, 0, tzinfo=UTC)
    assert periods.usage_days(None, None, now) == Days(D(2026, 11, 1), D(2026, 12, 1))
    # a bare to date includes that whole day
    assert periods.usage_days("2026-11-01", "2026-11-15", now) == Days(D(2026, 11, 1), D(2026, 11, 16))
    # an RFC 3339 to is an exclusive instant: midnight ends the day before, a later instant includes its day
    assert periods.usage_days("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", now).end == D(2026, 12, 1)
    assert periods.usage_days("2026-11-01T10:00:00+02:00", "2026-11-03T00:00:01Z", now) == \
        Days(D(2026, 11, 1), D(2026, 11, 4))
    assert periods.usage_days("2026-11-10", None, now) == Days(D(2026, 11, 10), D(2026, 12, 1))
    assert periods.usage_days("2026-01-01", "2027-02-04", now).count == 400
    with pytest.raises(InvalidPeriod):
        periods.usage_days("2026-01-01", "2027-02-05", now)  # 401 days
    with pytest.raises(InvalidPeriod):
        periods.usage_days("2026-11-10", "2026-11-09", now)
    for bad in ("yesterday", "2026-13-01", "2026-11-01T00:00:00", "20261101"):
        with pytest.raises(InvalidPeriod):
            periods.usage_days(bad, None, now)


def test_registry_and_tunnel_windows():
    now = dt.datetime(2026, 11, 22, 6, 0, tzinfo=UTC)
    assert periods.registry_days(None, None, now) == Days(D(2026, 11, 1), D(2026, 11, 23))  # month to date
    assert periods.registry_days("2026-10-30", "2026-11-02", now) == Days(D(2026, 10, 30), D(2026, 11, 2))
    with pytest.raises(InvalidPeriod):
        periods.registry_days("2026-11-02", "2026-11-02", now)
    since, until = periods.tunnel_window(None, None, now)
    assert (since, until) == (now - dt.timedelta(days=30), now)
    since, until = periods.tunnel_window("2026-11-01", "2026-11-01", now)
    assert since == dt.datetime(2026, 11, 1, tzinfo=UTC)
    assert until == dt.datetime(2026, 11, 1, 23, 59, 59, 999999, tzinfo=UTC)  # to is inclusive
    with pytest.raises(InvalidPeriod):
        periods.tunnel_window("2026-11-02", "2026-11-01", now)


def test_a_feature_counts_on_every_day_it_was_on_at_any_moment():
    at = lambda d, h: dt.datetime(2026, 11, d, h, tzinfo=UTC)
    changes = [(at(3, 12), True), (at(5, 9), False), (at(5, 10), True), (at(7, 0), False)]
    days = Days(D(2026, 11, 1), D(2026, 11, 9))
    assert features.enabled_days(changes, False, days) == [D(2026, 11, d) for d in (3, 4, 5, 6)]
    assert features.enabled_days([], True, Days(D(2026, 11, 1), D(2026, 11, 3))) == [D(2026, 11, 1), D(2026, 11, 2)]
    view = features.view({"telemetry": True}, enterprise=False)
    assert set(view) == {"telemetry", "signature_policy", "usb_policy", "audit_log"}
    assert view["telemetry"] == {"enabled": True, "self_serve": True, "enterprise": False}
    assert view["signature_policy"]["enabled"] is False and view["audit_log"]["enabled"] is True
    assert features.view({}, enterprise=True)["usb_policy"]["enabled"] is True
