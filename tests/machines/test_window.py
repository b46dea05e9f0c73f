"""The update window, with no IO: exact instants in several zones, midnight, whole days, DST gaps and
overlaps on the real 2026 transition dates, and a reference that scans the wall clock minute by minute.

Expected instants are written out in UTC by hand from the zone's offsets, not computed by the code
under test.
"""

from __future__ import annotations

import ast
import datetime as dt
import inspect
import zoneinfo

import pytest

import actors.machines.window as window_module
from actors.machines.window import (
    DAY_NAMES,
    UpdateWindow,
    WindowCheck,
    WindowError,
    check,
    is_open,
    next_start_after,
)
from tests.astparse import parse

UTC = dt.timezone.utc
SEC = dt.timedelta(seconds=1)
ALL_DAYS = list(DAY_NAMES)


def W(tz: str, start: str, end: str, days, enabled: bool = True) -> UpdateWindow:
    return UpdateWindow.parse({"enabled": enabled, "timezone": tz, "start_time": start, "end_time": end,
                               "days_of_week": list(days)})


def u(y, mo, d, h=0, mi=0, s=0) -> dt.datetime:
    return dt.datetime(y, mo, d, h, mi, s, tzinfo=UTC)


def closed_until(c: WindowCheck, at: dt.datetime) -> None:
    assert c == WindowCheck(False, at, None)


def open_until(c: WindowCheck, at: dt.datetime | None) -> None:
    assert c == WindowCheck(True, None, at)


# -- the module stays pure ------------------------------------------------------------------------
def test_module_imports_nothing_but_the_standard_time_tools():
    tree = parse(inspect.getsource(window_module))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "datetime", "functools", "re", "zoneinfo", "collections", "dataclasses",
                        "typing"}, imported


# -- parsing ------------------------------------------------------------------------------------------
def test_parse_and_to_json_round_trip_in_week_order():
    w = W("Europe/Berlin", "22:00", "04:00", ["Sunday", "Monday", "Wednesday"])
    assert w == UpdateWindow(True, "Europe/Berlin", dt.time(22, 0), dt.time(4, 0), frozenset({0, 2, 6}))
    assert w.to_json() == {"enabled": True, "timezone": "Europe/Berlin", "start_time": "22:00",
                           "end_time": "04:00", "days_of_week": ["Monday", "Wednesday", "Sunday"]}
    assert UpdateWindow.parse(w.to_json()) == w
    assert hash(UpdateWindow.parse(w.to_json())) == hash(w)
    edge = W("Pacific/Chatham", "00:00", "23:59", ALL_DAYS)
    assert edge.to_json()["start_time"] == "00:00" and edge.to_json()["end_time"] == "23:59"
    assert edge.to_json()["days_of_week"] == ALL_DAYS


def test_a_disabled_window_may_list_no_day_but_is_otherwise_validated():
    w = W("UTC", "01:00", "02:00", [], enabled=False)
    assert w.days_of_week == frozenset() and not w.enabled
    with pytest.raises(WindowError) as info:
        W("UTC+2", "01:00", "02:00", [], enabled=False)
    assert info.value.field == "timezone"


GOOD = {"enabled": True, "timezone": "Europe/Berlin", "start_time": "22:00", "end_time": "04:00",
        "days_of_week": ["Monday"]}

