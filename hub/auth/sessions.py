"""Dashboard sessions: the cookie, its lifetime, and login throttling.

The session id is 256 random bits in an HttpOnly, SameSite=Strict cookie; only its SHA-256 is stored.
A CSRF token (returned by login, and by GET /v1/auth/session) must accompany every mutating request
made with the cookie. Login throttling is pure (``now`` comes in): after ``max_failures`` failed
attempts within ``window`` for an account, or for a client address, further attempts are refused
until the oldest failure leaves the window.
"""

from __future__ import annotations

import datetime as dt
from collections import deque

SESSION_LIFETIME = dt.timedelta(hours=12)


class LoginThrottle:
    def __init__(self, *, max_failures: int = 5, window: dt.timedelta = dt.timedelta(minutes=15),
                 max_failures_per_address: int = 20) -> None:
        self.max_failures = max_failures
        self.max_failures_per_address = max_failures_per_address
        self.window = window
        self._failures: dict[tuple[str, str], deque[dt.datetime]] = {}

    def _recent(self, key: tuple[str, str], now: dt.datetime) -> deque[dt.datetime]:
        q = self._failures.get(key)
        if q is None:
            return deque()
        while q and q[0] <= now - self.window:
            q.popleft()
        if not q:
            del self._failures[key]
        return q

    def retry_after(self, account: str, address: str, now: dt.datetime) -> float:
        """Seconds until an attempt is allowed again (0 when allowed now)."""
        waits = []
        for key, limit in ((("account", account.lower()), self.max_failures),
                           (("address", address), self.max_failures_per_address)):
            q = self._recent(key, now)
            if len(q) >= limit:
                waits.append((q[0] + self.window - now).total_seconds())
        return max(waits, default=0.0)

    def failed(self, account: str, address: str, now: dt.datetime) -> None:
        for key in (("account", account.lower()), ("address", address)):
            self._failures.setdefault(key, deque()).append(now)

    def succeeded(self, account: str) -> None:
        self._failures.pop(("account", account.lower()), None)
