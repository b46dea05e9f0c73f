"""Request rate limits by organisation tier (spec, Limits): fixed one-hour windows aligned to the hour.

Pure: the caller passes ``now``. Counters live in this process. In a cluster each node also learns,
every sync round, what the other nodes counted in the same window (``learn``) and hands over what it
counted itself (``changes``): hub/cluster/limits.py carries both through PostgreSQL, so a key's limit
holds across the nodes, give or take what each node admits between two rounds. A fixed window is what
the X-RateLimit-Reset header can describe exactly: the instant the window ends.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from hub.errors import RateLimited

WINDOW_SECONDS = 3600
TIER_LIMITS = {"standard": 1_000, "professional": 10_000}
# An enterprise organisation without a negotiated figure gets this many requests per hour.
ENTERPRISE_DEFAULT = 100_000


def limit_for(tier: str | None, custom: int | None) -> int:
    if custom is not None and tier == "enterprise":
        return custom
    if tier == "enterprise":
        return ENTERPRISE_DEFAULT
    return TIER_LIMITS.get(tier or "standard", TIER_LIMITS["standard"])


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    reset: int          # epoch seconds at which the window ends
    retry_after: int    # seconds until then (for 429)

    def headers(self) -> dict[str, str]:
        return {"X-RateLimit-Limit": str(self.limit), "X-RateLimit-Remaining": str(self.remaining),
                "X-RateLimit-Reset": str(self.reset)}

    def raise_if_refused(self) -> None:
        """RateLimited, carrying the headers, when the request is past its budget."""
        if not self.allowed:
            exc = RateLimited("rate limit exceeded; see X-RateLimit-Reset", retry_after=self.retry_after)
            exc.headers.update(self.headers())
            raise exc


def spend(limiter: RateLimiter, key: object, tier: str | None, custom: int | None, now: dt.datetime) -> Decision:
    """Count one request against ``key``'s budget, the limit of ``tier`` (``custom``: an enterprise
    organisation's own figure): what every caller of the limiter uses (the middleware, /v1/mcp)."""
    return limiter.hit(key, limit_for(tier, custom), now)


def key_text(key: object) -> str:
    """A counter key as the cluster stores it: ("org", id) -> "org:id"."""
    return ":".join(map(str, key)) if isinstance(key, tuple) else str(key)


class RateLimiter:
    def __init__(self, window: int = WINDOW_SECONDS) -> None:
        self.window = window
        self._window_start: int | None = None
        self._counts: dict[object, int] = {}
        # The other nodes' counts in this window, by key_text (a cluster node only; empty otherwise).
        self._others: dict[str, int] = {}
        # Keys counted here since the last ``changes``. Kept only once a cluster asks for changes: a
        # single process never reads them, and ``hit`` is on every request's path.
        self._tracking = False
        self._changed: set[object] = set()
        self._sending: set[object] = set()  # the keys of the last ``changes``, until it is known sent

    def _elsewhere(self, key: object) -> int:
        return self._others.get(key_text(key), 0) if self._others else 0

    def peek(self, key: object, limit: int, now: dt.datetime) -> Decision:
        """Where ``key`` stands, without counting a request (answers of routes with their own limits)."""
        epoch = int(now.timestamp())
        start = epoch - epoch % self.window
        used = self._counts.get(key, 0) + self._elsewhere(key) if start == self._window_start else 0
        return Decision(used < limit, limit, max(0, limit - used), start + self.window,
                        0 if used < limit else max(1, start + self.window - epoch))

    def changes(self, now: dt.datetime) -> tuple[int, dict[str, int]]:
        """The current window and this process's count of every key counted since the last call."""
        epoch = int(now.timestamp())
        start = epoch - epoch % self.window
        if start != self._window_start:
            return start, {}
        if not self._tracking:
            # The first round: every key counted so far is news to the other nodes.
            self._tracking, self._changed = True, set(self._counts)
        changed, self._changed = self._changed, set()
        self._sending = changed
        return start, {key_text(k): self._counts[k] for k in changed if k in self._counts}

    def not_sent(self) -> None:
        """The counts of the last ``changes`` did not reach the other nodes: give them with the next."""
        self._changed |= self._sending
        self._sending = set()

    def learn(self, window_start: int, others: dict[str, int]) -> None:
        """The other nodes' counts in ``window_start``; ignored if this process has moved on."""
        if self._window_start is None or window_start > self._window_start:
            self._window_start, self._counts, self._changed = window_start, {}, set()
        if window_start == self._window_start:
            self._others = others

    def hit(self, key: object, limit: int, now: dt.datetime) -> Decision:
        """Count one request for ``key``; a request over the limit is refused and not counted."""
        epoch = int(now.timestamp())
        start = epoch - epoch % self.window
        if start != self._window_start:
            # A new window: every counter starts again, and keys of idle callers do not pile up.
            self._window_start, self._counts, self._others, self._changed = start, {}, {}, set()
        mine = self._counts.get(key, 0)
        used = mine + self._elsewhere(key)
        reset = start + self.window
        if used >= limit:
            return Decision(False, limit, 0, reset, max(1, reset - epoch))
        self._counts[key] = mine + 1
        if self._tracking:
            self._changed.add(key)
        return Decision(True, limit, limit - used - 1, reset, 0)


class BurstLimiter:
    """Attempts per key in a window that starts at the key's first attempt (credential endpoints:
    ``POST /v1/oauth/token``). Pure: ``now`` comes in. Unlike the hourly API windows, a burst of
    guesses straddling a clock boundary cannot get twice the limit. Bounded: expired keys are pruned
    as new ones arrive, and when ``max_keys`` live keys are held the oldest window is dropped
    (counted in ``dropped``)."""

    def __init__(self, window: int, max_keys: int = 100_000) -> None:
        self.window = window
        self.max_keys = max_keys
        self.dropped = 0
        self._windows: dict[object, tuple[float, int]] = {}  # key -> (window start, count); oldest first

    def __len__(self) -> int:
        return len(self._windows)

    def hit(self, key: object, limit: int, now: dt.datetime) -> Decision:
        """Count one attempt for ``key`` before it is checked; over the limit it is refused, not counted."""
        at = now.timestamp()
        start, used = self._windows.get(key, (at, 0))
        if at >= start + self.window:
            start, used = at, 0
        reset = int(start + self.window + 0.999)
        if used >= limit:
            return Decision(False, limit, 0, reset, max(1, int(start + self.window - at + 0.999)))
        if used == 0:
            self._windows.pop(key, None)  # a new window goes to the back: the dict stays oldest first
            self._make_room(at)
        self._windows[key] = (start, used + 1)
        return Decision(True, limit, limit - used - 1, reset, 0)

    def _make_room(self, at: float) -> None:
        while self._windows:
            key, (start, _) = next(iter(self._windows.items()))
            if at >= start + self.window:
                del self._windows[key]
            elif len(self._windows) >= self.max_keys:
                del self._windows[key]
                self.dropped += 1
            else:
                break
