"""Confirmation: is a failing page's error reproducible?

Each failing page (at most ``CONFIRM_MAX_PAGES``, those with the most errors first; the rest are
counted, not retested) is retested in place, alone, with targeted patterns: the step that failed,
replayed for that page's words (patterns.py can recompute any word), then solid zeros, solid ones
and both checkerboards. A page whose error came from idle decay gets the idle decay again: the
targeted data, one ``IDLE_DECAY_S`` wait for all such pages of the round, then the verify.

A round reproduces the error when any of its patterns fails on the page. Rules (spec: Bad page
handling):

- 3 rounds. Reproduced in all 3: confirmed (a solid error). In none: a one-off, counted only.
- Reproduced in some but not all: the page looks intermittent, so it gets 8 rounds in all, and is
  confirmed when at least 2 of the 8 reproduced it (more than once: not a one-off).

Only confirmed pages may be retired (runner.py decides, see retire.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .engine import PAGE_WORDS, Engine
from .patterns import targeted_steps
from .verdict import Findings, PageFinding

ROUNDS = 3
INTERMITTENT_ROUNDS = 8
INTERMITTENT_MIN = 2
CONFIRM_MAX_PAGES = 64
IDLE_DECAY_S = 300.0


def candidates(findings: Findings) -> list[PageFinding]:
    return [findings.page(p) for p in findings.top(CONFIRM_MAX_PAGES)]


def _decided(page: PageFinding) -> bool:
    if page.rounds >= INTERMITTENT_ROUNDS:
        return True
    if page.rounds == ROUNDS:
        return page.reproduced in (0, ROUNDS)
    return False


def _settle(page: PageFinding) -> None:
    if page.rounds == ROUNDS and page.reproduced == ROUNDS:
        page.confirmed = True
    elif page.rounds == ROUNDS and page.reproduced == 0:
        page.confirmed = False
    else:
        page.intermittent = True
        page.confirmed = page.reproduced >= INTERMITTENT_MIN


def _where(page: PageFinding) -> tuple[int, int]:
    """Global word offset of the page and the index its first word's data was computed at by the
    step that failed there (for a compare of halves, the upper half's data is the lower's)."""
    start = page.page * PAGE_WORDS
    return start, start - page.shift


async def confirm(findings: Findings, engine: Engine, *, pause: Callable[[], Awaitable[None]],
                  idle_wait: Callable[[float], Awaitable[None]]) -> list[PageFinding]:
    """Retest the candidate pages round by round; returns the pages retested (each settled)."""
    pages = candidates(findings)
    while True:
        todo = [p for p in pages if not _decided(p)]
        if not todo:
            break
        decaying = [p for p in todo if p.step is not None and p.step.pattern == "idle_decay"]
        for page in todo:
            if page in decaying:
                continue
            failed = page.step
            assert failed is not None  # a candidate has errors, so a first failing step
            hit = False
            for step in targeted_steps(failed):
                offset, index = _where(page) if step is failed else (page.page * PAGE_WORDS,) * 2
                if engine.retest(step, offset, index).size:
                    hit = True
                await pause()
            page.rounds += 1
            page.reproduced += hit
        if decaying:
            for page in decaying:
                engine.place(page.step, *_where(page))
            await idle_wait(IDLE_DECAY_S)
            for page in decaying:
                offset, index = _where(page)
                page.rounds += 1
                page.reproduced += bool(engine.check(page.step, offset, index).size)
            engine.conditions(idle_seconds=0.0)
    for page in pages:
        _settle(page)
    return pages