BAD = [
    ("enabled", "true"), ("enabled", 1), ("enabled", None), ("enabled", 0),
    ("timezone", ""), ("timezone", "UTC+2"), ("timezone", "GMT+2"), ("timezone", "Mars/Olympus_Mons"),
    ("timezone", "europe/berlin"), ("timezone", "Europe/Berlin "), ("timezone", "Europe/"),
    ("timezone", "Europe"), ("timezone", "/etc/localtime"), ("timezone", "../etc/passwd"),
    ("timezone", "localtime"), ("timezone", "posixrules"), ("timezone", "zone.tab"), ("timezone", "+02:00"),
    ("timezone", "Europe/Berlin\x00"), ("timezone", "A" * 300), ("timezone", 2), ("timezone", None),
    ("timezone", ["Europe/Berlin"]),
    ("start_time", "9:00"), ("start_time", "09:0"), ("start_time", "24:00"), ("start_time", "23:60"),
    ("start_time", "0900"), ("start_time", "09:00:00"), ("start_time", "09:00\n"), ("start_time", " 09:00"),
    ("start_time", "\u0660\u0669:\u0660\u0660"), ("start_time", "-1:00"), ("start_time", "09h00"),
    ("start_time", 900), ("start_time", None), ("start_time", ""),
    ("end_time", "4:00"), ("end_time", "25:00"), ("end_time", "04:61"), ("end_time", 4), ("end_time", "04:00 "),
    ("days_of_week", "Monday"), ("days_of_week", ["monday"]), ("days_of_week", ["Mon"]),
    ("days_of_week", ["MONDAY"]), ("days_of_week", ["Monday", "Monday"]), ("days_of_week", []),
    ("days_of_week", [0]), ("days_of_week", None), ("days_of_week", {"Monday": True}),
    ("days_of_week", ["Monday", "Funday"]), ("days_of_week", ["Montag"]),
]


@pytest.mark.parametrize("field,value", BAD)
def test_parse_names_the_field(field, value):
    with pytest.raises(WindowError) as info:
        UpdateWindow.parse({**GOOD, field: value})
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert info.value.message


@pytest.mark.parametrize("field", sorted(GOOD))
def test_parse_requires_every_field(field):
    data = dict(GOOD)
    del data[field]
    with pytest.raises(WindowError) as info:
        UpdateWindow.parse(data)
    assert (info.value.field, info.value.message) == (field, "is required")


def test_parse_refuses_unknown_fields_and_non_objects():
    with pytest.raises(WindowError) as info:
        UpdateWindow.parse({**GOOD, "startTime": "22:00"})
    assert (info.value.field, info.value.message) == ("startTime", "unknown field")
    for value in (None, [], "window", 3):
        with pytest.raises(WindowError) as info:
            UpdateWindow.parse(value)
        assert info.value.field == "update_window"


@pytest.mark.parametrize("name", ["Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata", "UTC",
                                  "Pacific/Chatham", "Europe/London", "Etc/GMT-14",
                                  "America/Argentina/Buenos_Aires"])
def test_iana_names_are_accepted(name):
    assert W(name, "00:00", "01:00", ["Monday"]).timezone == name


def test_direct_construction_is_checked_too():
    with pytest.raises(WindowError):
        UpdateWindow(True, "Nowhere/Land", dt.time(1), dt.time(2), frozenset({0}))
    with pytest.raises(WindowError):
        UpdateWindow(True, "UTC", dt.time(1, 0, 30), dt.time(2), frozenset({0}))
    with pytest.raises(WindowError):
        UpdateWindow(True, "UTC", dt.time(1), dt.time(2), frozenset({7}))


# -- no window, disabled, always open -------------------------------------------------------------
def test_no_window_or_a_disabled_one_always_allows():
    now = u(2026, 3, 29, 1, 30)
    for w in (None, W("Europe/Berlin", "02:30", "04:00", ["Sunday"], enabled=False)):
        assert check(w, now) == WindowCheck(True, None, None)
        assert is_open(w, now)
        assert next_start_after(w, now) is None


def test_every_day_whole_day_never_closes():
    w = W("Europe/Berlin", "02:30", "02:30", ALL_DAYS)
    for now in (u(2026, 3, 29, 0, 59, 59), u(2026, 3, 29, 1), u(2026, 10, 25, 0, 30), u(2026, 10, 25, 1, 15)):
        open_until(check(w, now), None)
        assert is_open(w, now)
        assert next_start_after(w, now) is None


