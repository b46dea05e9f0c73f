"""Billing periods and the query ranges of the billing endpoints. Pure: ``now`` is an argument.

Usage is metered per UTC day, so every range ends up as whole days ``[start, end)``:

- a bare date ``from`` starts at that day; an RFC 3339 ``from`` starts at the day containing it;
- ``/billing/usage``: a bare ``to`` date includes that whole UTC day; an RFC 3339 ``to`` is the
  instant the range ends (exclusive), so the days counted are those that begin before it
  (``to=2026-12-01T00:00:00Z`` ends with November 30). At most 400 days; ``to`` after ``from``.
  Default: the current billing period (calendar month in UTC, or from the profile's anchor day).
- ``/billing/registry-fallback``: ``start``/``end`` as dates or RFC 3339, end exclusive (a bare
  ``end`` date is not included); default the current UTC month to date (today included).
- ``/billing/tunnel/usage``: instants, not days: ``from`` default 30 days before now, ``to``
  inclusive (a bare ``to`` date includes its whole day), default now.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from hub import instants

UTC = dt.UTC
MAX_USAGE_DAYS = 400
DAY = dt.timedelta(days=1)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class InvalidPeriod(ValueError):
    """A range parameter is malformed, reversed or too long (the endpoints answer 400)."""


@dataclass(frozen=True)
class Days:
    start: dt.date   # first day counted
    end: dt.date     # first day not counted

    @property
    def count(self) -> int:
        return (self.end - self.start).days

    def days(self) -> list[dt.date]:
        return [self.start + dt.timedelta(days=i) for i in range(self.count)]


def parse(value: str, name: str) -> dt.date | dt.datetime:
    """A bare date (YYYY-MM-DD) or an RFC 3339 instant with an offset, in UTC; either within the
    years hub/instants.py allows, so the day steps below cannot overflow."""
    value = value.strip()
    try:
        if _DATE.match(value):
            return instants.check_date(dt.date.fromisoformat(value), name)
        if "T" not in value.upper() and " " not in value:
            raise ValueError
        instant = dt.datetime.fromisoformat(value)
    except instants.OutOfRange as exc:
        raise InvalidPeriod(str(exc)) from None
    except ValueError:
        raise InvalidPeriod(f"{name}: expected YYYY-MM-DD or an RFC 3339 timestamp") from None
    if instant.tzinfo is None:
        raise InvalidPeriod(f"{name}: an RFC 3339 timestamp needs a time zone offset (e.g. Z)")
    try:
        return instants.check_instant(instant, name)
    except instants.OutOfRange as exc:
        raise InvalidPeriod(str(exc)) from None


def _start_day(value: dt.date | dt.datetime) -> dt.date:
    return value.date() if isinstance(value, dt.datetime) else value


def _end_day_exclusive_instant(value: dt.datetime) -> dt.date:
    """First day not counted when the range ends at the instant ``value`` (exclusive)."""
    day = value.date()
    return day + DAY if value > dt.datetime.combine(day, dt.time(), UTC) else day


def billing_period(now: dt.datetime, anchor_day: int = 1) -> Days:
    """The billing period containing ``now``: from the anchor day of a month to the same day of the
    next (anchor 1 = the calendar month). Anchors are 1 to 28, so every month has the day."""
    today = now.astimezone(UTC).date()
    year, month = today.year, today.month
    if today.day < anchor_day:
        year, month = (year - 1, 12) if month == 1 else (year, month - 1)
    start = dt.date(year, month, anchor_day)
    ny, nm = (year + 1, 1) if month == 12 else (year, month + 1)
    return Days(start, dt.date(ny, nm, anchor_day))


def usage_days(from_: str | None, to: str | None, now: dt.datetime, anchor_day: int = 1) -> Days:
    if from_ is None and to is None:
        return billing_period(now, anchor_day)
    period = billing_period(now, anchor_day)
    start = _start_day(parse(from_, "from")) if from_ is not None else period.start
    if to is None:
        end = period.end if start < period.end else start + DAY
    else:
        parsed = parse(to, "to")
        end = _end_day_exclusive_instant(parsed) if isinstance(parsed, dt.datetime) else parsed + DAY
    if end <= start:
        raise InvalidPeriod("to must be after from (from defaults to the start of the billing period)")
    if (end - start).days > MAX_USAGE_DAYS:
        raise InvalidPeriod(f"the range is {(end - start).days} days; at most {MAX_USAGE_DAYS}")
    return Days(start, end)


def registry_days(start: str | None, end: str | None, now: dt.datetime) -> Days:
    today = now.astimezone(UTC).date()
    first = _start_day(parse(start, "start")) if start is not None else today.replace(day=1)
    if end is None:
        last = today + DAY if first <= today else first + DAY
    else:
        parsed = parse(end, "end")
        last = _end_day_exclusive_instant(parsed) if isinstance(parsed, dt.datetime) else parsed
    if last <= first:
        raise InvalidPeriod("end must be after start")
    if (last - first).days > MAX_USAGE_DAYS:
        raise InvalidPeriod(f"the period is {(last - first).days} days; at most {MAX_USAGE_DAYS}")
    return Days(first, last)


def tunnel_window(from_: str | None, to: str | None, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """[since, until] instants, both inclusive."""
    now = now.astimezone(UTC)
    if to is None:
        until = now
    else:
        parsed = parse(to, "to")
        until = parsed if isinstance(parsed, dt.datetime) else (
            dt.datetime.combine(parsed + DAY, dt.time(), UTC) - dt.timedelta(microseconds=1))
    if from_ is None:
        since = until - dt.timedelta(days=30)
    else:
        parsed = parse(from_, "from")
        since = parsed if isinstance(parsed, dt.datetime) else dt.datetime.combine(parsed, dt.time(), UTC)
    if until < since:
        raise InvalidPeriod("to must not be before from")
    if (until - since) > dt.timedelta(days=MAX_USAGE_DAYS):
        raise InvalidPeriod(f"the range is longer than {MAX_USAGE_DAYS} days")
    return since, until
