"""Dates and instants from outside the hub, kept inside the range it can compute with. Pure.

Python's dates end at 0001-01-01 and 9999-12-31. A date at either end that the hub converts to UTC
(``0001-01-01T00:00:00+01:00`` is still year 0 in UTC), steps a day from (``to=9999-12-31`` includes
the whole day, so the range ends on the next one) or looks 30 days back from overflowed, and each
such request was a 500. Every date or instant a caller sends is checked here instead: the year must
be within ``MIN_YEAR``..``MAX_YEAR``, a year of margin at each end, more than any arithmetic the hub
does on such a value (a day, a billing period, the 400-day longest range). PostgreSQL stores the
whole range.

``check_date`` and ``check_instant`` raise ``OutOfRange`` (a ValueError: pydantic validators turn
it into a 400 invalid_field, the billing ranges into 400 invalid_period); ``Instant`` is the pydantic
type for request models.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import AfterValidator

MIN_YEAR = 2
MAX_YEAR = 9998


class OutOfRange(ValueError):
    """A date or instant too close to the calendar's ends to compute with."""


def check_date(value: dt.date, name: str = "date") -> dt.date:
    """``value`` (a date or a datetime, as written) when its year is in range."""
    if not MIN_YEAR <= value.year <= MAX_YEAR:
        raise OutOfRange(f"{name}: the year must be between {MIN_YEAR} and {MAX_YEAR}")
    return value


def check_instant(value: dt.datetime, name: str = "instant") -> dt.datetime:
    """An aware ``value`` in range, converted to UTC (the conversion cannot overflow once the year
    as written is in range: offsets are under a day)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise OutOfRange(f"{name}: needs a time zone offset (RFC 3339, e.g. Z)")
    return check_date(value, name).astimezone(dt.UTC)


def _instant(value: dt.datetime) -> dt.datetime:
    return check_instant(value, "the instant")


# An aware datetime in a request model, converted to UTC; naive or out of range is 400.
Instant = Annotated[dt.datetime, AfterValidator(_instant)]
