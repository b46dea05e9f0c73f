"""The billable products: what each one counts, in which unit it is priced, and how a day's metered
quantity becomes billed units.

Prices are not here: list prices and per-organisation overrides live in storage (billing_prices,
0009_billing.sql) with the day they take effect, and pricing.py picks the one in effect each day.

Two kinds of product:

- metered: the day's quantity divided by the unit size (bytes per GB, tokens per million);
- monthly, prorated per day: a device active on a day, or a paid feature enabled on a day, bills
  ``1 / days in that month`` of the monthly price, so a whole month costs exactly the monthly price.
"""

from __future__ import annotations

import calendar
import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

CURRENCY = "USD"

FEATURES = ("telemetry", "signature_policy", "usb_policy", "audit_log")


@dataclass(frozen=True)
class Product:
    key: str
    unit: str            # the unit the price is quoted per (and billed quantities are in)
    description: str
    unit_size: int = 1   # metered quantity per billed unit (ignored for monthly products)
    monthly: bool = False  # priced per month, prorated over the days of each month
    # What a metered quantity counts: bytes are not GB until divided by unit_size, and a monthly
    # product meters days (device-days, days on), not months. The usage answer names both units.
    metered_unit: str = ""

    def billed(self, day: dt.date, quantity: Decimal) -> Decimal:
        """Billed units for ``quantity`` metered on ``day`` (exact; rounding happens on the invoice line)."""
        if self.monthly:
            return quantity / Decimal(calendar.monthrange(day.year, day.month)[1])
        return quantity / Decimal(self.unit_size)


PRODUCTS: tuple[Product, ...] = (
    Product("active_device", "device_month", "devices seen connected, per device per month, prorated daily",
            monthly=True, metered_unit="device_day"),
    Product("tunnel_minutes", "minute", "tunnel session minutes", metered_unit="minute"),
    Product("tunnel_bytes", "GB", "tunnel data carried directly (10^9 bytes)", unit_size=10**9,
            metered_unit="byte"),
    Product("tunnel_relayed_bytes", "GB", "tunnel data carried through the TURN relay (10^9 bytes)",
            unit_size=10**9, metered_unit="byte"),
    Product("registry_fallback_bytes", "GB", "data carried by fleets' registry proxies (10^9 bytes)",
            unit_size=10**9, metered_unit="byte"),
    Product("assistant_prompt_tokens", "million_tokens", "assistant prompt tokens", unit_size=10**6,
            metered_unit="token"),
    Product("assistant_completion_tokens", "million_tokens", "assistant completion tokens", unit_size=10**6,
            metered_unit="token"),
    Product("assistant_tool_tokens", "million_tokens", "assistant tool tokens", unit_size=10**6,
            metered_unit="token"),
    *(Product(f"feature_{f}", "month", f"the {f} feature, per month enabled, prorated daily", monthly=True,
              metered_unit="day") for f in FEATURES),
)

BY_KEY = {p.key: p for p in PRODUCTS}


def product(key: str) -> Product:
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown product {key!r}; known: {', '.join(BY_KEY)}") from None
