"""The fleet update (maintenance) window: a pure function of the schedule and an instant.

Pure: no trio, storage or quart — ``zoneinfo`` and ``datetime`` only. Instants come in aware (any
zone) and go out aware UTC. Rollouts call ``is_open`` and ``next_start_after`` per queued device per
tick; the API calls ``check``.

Rules
-----
- The schedule is evaluated in the window's IANA zone, in wall-clock time.
- Each listed day (0=Monday … 6=Sunday) has one occurrence. It opens at ``start_time`` on that day
  and closes at ``end_time``; the start is included, the end is not.
- A window whose end is before its start crosses midnight and belongs to the day it starts on:
  a Monday 22:00–04:00 window runs Monday 22:00 → Tuesday 04:00 (a Sunday one ends on Monday).
- ``start_time == end_time`` is the whole day: from the start on the listed day to the same wall time
  on the next day. Across a DST change that is 23 or 25 real hours, not 24 — the window covers the
  listed day as the clocks on the wall show it, like every other window here.
- Occurrences that touch (a Monday and a Tuesday whole-day window, or Sunday 22:00–02:00 ending
  exactly where an early Monday window starts) are one open stretch: ``current_window_end`` is where
  the stretch ends, and ``next_window_at`` is only ever an opening after a closed moment.
- Daylight saving, one rule for both ends: a wall time maps to the FIRST instant at which the zone's
  clock reads that time or later.
  * Gap (spring forward): a start or end inside the gap maps to the transition instant, the first
    valid instant after the gap (Berlin 29 Mar 2026, 02:30 → 03:00 CEST = 01:00 UTC). A window whose
    start and end both fall in the same gap is empty that day: it does not open at all.
  * Overlap (fall back): the first occurrence (fold=0). A window starting in the repeated hour opens
    once, at the first occurrence, and does not open again when the wall clock repeats it; an end in
    the repeated hour closes the window at the first occurrence too, so the second pass through that
    wall time is outside the window (we prefer closing early to updating devices after the hour the
    operator named has first been reached).
  This mapping is monotone, so occurrences never run backwards or overlap one another.
- No window (``None``) or a disabled one always allows and has no next start.
- ``next_window_at`` (when not allowed) is the next opening strictly after now: the window is open
  at it and closed just before it. It always exists when at least one day is listed; a window listing
  every day with ``start_time == end_time`` is always open and never has one.

Cost: the candidate occurrences around an instant are computed per day (two wall→UTC conversions
each, memoised), never by scanning minutes; a DST gap costs one short bisection over seconds.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import zoneinfo
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

UTC = dt.timezone.utc
DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
FIELDS = ("enabled", "timezone", "start_time", "end_time", "days_of_week")

_HHMM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")
# Names the zone database ships that are not IANA zones (a host's own link, the tzcode helper) or
# carry no meaning for a schedule ("Factory").
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})
_MAX_ZONE_LEN = 64
# How far the search for the next opening goes before giving up: far beyond the 8 days (+ a DST
# margin) it ever needs; it only bounds a loop over a window that lists no day.
_SEARCH_DAYS = 400


class WindowError(ValueError):
    """A window definition the caller got wrong; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@functools.cache
def zone_names() -> frozenset[str]:
    """The IANA names this system's tz database holds: read from disk once (about 40 ms: a walk of
    the zone directory), which is why a hub reads it in a worker thread as it starts."""
    return frozenset(zoneinfo.available_timezones()) - _NOT_ZONES


def load_zone(name: Any) -> zoneinfo.ZoneInfo:
    """The zone for an IANA name; ``WindowError("timezone", ...)`` for anything else (offsets such
    as "UTC+2", abbreviations, paths, wrong case, the empty string)."""
    if not isinstance(name, str):
        raise WindowError("timezone", "must be a string holding an IANA zone name such as Europe/Berlin")
    if not name or len(name) > _MAX_ZONE_LEN or name not in zone_names():
        raise WindowError("timezone", f"{name[:_MAX_ZONE_LEN]!r} is not an IANA zone name (for example Europe/Berlin)")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise WindowError("timezone", f"{name!r} is not an IANA zone name (for example Europe/Berlin)") from None


