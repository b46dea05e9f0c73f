"""Budgets, as pure functions of the counts and an instant (no storage, no trio).

- The organisation's monthly token budget, over its billing period (calendar month in UTC unless the
  billing profile sets an anchor day): ``allowed`` below the soft limit, ``soft_limit_reached`` from
  soft_percent of it, ``blocked`` once it is spent (402).
- Each user's daily fair-use allowance, per UTC day: used up → 429 with Retry-After to the next UTC
  midnight.

Every token class (prompt, completion, tool) counts against both.

Answers in progress hold a reservation (``reserve_for``) that counts against both limits until the
answer ends and its actual tokens are added instead. ``admit`` lets a request in only when its own
reservation fits beside the holds of the answers in progress; an answer alone may start with any part of
the budget left. So the budget is overspent by at most one answer (the lone one that started on what
was left) plus what answers using tools took beyond their reservation, however many chats run at once
and on however many hub nodes (the holds live in PostgreSQL, decided under one lock per organisation).
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


# Refusals of ``admit``: the organisation's budget or the caller's daily allowance.
BUDGET = "budget"
FAIR_USE = "fair_use"


def reserve_for(prompt_tokens: int, completion_cap: int) -> int:
    """What an answer holds while it runs: its prompt as estimated plus the completion it may write."""
    return max(0, prompt_tokens) + max(0, completion_cap)


def admit(*, monthly_tokens: int, used_tokens: int, held_tokens: int, user_daily_tokens: int,
          user_used_today: int, user_held_tokens: int, reserve: int) -> str | None:
    """None to answer, or which limit refuses. Used tokens are settled ones; held ones belong to answers
    in progress. With nothing held, anything left of a limit admits; with answers in progress, this
    one's reservation must fit beside theirs."""
    def over(limit: int, used: int, held: int) -> bool:
        if used + held >= limit:
            return True
        return held > 0 and used + held + reserve > limit

    if over(monthly_tokens, used_tokens, held_tokens):
        return BUDGET
    if over(user_daily_tokens, user_used_today, user_held_tokens):
        return FAIR_USE
    return None


def estimate_tokens(text: str) -> int:
    """The documented estimate where no model reports usage: one token per four characters, rounded up."""
    return (len(text) + 3) // 4
