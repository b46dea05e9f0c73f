"""Time as an input (DESIGN.md section 5), shared by the hub and the device client.

Nothing else reads the wall clock. ``Clock.now()`` is aware UTC; deadlines use trio time
(``Clock.monotonic()`` is ``trio.current_time()``). The test clock defines wall time as a fixed
epoch plus ``trio.current_time()``, so under pytest-trio's ``autojump_clock`` a 30-minute hold or a
week of update windows passes in milliseconds and tests can assert exact instants.

It lives in device_client because that is the lower layer: the hub imports it (as it imports the
wire protocol); the device client never imports the hub.
"""

from __future__ import annotations

import datetime as dt

import trio

from .timestamps import UTC, rfc3339, utc_now

__all__ = ["UTC", "Clock", "OffsetClock", "TestClock", "rfc3339"]


class Clock:
    """The real clock: wall time from the OS, deadlines from trio."""

    def now(self) -> dt.datetime:
        return utc_now()

    def monotonic(self) -> float:
        return trio.current_time()

    def wall_at(self, trio_deadline: float) -> dt.datetime:
        """The wall instant at which a trio deadline falls."""
        return self.now() + dt.timedelta(seconds=trio_deadline - trio.current_time())

    def deadline_for(self, instant: dt.datetime) -> float:
        """The trio deadline at which wall time reaches ``instant``."""
        return trio.current_time() + (instant - self.now()).total_seconds()


class OffsetClock(Clock):
    """The real clock set ``offset`` seconds off: a node whose clock is skewed against the others'.
    Only the fault suite makes one (FLEETHUB_TEST_CLOCK_OFFSET, tests/cluster/faults/)."""

    def __init__(self, offset: float) -> None:
        self.offset = dt.timedelta(seconds=offset)

    def now(self) -> dt.datetime:
        return utc_now() + self.offset


class TestClock(Clock):
    """Wall time = ``epoch`` + trio time; drive it with trio's MockClock (``autojump_clock``)."""

    __test__ = False  # not a pytest test class

    def __init__(self, epoch: dt.datetime = dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC)) -> None:
        if epoch.tzinfo is None:
            raise ValueError("epoch must be timezone-aware")
        self.epoch = epoch

    def now(self) -> dt.datetime:
        return self.epoch + dt.timedelta(seconds=trio.current_time())
