"""When a failed delivery is tried again, and when an endpoint that keeps failing is disabled.

Pure (time and randomness are inputs): the n-th retry waits ``base * 2**(n-1)`` seconds, capped at
``cap``, with jitter drawn from the upper half of that wait (so retries of many endpoints after an
outage spread out but never come sooner than half the schedule). An endpoint failing for ``give_up``
seconds in a row (3 days by default) is disabled at its next failure.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

BASE = 5.0
CAP = 3600.0
GIVE_UP = 3 * 86400.0


@dataclass(frozen=True)
class Schedule:
    base: float = BASE
    cap: float = CAP
    give_up: float = GIVE_UP

    def delay(self, attempt: int, rand: random.Random) -> float:
        """Seconds before retry number ``attempt`` (1 after the first failure)."""
        wait = min(self.cap, self.base * 2 ** min(attempt - 1, 40))
        return wait / 2 + rand.random() * wait / 2

    def exhausted(self, failing_since: dt.datetime, now: dt.datetime) -> bool:
        return (now - failing_since).total_seconds() >= self.give_up
