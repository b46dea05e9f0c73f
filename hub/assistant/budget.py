"""Budgets, as pure functions of the counts and an instant (no storage, no trio).

- The organisation's monthly token budget, over its billing period (calendar month in UTC unless the
  billing profile sets an anchor day): ``allowed`` below the soft limit, ``soft_limit_reached`` from
  soft_percent of it, ``blocked`` once it is spent (402).
- Each user's daily fair-use allowance, per UTC day: used up → 429 with Retry-After to the next UTC
  midnight.

Every token class (prompt, completion, tool) counts against both.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

DEFAULT_SOFT_PERCENT = 80

ALLOWED = "allowed"
SOFT_LIMIT_REACHED = "soft_limit_reached"
BLOCKED = "blocked"


@dataclass(frozen=True)
class Decision:
    state: str                 # allowed | soft_limit_reached | blocked
    monthly_tokens: int
    soft_limit_tokens: int
    used_tokens: int
    user_daily_tokens: int
    user_used_today: int
    retry_after: float         # seconds to the next UTC midnight (the fair-use reset)

    @property
    def fair_use_exhausted(self) -> bool:
        return self.user_used_today >= self.user_daily_tokens

    @property
    def fair_use_percent(self) -> float:
        if self.user_daily_tokens <= 0:
            return 100.0
        return round(min(100.0, 100.0 * self.user_used_today / self.user_daily_tokens), 2)


def period(today: dt.date, anchor_day: int = 1) -> tuple[dt.date, dt.date]:
    """[start, end) of the billing period holding ``today``; anchor_day 1..28."""
    if today.day >= anchor_day:
        start = today.replace(day=anchor_day)
    else:
        start = (today.replace(day=1) - dt.timedelta(days=1)).replace(day=anchor_day)
    nxt = (start.replace(day=1) + dt.timedelta(days=32)).replace(day=anchor_day)
    return start, nxt


def seconds_to_midnight(now: dt.datetime) -> float:
    tomorrow = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
    return max(1.0, (tomorrow - now.astimezone(dt.UTC)).total_seconds())


def decide(*, monthly_tokens: int, soft_percent: int, used_tokens: int, user_daily_tokens: int,
           user_used_today: int, now: dt.datetime) -> Decision:
    soft = monthly_tokens * soft_percent // 100
    if used_tokens >= monthly_tokens:
        state = BLOCKED
    elif used_tokens >= soft:
        state = SOFT_LIMIT_REACHED
    else:
        state = ALLOWED
    return Decision(state, monthly_tokens, soft, used_tokens, user_daily_tokens, user_used_today,
                    seconds_to_midnight(now))


def estimate_tokens(text: str) -> int:
    """The documented estimate where no model reports usage: one token per four characters, rounded up."""
    return (len(text) + 3) // 4
