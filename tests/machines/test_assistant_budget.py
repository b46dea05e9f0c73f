"""The assistant's budget decisions, billing periods and token estimate: pure functions, no IO."""

from __future__ import annotations

import datetime as dt

import pytest

from hub.assistant.budget import (
    ALLOWED,
    BLOCKED,
    BUDGET,
    FAIR_USE,
    SOFT_LIMIT_REACHED,
    admit,
    decide,
    estimate_tokens,
    reserve_for,
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


def _admit(used=0, held=0, reserve=100, monthly=1000, user_used=0, user_held=0, daily=10_000):
    return admit(monthly_tokens=monthly, used_tokens=used, held_tokens=held, user_daily_tokens=daily,
                 user_used_today=user_used, user_held_tokens=user_held, reserve=reserve)


def test_an_answer_alone_may_start_on_what_is_left():
    assert _admit(used=999, reserve=5000) is None
    assert _admit(used=1000) == BUDGET


def test_beside_answers_in_progress_the_reservation_must_fit():
    assert _admit(used=500, held=400, reserve=100) is None       # 1000: fits exactly
    assert _admit(used=500, held=400, reserve=101) == BUDGET
    assert _admit(used=0, held=1000, reserve=1) == BUDGET         # all of it held


def test_the_daily_allowance_holds_the_same_way():
    assert _admit(user_used=50, user_held=0, reserve=500, daily=100) is None
    assert _admit(user_used=50, user_held=10, reserve=50, daily=100) == FAIR_USE
    assert _admit(user_used=100, daily=100) == FAIR_USE


def test_a_reservation_is_the_prompt_and_the_completion_it_may_write():
    assert reserve_for(120, 4096) == 4216 and reserve_for(-3, 10) == 10
