"""Takeovers of one device's link: when a new connection with the device's token replaces a live one.

Pure: no trio, no storage; time comes in as ``now``. A device that reboots or loses its network
reconnects before the hub notices the old socket is dead: one takeover now and then is normal, and is
let in at once. Two live holders of one token (a cloned disk, a copied token) take the link from each
other in a loop; each takeover within ``WINDOW`` of others is then held back before the hub accepts
it, 1 s doubling to ``MAX_DELAY``, and ``in_use_twice`` turns the device's diagnosis to a warning.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from dataclasses import dataclass, field

WINDOW = dt.timedelta(seconds=60)  # takeovers counted per minute
KEEP = dt.timedelta(minutes=10)  # how long the diagnosis remembers them
FIRST_DELAY = 1.0
MAX_DELAY = 30.0
SUSPECT_PER_MINUTE = 2  # this many takeovers within a minute: two holders, not a reconnect


@dataclass
class Takeovers:
    times: deque[dt.datetime] = field(default_factory=lambda: deque(maxlen=256))
    addresses: deque[str] = field(default_factory=lambda: deque(maxlen=2))  # the newest holders' addresses

    def _forget_before(self, now: dt.datetime) -> None:
        while self.times and self.times[0] < now - KEEP:
            self.times.popleft()

    def per_minute(self, now: dt.datetime) -> int:
        return sum(1 for t in self.times if t > now - WINDOW)

    def record(self, now: dt.datetime, address: str | None = None) -> float:
        """A new connection replaces a live one at ``now``: how many seconds to hold it back first."""
        self._forget_before(now)
        recent = self.per_minute(now)  # before this one
        self.times.append(now)
        if address:
            self.addresses.append(address)
        return 0.0 if recent == 0 else min(MAX_DELAY, FIRST_DELAY * 2 ** (recent - 1))

    def in_use_twice(self, now: dt.datetime) -> bool:
        return self.per_minute(now) >= SUSPECT_PER_MINUTE

    def summary(self, now: dt.datetime) -> dict:
        self._forget_before(now)
        return {"takeoversLastMinute": self.per_minute(now), "takeoversLast10Minutes": len(self.times),
                "lastAt": self.times[-1] if self.times else None, "addresses": list(self.addresses)}