def _parse_hhmm(field_name: str, value: Any) -> dt.time:
    match = _HHMM.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise WindowError(field_name, "must be a time HH:MM between 00:00 and 23:59")
    return dt.time(int(match[1]), int(match[2]))


def _parse_days(value: Any, enabled: bool) -> frozenset[int]:
    if not isinstance(value, list):
        raise WindowError("days_of_week", "must be an array of day names (Monday … Sunday)")
    days: set[int] = set()
    for item in value:
        if not isinstance(item, str) or item not in DAY_NAMES:
            shown = repr(item)[:40]
            raise WindowError("days_of_week", f"{shown} is not a day name; use Monday, Tuesday, … Sunday")
        index = DAY_NAMES.index(item)
        if index in days:
            raise WindowError("days_of_week", f"{item} is listed twice")
        days.add(index)
    if enabled and not days:
        raise WindowError("days_of_week", "an enabled window needs at least one day")
    return frozenset(days)


@dataclass(frozen=True)
class UpdateWindow:
    enabled: bool
    timezone: str                  #: IANA name; the schedule is evaluated in this zone
    start_time: dt.time            #: wall time, whole minutes
    end_time: dt.time              #: wall time, whole minutes; before start_time = crosses midnight
    days_of_week: frozenset[int]   #: 0=Monday … 6=Sunday; the day each occurrence starts on
    zone: zoneinfo.ZoneInfo = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "zone", load_zone(self.timezone))
        for name in ("start_time", "end_time"):
            t = getattr(self, name)
            if not isinstance(t, dt.time) or t.tzinfo is not None or t.second or t.microsecond:
                raise WindowError(name, "must be a naive time in whole minutes")
        if not isinstance(self.days_of_week, frozenset) or not self.days_of_week <= frozenset(range(7)):
            raise WindowError("days_of_week", "must be a frozenset of weekday numbers 0..6")

    @classmethod
    def parse(cls, data: Any) -> UpdateWindow:
        """From the API's JSON object (all five fields, nothing else); ``WindowError`` names the field.
        A disabled window is validated the same way: it keeps its schedule for when it is enabled."""
        if not isinstance(data, Mapping):
            raise WindowError("update_window", "must be a JSON object")
        for key in data:
            if key not in FIELDS:
                raise WindowError(str(key)[:64], "unknown field")
        for key in FIELDS:
            if key not in data:
                raise WindowError(key, "is required")
        enabled = data["enabled"]
        if not isinstance(enabled, bool):
            raise WindowError("enabled", "must be true or false")
        load_zone(data["timezone"])
        return cls(enabled=enabled, timezone=data["timezone"],
                   start_time=_parse_hhmm("start_time", data["start_time"]),
                   end_time=_parse_hhmm("end_time", data["end_time"]),
                   days_of_week=_parse_days(data["days_of_week"], enabled))

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "timezone": self.timezone,
                "start_time": self.start_time.strftime("%H:%M"), "end_time": self.end_time.strftime("%H:%M"),
                "days_of_week": [DAY_NAMES[d] for d in sorted(self.days_of_week)]}

    @property
    def always_open(self) -> bool:
        """Every day, whole days: the occurrences touch end to end, so it never closes."""
        return not self.enabled or (len(self.days_of_week) == 7 and self.start_time == self.end_time)


@dataclass(frozen=True)
class WindowCheck:
    allowed: bool                          #: the instant is inside the window (or there is none)
    next_window_at: dt.datetime | None     #: when not allowed: the next opening (UTC)
    current_window_end: dt.datetime | None  #: when allowed: where the open stretch ends (UTC); None if never


# -- computation ---------------------------------------------------------------------------------
def _utc(instant: dt.datetime) -> dt.datetime:
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError("instants must be timezone-aware")
    return instant.astimezone(UTC)