def test_enabled_without_days_never_opens():
    w = UpdateWindow(True, "UTC", dt.time(1), dt.time(2), frozenset())
    assert check(w, u(2026, 1, 1)) == WindowCheck(False, None, None)
    assert not is_open(w, u(2026, 1, 1, 1, 30))
    assert next_start_after(w, u(2026, 1, 1)) is None


def test_instants_must_be_aware_and_any_zone_works():
    w = W("UTC", "09:00", "17:00", ["Monday"])
    with pytest.raises(ValueError):
        check(w, dt.datetime(2026, 1, 5, 10))
    with pytest.raises(ValueError):
        is_open(w, dt.datetime(2026, 1, 5, 10))
    tokyo = dt.datetime(2026, 1, 5, 19, 0, tzinfo=zoneinfo.ZoneInfo("Asia/Tokyo"))  # 10:00 UTC Monday
    c = check(w, tokyo)
    open_until(c, u(2026, 1, 5, 17))
    assert c.current_window_end.tzinfo is UTC


# -- plain weeks ----------------------------------------------------------------------------------
def test_utc_office_hours_bounds_are_start_inclusive_end_exclusive():
    w = W("UTC", "09:00", "17:00", ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"])
    # 2026-01-05 is a Monday.
    closed_until(check(w, u(2026, 1, 5, 8, 59, 59)), u(2026, 1, 5, 9))
    open_until(check(w, u(2026, 1, 5, 9)), u(2026, 1, 5, 17))
    open_until(check(w, u(2026, 1, 5, 16, 59, 59)), u(2026, 1, 5, 17))
    closed_until(check(w, u(2026, 1, 5, 17)), u(2026, 1, 6, 9))
    closed_until(check(w, u(2026, 1, 9, 17)), u(2026, 1, 12, 9))      # Friday evening → Monday
    closed_until(check(w, u(2026, 1, 10, 12)), u(2026, 1, 12, 9))     # Saturday
    assert next_start_after(w, u(2026, 1, 5, 12)) == u(2026, 1, 6, 9)  # inside: the next opening
    assert next_start_after(w, u(2026, 1, 5, 8, 59, 59)) == u(2026, 1, 5, 9)
    assert next_start_after(w, u(2026, 1, 5, 9)) == u(2026, 1, 6, 9)   # strictly after


def test_kolkata_half_hour_offset_no_dst():
    # +05:30 all year: 01:00–03:30 IST daily = 19:30–22:00 UTC the day before.
    w = W("Asia/Kolkata", "01:00", "03:30", ALL_DAYS)
    closed_until(check(w, u(2026, 3, 29, 19, 29)), u(2026, 3, 29, 19, 30))
    open_until(check(w, u(2026, 3, 29, 19, 30)), u(2026, 3, 29, 22))
    closed_until(check(w, u(2026, 3, 29, 22)), u(2026, 3, 30, 19, 30))
    # A Monday-only window that crosses midnight: Mon 23:00 IST → Tue 00:30 IST.
    w = W("Asia/Kolkata", "23:00", "00:30", ["Monday"])
    closed_until(check(w, u(2026, 6, 1, 12)), u(2026, 6, 1, 17, 30))   # 2026-06-01 is a Monday
    open_until(check(w, u(2026, 6, 1, 18, 59)), u(2026, 6, 1, 19))
    closed_until(check(w, u(2026, 6, 1, 19)), u(2026, 6, 8, 17, 30))


# -- midnight -------------------------------------------------------------------------------------
def test_a_window_crossing_midnight_belongs_to_the_day_it_starts_on():
    # Berlin in January is +01:00. Monday 22:00 → Tuesday 04:00 local = Mon 21:00 → Tue 03:00 UTC.
    w = W("Europe/Berlin", "22:00", "04:00", ["Monday"])
    closed_until(check(w, u(2026, 1, 5, 20, 59, 59)), u(2026, 1, 5, 21))
    open_until(check(w, u(2026, 1, 5, 21)), u(2026, 1, 6, 3))
    open_until(check(w, u(2026, 1, 6, 2, 59, 59)), u(2026, 1, 6, 3))
    closed_until(check(w, u(2026, 1, 6, 3)), u(2026, 1, 12, 21))
    # Monday 01:00 local is the tail of Sunday's window, and Sunday is not listed.
    assert not is_open(w, u(2026, 1, 5, 0))
    # Listing Sunday: Sunday 22:00 → Monday 04:00; Monday's own occurrence follows at 22:00.
    w = W("Europe/Berlin", "22:00", "04:00", ["Sunday", "Monday"])
    open_until(check(w, u(2026, 1, 5, 0)), u(2026, 1, 5, 3))
    closed_until(check(w, u(2026, 1, 5, 3)), u(2026, 1, 5, 21))


def test_whole_day_windows():
    # New York in January is -05:00. Wednesday whole day: Wed 00:00 → Thu 00:00 local.
    w = W("America/New_York", "00:00", "00:00", ["Wednesday"])
    closed_until(check(w, u(2026, 1, 7, 4, 59)), u(2026, 1, 7, 5))
    open_until(check(w, u(2026, 1, 7, 5)), u(2026, 1, 8, 5))
    closed_until(check(w, u(2026, 1, 8, 5)), u(2026, 1, 14, 5))
    # A whole day from 09:00: Saturday 09:00 → Sunday 09:00.
    w = W("America/New_York", "09:00", "09:00", ["Saturday"])
    open_until(check(w, u(2026, 1, 11, 13, 59)), u(2026, 1, 11, 14))
    # Touching whole days are one stretch: Monday + Tuesday ends Wednesday 00:00; the next opening is
    # the following Monday, not Tuesday 00:00.
    w = W("America/New_York", "00:00", "00:00", ["Monday", "Tuesday"])
    open_until(check(w, u(2026, 1, 5, 12)), u(2026, 1, 7, 5))
    assert next_start_after(w, u(2026, 1, 5, 12)) == u(2026, 1, 12, 5)
    assert not is_open(w, u(2026, 1, 5, 5) - SEC) and is_open(w, u(2026, 1, 6, 5))


# -- Europe: 29 Mar 2026 (02:00 CET → 03:00 CEST at 01:00 UTC), 25 Oct 2026 (03:00 CEST → 02:00 CET) --
def test_berlin_start_in_the_spring_gap_opens_when_the_gap_ends():
    w = W("Europe/Berlin", "02:30", "04:00", ["Sunday"])
    closed_until(check(w, u(2026, 3, 28, 12)), u(2026, 3, 29, 1))      # 03:00 CEST, not 03:30
    closed_until(check(w, u(2026, 3, 29, 0, 59, 59)), u(2026, 3, 29, 1))
    open_until(check(w, u(2026, 3, 29, 1)), u(2026, 3, 29, 2))          # 04:00 CEST
    closed_until(check(w, u(2026, 3, 29, 2)), u(2026, 4, 5, 0, 30))      # 02:30 CEST next week
    # the week before, a normal CET Sunday
    closed_until(check(w, u(2026, 3, 21, 12)), u(2026, 3, 22, 1, 30))


def test_berlin_window_entirely_inside_the_gap_does_not_open_that_day():
    w = W("Europe/Berlin", "02:10", "02:50", ["Sunday"])
    closed_until(check(w, u(2026, 3, 28, 12)), u(2026, 4, 5, 0, 10))
    assert not any(is_open(w, u(2026, 3, 29, 0) + dt.timedelta(minutes=m)) for m in range(0, 180))
    closed_until(check(w, u(2026, 3, 22, 1, 50)), u(2026, 4, 5, 0, 10))


def test_berlin_end_in_the_spring_gap_closes_when_the_clocks_jump():
    # Saturday 23:00 CET (22:00 UTC) → Sunday "02:30", which does not exist: closes at 01:00 UTC.
    w = W("Europe/Berlin", "23:00", "02:30", ["Saturday"])
    open_until(check(w, u(2026, 3, 28, 22)), u(2026, 3, 29, 1))
    assert is_open(w, u(2026, 3, 29, 1) - SEC) and not is_open(w, u(2026, 3, 29, 1))


def test_berlin_whole_day_across_the_spring_change_is_23_real_hours():
    w = W("Europe/Berlin", "00:00", "00:00", ["Sunday"])
    c = check(w, u(2026, 3, 29, 12))
    open_until(c, u(2026, 3, 29, 22))                                   # Mon 00:00 CEST
    assert next_start_after(w, u(2026, 3, 28, 12)) == u(2026, 3, 28, 23)  # Sun 00:00 CET
    assert (u(2026, 3, 29, 22) - u(2026, 3, 28, 23)) == dt.timedelta(hours=23)


def test_berlin_start_in_the_autumn_overlap_opens_once():
    # 02:00–02:30 on the repeated hour: first pass 02:00 CEST = 00:00 UTC → 02:30 CEST = 00:30 UTC.
    w = W("Europe/Berlin", "02:00", "02:30", ["Sunday"])
    closed_until(check(w, u(2026, 10, 24, 12)), u(2026, 10, 25, 0))
    open_until(check(w, u(2026, 10, 25, 0, 15)), u(2026, 10, 25, 0, 30))
    # The second pass (02:00–02:30 CET = 01:00–01:30 UTC) is outside; next is 1 Nov 02:00 CET.
    for instant in (u(2026, 10, 25, 0, 30), u(2026, 10, 25, 1), u(2026, 10, 25, 1, 15)):
        closed_until(check(w, instant), u(2026, 11, 1, 1))
        assert not is_open(w, instant)
    assert next_start_after(w, u(2026, 10, 25, 0, 15)) == u(2026, 11, 1, 1)


def test_berlin_window_spanning_the_overlap_lasts_the_extra_hour():
    # 02:30 CEST (00:30 UTC) → 04:00 CET (03:00 UTC): 2.5 real hours for 1.5 wall hours.
    w = W("Europe/Berlin", "02:30", "04:00", ["Sunday"])
    open_until(check(w, u(2026, 10, 25, 1, 30)), u(2026, 10, 25, 3))
    closed_until(check(w, u(2026, 10, 25, 0, 29, 59)), u(2026, 10, 25, 0, 30))
    # ending in the overlap ends at its first occurrence: Saturday 22:00 CEST → Sunday 02:30 CEST.
    w = W("Europe/Berlin", "22:00", "02:30", ["Saturday"])
    open_until(check(w, u(2026, 10, 24, 20)), u(2026, 10, 25, 0, 30))
    assert not is_open(w, u(2026, 10, 25, 1, 15))                       # 02:15 CET, second pass


# -- London: 29 Mar 2026 01:00 GMT → 02:00 BST; 25 Oct 2026 02:00 BST → 01:00 GMT --------------------
def test_london_gap_and_overlap():
    w = W("Europe/London", "01:30", "01:45", ALL_DAYS)
    open_until(check(w, u(2026, 3, 28, 1, 40)), u(2026, 3, 28, 1, 45))   # Saturday, GMT
    closed_until(check(w, u(2026, 3, 28, 2)), u(2026, 3, 30, 0, 30))     # Sunday's falls in the gap
    w = W("Europe/London", "01:30", "02:30", ["Sunday"])
    open_until(check(w, u(2026, 10, 25, 0, 30)), u(2026, 10, 25, 2, 30))  # 01:30 BST → 02:30 GMT
    closed_until(check(w, u(2026, 10, 25, 0, 29)), u(2026, 10, 25, 0, 30))


# -- New York: 8 Mar 2026 02:00 EST → 03:00 EDT (07:00 UTC); 1 Nov 2026 02:00 EDT → 01:00 EST (06:00 UTC)
def test_new_york_spring_gap():
    w = W("America/New_York", "02:30", "03:30", ["Sunday"])
    closed_until(check(w, u(2026, 3, 7, 12)), u(2026, 3, 8, 7))
    open_until(check(w, u(2026, 3, 8, 7)), u(2026, 3, 8, 7, 30))
    closed_until(check(w, u(2026, 3, 8, 7, 30)), u(2026, 3, 15, 6, 30))


def test_new_york_autumn_overlap_and_midnight():
    w = W("America/New_York", "01:30", "01:45", ["Sunday"])
    open_until(check(w, u(2026, 11, 1, 5, 30)), u(2026, 11, 1, 5, 45))   # 01:30 EDT
    closed_until(check(w, u(2026, 11, 1, 6, 30)), u(2026, 11, 8, 6, 30))  # 01:30 EST: not again
    assert not is_open(w, u(2026, 11, 1, 6, 35))
    w = W("America/New_York", "23:00", "01:30", ["Saturday"])
    open_until(check(w, u(2026, 11, 1, 3)), u(2026, 11, 1, 5, 30))       # Sat 23:00 EDT → Sun 01:30 EDT
    closed_until(check(w, u(2026, 11, 1, 6, 40)), u(2026, 11, 8, 4))     # Sat 23:00 EST


# -- Sydney (southern hemisphere): 5 Apr 2026 03:00 AEDT → 02:00 AEST; 4 Oct 2026 02:00 AEST → 03:00 AEDT
def test_sydney_autumn_overlap_in_april():
    w = W("Australia/Sydney", "02:15", "02:45", ALL_DAYS)
    open_until(check(w, u(2026, 4, 3, 15, 15)), u(2026, 4, 3, 15, 45))   # Sat 4 Apr, AEDT +11
    open_until(check(w, u(2026, 4, 4, 15, 15)), u(2026, 4, 4, 15, 45))   # Sun 5 Apr, first pass
    closed_until(check(w, u(2026, 4, 4, 16, 15)), u(2026, 4, 5, 16, 15))  # second pass closed; Mon AEST
    closed_until(check(w, u(2026, 4, 4, 15, 45)), u(2026, 4, 5, 16, 15))


def test_sydney_spring_gap_in_october():
    w = W("Australia/Sydney", "02:15", "02:45", ALL_DAYS)
    open_until(check(w, u(2026, 10, 2, 16, 15)), u(2026, 10, 2, 16, 45))  # Sat 3 Oct, AEST +10
    closed_until(check(w, u(2026, 10, 2, 16, 45)), u(2026, 10, 4, 15, 15))  # Sun 4 Oct is empty
    w = W("Australia/Sydney", "22:00", "04:00", ["Saturday"])
    # Sat 22:00 AEST (12:00 UTC) → Sun 04:00 AEDT (17:00 UTC): 5 real hours for 6 on the wall.
    open_until(check(w, u(2026, 10, 3, 12)), u(2026, 10, 3, 17))
    w = W("Australia/Sydney", "02:30", "03:30", ["Sunday"])
    closed_until(check(w, u(2026, 10, 3, 12)), u(2026, 10, 3, 16))       # opens at 03:00 AEDT
    open_until(check(w, u(2026, 10, 3, 16)), u(2026, 10, 3, 16, 30))


# -- Chatham: +13:45 / +12:45; 5 Apr 2026 03:45 → 02:45; 27 Sep 2026 02:45 → 03:45 (14:00 UTC) -------
def test_chatham_overlap_and_gap():
    w = W("Pacific/Chatham", "03:00", "03:30", ["Sunday"])
    open_until(check(w, u(2026, 4, 4, 13, 15)), u(2026, 4, 4, 13, 45))    # first 03:00 (+13:45)
    closed_until(check(w, u(2026, 4, 4, 14, 15)), u(2026, 4, 11, 14, 15))  # second 03:00 (+12:45): no
    # 03:00–03:30 lies wholly in the 27 Sep gap (02:45–03:45): empty that Sunday; next is 4 Oct (+13:45).
    closed_until(check(w, u(2026, 9, 26, 12)), u(2026, 10, 3, 13, 15))
    assert not any(is_open(w, u(2026, 9, 26, 13) + dt.timedelta(minutes=m)) for m in range(180))
    w = W("Pacific/Chatham", "03:00", "05:00", ["Sunday"])
    closed_until(check(w, u(2026, 9, 26, 12)), u(2026, 9, 26, 14))
    open_until(check(w, u(2026, 9, 26, 14)), u(2026, 9, 26, 15, 15))      # 05:00 +13:45
    open_until(check(w, u(2026, 4, 4, 14, 30)), u(2026, 4, 4, 16, 15))     # 05:00 +12:45, 3 real hours


def test_a_skipped_calendar_day():
    # Samoa skipped Friday 30 Dec 2011: a Friday-only window has no occurrence that week.
    w = W("Pacific/Apia", "10:00", "12:00", ["Friday"])
    closed_until(check(w, u(2011, 12, 28, 12)), u(2012, 1, 5, 20))


# -- a reference: scan the wall clock minute by minute ---------------------------------------------
def reference_occurrences(w: UpdateWindow, begin: dt.datetime, end: dt.datetime) -> list[tuple]:
    """The documented rule, computed differently: an occurrence opens at the first minute at which
    the wall clock has read its start wall time (or later), and closes likewise at its end wall time.
    Scans minutes from ``begin`` to ``end`` keeping the highest wall reading seen so far."""
    zone = zoneinfo.ZoneInfo(w.timezone)
    targets = []
    first_local = begin.astimezone(zone).date()
    for i in range((end - begin).days + 1):
        day = first_local + dt.timedelta(days=i)
        if day.weekday() in w.days_of_week:
            end_day = day if w.end_time > w.start_time else day + dt.timedelta(days=1)
            targets.append((dt.datetime.combine(day, w.start_time), dt.datetime.combine(end_day, w.end_time)))
    begin_wall = begin.astimezone(zone).replace(tzinfo=None)
    targets = [(a, b) for a, b in targets if a > begin_wall]
    reached: dict[dt.datetime, dt.datetime] = {}
    wanted = sorted({t for pair in targets for t in pair})
    highest = None
    t = begin
    k = 0
    while t <= end and k < len(wanted):
        wall = t.astimezone(zone).replace(tzinfo=None)
        highest = wall if highest is None or wall > highest else highest
        while k < len(wanted) and highest >= wanted[k]:
            reached[wanted[k]] = t
            k += 1
        t += dt.timedelta(minutes=1)
    return [(reached[a], reached[b]) for a, b in targets if a in reached and b in reached and reached[a] < reached[b]]


def stretches(occurrences: list[tuple]) -> list[tuple]:
    merged: list[list] = []
    for a, b in occurrences:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [tuple(m) for m in merged]


DST_WEEKS = [
    ("Europe/Berlin", u(2026, 3, 23), ["02:00", "02:30", "03:00"]),
    ("Europe/Berlin", u(2026, 10, 19), ["02:00", "02:30", "03:00"]),
    ("Europe/London", u(2026, 3, 23), ["01:00", "01:30", "02:00"]),
    ("Europe/London", u(2026, 10, 19), ["01:00", "01:30", "02:00"]),
    ("America/New_York", u(2026, 3, 2), ["02:00", "02:30", "01:30"]),
    ("America/New_York", u(2026, 10, 26), ["01:00", "01:30", "02:00"]),
    ("Australia/Sydney", u(2026, 3, 30), ["02:00", "02:30", "03:00"]),
    ("Australia/Sydney", u(2026, 9, 28), ["02:00", "02:30", "03:00"]),
    ("Pacific/Chatham", u(2026, 3, 30), ["02:45", "03:15", "03:45"]),
    ("Pacific/Chatham", u(2026, 9, 21), ["02:45", "03:15", "03:45"]),
    ("Asia/Kolkata", u(2026, 3, 23), ["00:00", "05:30", "23:45"]),
    ("UTC", u(2026, 3, 23), ["00:00", "01:00", "23:00"]),
]


def _plus(hhmm: str, minutes: int) -> str:
    t = dt.datetime(2000, 1, 1, int(hhmm[:2]), int(hhmm[3:])) + dt.timedelta(minutes=minutes)
    return t.strftime("%H:%M")


def windows_for(tz: str, times: list[str]) -> list[UpdateWindow]:
    a, b, c = times
    weekend = ["Saturday", "Sunday"]
    return [
        W(tz, a, _plus(a, 60), ALL_DAYS),
        W(tz, b, _plus(b, 30), ["Sunday", "Monday"]),
        W(tz, b, _plus(b, 10), ["Sunday"]),
        W(tz, "22:00", b, ["Saturday", "Sunday", "Wednesday"]),
        W(tz, c, a, weekend),
        W(tz, b, b, weekend),
        W(tz, a, a, ["Sunday", "Monday", "Tuesday"]),
        W(tz, "09:00", "17:00", ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]),
        W(tz, c, _plus(c, 1), ["Sunday"]),
    ]


