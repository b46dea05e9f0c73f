"""The assistant's budget decisions, billing periods and token estimate: pure functions, no IO."""

from __future__ import annotations

import datetime as dt

import pytest

from hub.assistant.budget import (
    ALLOWED,
    BLOCKED,
    SOFT_LIMIT_REACHED,
    decide,
    estimate_tokens,
    period,
    seconds_to_midnight,
)

UTC = dt.UTC
NOON = dt.datetime(2026, 3, 14, 12, 0, tzinfo=UTC)


def _decide(used: int, mine: int = 0, now: dt.datetime = NOON):
    return decide(monthly_tokens=1000, soft_percent=80, used_tokens=used, user_daily_tokens=100,
                  user_used_today=mine, now=now)


@pytest.mark.parametrize("used, state", [(0, ALLOWED), (799, ALLOWED), (800, SOFT_LIMIT_REACHED),
                                         (999, SOFT_LIMIT_REACHED), (1000, BLOCKED), (5000, BLOCKED)])
def test_monthly_budget_states(used, state):
    d = _decide(used)
    assert d.state == state and d.soft_limit_tokens == 800


def test_a_zero_budget_blocks_everything():
    assert decide(monthly_tokens=0, soft_percent=80, used_tokens=0, user_daily_tokens=10, user_used_today=0,
                  now=NOON).state == BLOCKED


def test_fair_use_percent_and_exhaustion():
    assert _decide(0, 0).fair_use_percent == 0.0 and not _decide(0, 0).fair_use_exhausted
    assert _decide(0, 33).fair_use_percent == 33.0
    assert _decide(0, 99).fair_use_exhausted is False
    assert _decide(0, 100).fair_use_exhausted is True and _decide(0, 250).fair_use_percent == 100.0


def test_retry_after_is_the_next_utc_midnight():
    assert _decide(0).retry_after == 12 * 3600
    late = dt.datetime(2026, 3, 14, 23, 59, 59, 500000, tzinfo=UTC)
    assert seconds_to_midnight(late) == 1.0  # never less than a second
    # An instant given in another zone is the same instant.
    plus2 = dt.datetime(2026, 3, 14, 14, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert seconds_to_midnight(plus2) == 12 * 3600


@pytest.mark.parametrize("today, anchor, start, end", [
    (dt.date(2026, 3, 14), 1, dt.date(2026, 3, 1), dt.date(2026, 4, 1)),
    (dt.date(2026, 12, 31), 1, dt.date(2026, 12, 1), dt.date(2027, 1, 1)),
    (dt.date(2026, 3, 14), 15, dt.date(2026, 2, 15), dt.date(2026, 3, 15)),
    (dt.date(2026, 3, 15), 15, dt.date(2026, 3, 15), dt.date(2026, 4, 15)),
    (dt.date(2026, 1, 3), 28, dt.date(2025, 12, 28), dt.date(2026, 1, 28)),
])
def test_billing_period(today, anchor, start, end):
    assert period(today, anchor) == (start, end)


def test_estimate_is_four_characters_per_token_rounded_up():
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