def resolve(zone: zoneinfo.ZoneInfo, day: dt.date, wall: dt.time) -> dt.datetime:
    """The first instant (UTC) at which the zone's clock reads ``day wall`` or later: the instant
    itself when it exists (its first occurrence in an overlap), the end of the gap when it does not."""
    naive = dt.datetime.combine(day, wall)
    first = naive.replace(tzinfo=zone).astimezone(UTC)  # fold=0: the offset in force before a change
    if first.astimezone(zone).replace(tzinfo=None) == naive:
        return first
    # In a gap. fold=0 used the offset before the change and landed after it; fold=1 uses the offset
    # after and lands before it. The change lies between: bisect whole seconds (transitions are).
    lo = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    hi = first
    after = hi.astimezone(zone).utcoffset()
    while (hi - lo) > dt.timedelta(seconds=1):
        mid = lo + dt.timedelta(seconds=(hi - lo) // dt.timedelta(seconds=1) // 2)
        if mid.astimezone(zone).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return hi


@functools.lru_cache(maxsize=8192)
def occurrence(window: UpdateWindow, day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """The occurrence starting on local ``day`` (whether or not the day is listed): [start, end) in
    UTC. Empty (start == end) only when both ends fall in one DST gap."""
    start = resolve(window.zone, day, window.start_time)
    end_day = day if window.end_time > window.start_time else day + dt.timedelta(days=1)
    return start, resolve(window.zone, end_day, window.end_time)


def _stretches(window: UpdateWindow, first_day: dt.date) -> Iterator[tuple[dt.datetime, dt.datetime]]:
    """Open stretches in time order, from the occurrences of ``first_day`` on; touching occurrences
    are merged. The first one may begin earlier than reported (it can continue an older stretch)."""
    current: tuple[dt.datetime, dt.datetime] | None = None
    for i in range(_SEARCH_DAYS):
        day = first_day + dt.timedelta(days=i)
        if day.weekday() not in window.days_of_week:
            continue
        start, end = occurrence(window, day)
        if start >= end:
            continue
        if current is not None and start <= current[1]:
            current = (current[0], max(current[1], end))
            continue
        if current is not None:
            yield current
        current = (start, end)
    if current is not None:
        yield current


def _first_day(window: UpdateWindow, instant: dt.datetime) -> dt.date:
    # An occurrence covering ``instant`` starts at most one local day before it; two is a margin.
    # Later days all follow: the search walks forward from here.
    return instant.astimezone(window.zone).date() - dt.timedelta(days=2)


def check(window: UpdateWindow | None, now: dt.datetime) -> WindowCheck:
    """Is ``now`` inside the window; if not, when it next opens; if so, when it closes."""
    now = _utc(now)
    if window is None or window.always_open:
        return WindowCheck(True, None, None)
    for start, end in _stretches(window, _first_day(window, now)):
        if end <= now:
            continue
        if start <= now:
            return WindowCheck(True, None, end)
        return WindowCheck(False, start, None)
    return WindowCheck(False, None, None)  # enabled with no day listed: never opens


def is_open(window: UpdateWindow | None, instant: dt.datetime) -> bool:
    instant = _utc(instant)
    if window is None or window.always_open:
        return True
    local_day = instant.astimezone(window.zone).date()
    # The occurrence covering an instant starts on its local day or the one before; the days around
    # them cover zones that fall back across midnight (the next day's start can precede the instant).
    for offset in (-2, -1, 0, 1):
        day = local_day + dt.timedelta(days=offset)
        if day.weekday() in window.days_of_week:
            start, end = occurrence(window, day)
            if start <= instant < end:
                return True
    return False


def next_start_after(window: UpdateWindow | None, instant: dt.datetime) -> dt.datetime | None:
    """The next opening strictly after ``instant`` (the window is closed just before it), whether or
    not ``instant`` is inside the window. None for no window, a disabled or an always-open one."""
    instant = _utc(instant)
    if window is None or window.always_open:
        return None
    for start, _end in _stretches(window, _first_day(window, instant)):
        if start > instant:
            return start
    return None