CASES = [(tz, monday, w) for tz, monday, times in DST_WEEKS for w in windows_for(tz, times)]


@pytest.mark.parametrize("tz,monday,w", CASES,
                         ids=[f"{tz}-{monday:%m%d}-{w.start_time:%H%M}-{w.end_time:%H%M}-{len(w.days_of_week)}d"
                              for tz, monday, w in CASES])
def test_a_week_across_a_dst_change_matches_the_reference(tz, monday, w):
    begin, end = monday - dt.timedelta(days=3), monday + dt.timedelta(days=17)
    runs = stretches(reference_occurrences(w, begin, end))
    assert len(runs) >= 2
    # Every quarter of an hour for nine days across the change (hourly plus the :15/:30/:45 zones).
    for step in range(9 * 24 * 4):
        now = monday + dt.timedelta(minutes=15 * step)
        c = check(w, now)
        inside = [r for r in runs if r[0] <= now < r[1]]
        assert c.allowed == bool(inside) == is_open(w, now), now
        upcoming = [r[0] for r in runs if r[0] > now]
        assert next_start_after(w, now) == upcoming[0], now
        if c.allowed:
            assert c.next_window_at is None
            assert c.current_window_end == inside[0][1], now
            assert not is_open(w, c.current_window_end) and is_open(w, c.current_window_end - SEC)
        else:
            assert c.current_window_end is None
            assert c.next_window_at == upcoming[0], now
            # a start instant: open at it, closed just before it, closed all the way from now
            assert is_open(w, c.next_window_at) and not is_open(w, c.next_window_at - SEC)
            assert c.next_window_at - now <= dt.timedelta(days=15)
    # and every boundary itself, to the second (the reference's first stretch may be cut by its start)
    for a, b in runs[1:]:
        if monday - dt.timedelta(days=1) <= a <= monday + dt.timedelta(days=10):
            assert is_open(w, a) and not is_open(w, a - SEC)
            assert is_open(w, b - SEC) and not is_open(w, b)
            assert check(w, a - SEC) == WindowCheck(False, a, None)
            assert check(w, a) == WindowCheck(True, None, b)


def test_next_window_is_always_found_within_eight_days_plus_margin():
    # One listed day: from any instant in two weeks around a change, the next opening is at most
    # 7 days + the window's own length + the DST hour away.
    for tz, monday, times in DST_WEEKS:
        w = W(tz, times[1], _plus(times[1], 90), ["Sunday"])
        for hour in range(14 * 24):
            now = monday - dt.timedelta(days=3) + dt.timedelta(hours=hour)
            c = check(w, now)
            if not c.allowed:
                assert now < c.next_window_at <= now + dt.timedelta(days=8, hours=1), (tz, now)
