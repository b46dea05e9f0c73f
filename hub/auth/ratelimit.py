"""Request rate limits by organisation tier (spec, Limits): fixed one-hour windows aligned to the hour.

Pure: the caller passes ``now``. Counters live in this process (one hub process per database today;
several processes will need a shared counter, e.g. in NATS KV or PostgreSQL). A fixed window is what
the X-RateLimit-Reset header can describe exactly: the instant the window ends.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

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


class RateLimiter:
    def __init__(self, window: int = WINDOW_SECONDS) -> None:
        self.window = window
        self._window_start: int | None = None
        self._counts: dict[object, int] = {}

    def hit(self, key: object, limit: int, now: dt.datetime) -> Decision:
        """Count one request for ``key``; a request over the limit is refused and not counted."""
        epoch = int(now.timestamp())
        start = epoch - epoch % self.window
        if start != self._window_start:
            # A new window: every counter starts again, and keys of idle callers do not pile up.
            self._window_start, self._counts = start, {}
        used = self._counts.get(key, 0)
        reset = start + self.window
        if used >= limit:
            return Decision(False, limit, 0, reset, max(1, reset - epoch))
        self._counts[key] = used + 1
        return Decision(True, limit, limit - used - 1, reset, 0)
