"""Dashboard sessions: the cookie, its lifetime, and login throttling.

The session id is 256 random bits in an HttpOnly, SameSite=Strict cookie; only its SHA-256 is stored.
A CSRF token (returned by login, and by GET /v1/auth/session) must accompany every mutating request
made with the cookie.

Login throttling is pure (``now`` comes in). An attempt is *reserved* — counted as a failure — before
the password is checked, in one synchronous call, so parallel guesses cannot all pass the check before
any of them is recorded (the login view awaits the password hash in a thread). A correct password
gives its reservation back. After ``max_failures`` attempts within ``window`` for an account, or
``max_failures_per_address`` for a client address, further attempts are refused until the oldest
leaves the window.

The table is bounded: keys are kept in order of their last attempt, keys whose attempts all left the
window are pruned as new ones arrive, and when ``max_keys`` live keys are held the least recently
tried is dropped (counted in ``dropped``: its history no longer slows anyone down, the address limit
still does).
"""

from __future__ import annotations

import datetime as dt
from collections import OrderedDict, deque
from dataclasses import dataclass

SESSION_LIFETIME = dt.timedelta(hours=12)

Key = tuple[str, str]


@dataclass(frozen=True)
class Reservation:
    """One attempt counted in advance; ``wait`` > 0 means it was refused (nothing was counted)."""
    account: str
    address: str
    at: dt.datetime
    wait: float = 0.0

    @property
    def allowed(self) -> bool:
        return self.wait <= 0


class LoginThrottle:
    def __init__(self, *, max_failures: int = 5, window: dt.timedelta = dt.timedelta(minutes=15),
                 max_failures_per_address: int = 20, max_keys: int = 100_000) -> None:
        self.max_failures = max_failures
        self.max_failures_per_address = max_failures_per_address
        self.window = window
        self.max_keys = max_keys
        self.dropped = 0  # live keys forgotten because the table was full (/metrics)
        # Least recently tried first: pruning and eviction both work from the front.
        self._failures: OrderedDict[Key, deque[dt.datetime]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def _keys(self, account: str, address: str) -> tuple[tuple[Key, int], tuple[Key, int]]:
        return ((("account", account.lower()), self.max_failures),
                (("address", address), self.max_failures_per_address))

    def _recent(self, key: Key, now: dt.datetime) -> deque[dt.datetime]:
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
        for key, limit in self._keys(account, address):
            q = self._recent(key, now)
            if len(q) >= limit:
                waits.append((q[0] + self.window - now).total_seconds())
        return max(waits, default=0.0)

    def reserve(self, account: str, address: str, now: dt.datetime) -> Reservation:
        """Check and count one attempt at once (no await in between): the caller checks the password
        only when the reservation is ``allowed``, and calls ``succeeded`` if it was right."""
        wait = self.retry_after(account, address, now)
        if wait > 0:
            return Reservation(account, address, now, wait)
        self.failed(account, address, now)
        return Reservation(account, address, now)

    def failed(self, account: str, address: str, now: dt.datetime) -> None:
        self._prune(now)
        for key, _ in self._keys(account, address):
            q = self._failures.get(key)
            if q is None:
                if len(self._failures) >= self.max_keys:
                    self._failures.popitem(last=False)  # the least recently tried live key
                    self.dropped += 1
                q = self._failures[key] = deque()
            else:
                self._failures.move_to_end(key)
            q.append(now)

    def succeeded(self, reservation: Reservation) -> None:
        """The password was right: the account starts afresh and the address gets its attempt back."""
        self._failures.pop(("account", reservation.account.lower()), None)
        q = self._failures.get(("address", reservation.address))
        if q is not None:
            try:
                q.remove(reservation.at)
            except ValueError:
                pass  # already left the window
            if not q:
                del self._failures[("address", reservation.address)]

    def _prune(self, now: dt.datetime) -> None:
        """Drop keys from the front whose newest attempt left the window (then all of them did)."""
        horizon = now - self.window
        while self._failures:
            key, q = next(iter(self._failures.items()))
            if q and q[-1] > horizon:
                break
            del self._failures[key]
