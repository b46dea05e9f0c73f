"""Prices in effect per day, and usage priced the way the invoice prices it. Pure: no storage, no
clock; all amounts are Decimal.

Which price applies on a day: the organisation's override with the latest effective day on or before
it; failing that, the list price with the latest effective day on or before it; failing both, none
(the product is not priced that day and the day adds nothing to the cost).

Cost of a product over a period = Σ over days of (billed units that day × price that day), summed
exactly, then rounded once to the cent, half up (ROUND_HALF_UP) — one invoice line per product. The
total is the sum of the rounded lines, as on the invoice, so lines always add up to the total.
"""

from __future__ import annotations

import bisect
import datetime as dt
import uuid
from collections import defaultdict
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from hub.billing.catalogue import BY_KEY, PRODUCTS

CENT = Decimal("0.01")


def to_cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


class PriceBook:
    """Price rows ({product, org_id, effective_from, unit_price}) of one organisation and the list."""

    def __init__(self, rows: list[dict], org_id: uuid.UUID) -> None:
        self._org: dict[str, list[tuple[dt.date, Decimal]]] = defaultdict(list)
        self._list: dict[str, list[tuple[dt.date, Decimal]]] = defaultdict(list)
        for r in rows:
            if r["org_id"] is None:
                self._list[r["product"]].append((r["effective_from"], Decimal(r["unit_price"])))
            elif r["org_id"] == org_id:
                self._org[r["product"]].append((r["effective_from"], Decimal(r["unit_price"])))
        for table in (self._org, self._list):
            for series in table.values():
                series.sort()

    @staticmethod
    def _at(series: list[tuple[dt.date, Decimal]], day: dt.date) -> tuple[dt.date, Decimal] | None:
        i = bisect.bisect_right(series, day, key=lambda e: e[0])
        return series[i - 1] if i else None

    def price(self, product: str, day: dt.date) -> Decimal | None:
        found = self._at(self._org.get(product, []), day) or self._at(self._list.get(product, []), day)
        return found[1] if found else None

    def describe(self, product: str, day: dt.date) -> dict:
        """The price in effect on ``day`` and where it comes from (for the pricing view)."""
        org = self._at(self._org.get(product, []), day)
        if org:
            return {"unit_price": org[1], "source": "override", "effective_from": org[0]}
        listed = self._at(self._list.get(product, []), day)
        if listed:
            return {"unit_price": listed[1], "source": "list", "effective_from": listed[0]}
        return {"unit_price": None, "source": None, "effective_from": None}

    def changes(self, product: str, start: dt.date, end: dt.date) -> list[dt.date]:
        """Days in [start, end) on which a price of this product takes effect."""
        days = {d for d, _ in self._org.get(product, []) + self._list.get(product, []) if start < d < end}
        return sorted(days)


@dataclass
class Line:
    product: str
    quantity: Decimal = Decimal(0)        # metered quantity (bytes, minutes, device-days, ...)
    billed: Decimal = Decimal(0)          # in the product's billing unit
    exact: Decimal = Decimal(0)           # Σ billed × price, unrounded
    unpriced_quantity: Decimal = Decimal(0)  # metered on days without a price
    priced_days: int = 0

    @property
    def cost(self) -> Decimal | None:
        """The invoice line: rounded to the cent; None when nothing metered had a price."""
        if self.priced_days == 0:
            return None if self.quantity else Decimal("0.00")
        return to_cents(self.exact)


def price_usage(daily: dict[str, dict[dt.date, Decimal]], book: PriceBook) -> tuple[list[Line], Decimal]:
    """``daily[product][day] = quantity`` → one line per catalogue product, and the invoice total."""
    lines = []
    for p in PRODUCTS:
        line = Line(p.key)
        for day, quantity in sorted(daily.get(p.key, {}).items()):
            if not quantity:
                continue
            line.quantity += quantity
            billed = p.billed(day, quantity)
            line.billed += billed
            price = book.price(p.key, day)
            if price is None:
                line.unpriced_quantity += quantity
                continue
            line.priced_days += 1
            line.exact += billed * price
        lines.append(line)
    total = sum((line.cost or Decimal(0) for line in lines), Decimal("0.00"))
    return lines, total


def known(product: str) -> bool:
    return product in BY_KEY
