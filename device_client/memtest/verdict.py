"""What a run found, and what it means.

``Findings`` collects every mismatch the engine reports: the full count, per-page counts, and the
first ``DETAIL_CAP`` mismatches in detail (what was expected and read, which step, the temperature);
results carry the first ``RESULT_ERRORS`` (256) of those.

Verdict rules, first match wins (``verdict``):

1. ``ok``: no mismatch at all.
2. ``data_line``: mismatches on at least ``LINE_MIN_PAGES`` distinct pages, constant data (solid,
   checkerboard, walking bits: the same value at every address) fails too, and at least 90% of the
   detailed mismatches differ from the expected value in one and the same bit: one data line.
3. ``address_line``: mismatches on at least ``LINE_MIN_PAGES`` distinct pages, at least 90% of them
   from address-dependent data (constant data passes: every address holds the same value), and at
   least half of the address-dependent mismatches verified word by word read exactly what the step
   wrote to the word whose offset differs in one address bit, the same bit for all of them: two
   addresses reach one cell.
4. ``thermal``: at least 3 mismatches, no page confirmed as solid or intermittent, and at least 80%
   of the mismatches happened at or above ``THERMAL_C`` (temperature recorded with each mismatch).
5. ``weak_cells``: pages confirmed, and most confirmed pages reproduced in every round (solid): single
   cells that are stuck or leak their charge.
6. ``unknown``: anything else (intermittent pages, one-offs at normal temperature).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .bounds import RESULT_ERRORS
from .engine import PAGE_WORDS, WORD
from .patterns import EXPECTED, U64, Step

DETAIL_CAP = 4096
LINE_MIN_ERRORS = 4
LINE_MIN_PAGES = 8
THERMAL_C = 70.0


@dataclass
class Mismatch:
    offset: int  # word offset in the region
    index: int  # where step.expected was evaluated
    expected: int
    actual: int
    step: Step
    pass_no: int
    temp_c: float | None


@dataclass
class PageFinding:
    """A page confirmation retests (or a result lists): made on demand, never one per failing page."""
    page: int
    errors: int = 0
    step: Step | None = None  # the first step that failed on this page
    shift: int = 0  # word offset minus the index that step's data was evaluated at (halves: the half)
    rounds: int = 0
    reproduced: int = 0
    confirmed: bool | None = None  # None: not retested (over the confirmation cap)
    intermittent: bool = False
    retired: bool = False


class Findings:
    """Every mismatch counted, at a cost per page, not per mismatch: the engine hands over a chunk's
    mismatch mask, and a page's count is one vectorised row sum. Kept per page of the region (numpy
    arrays, 12 bytes a page: 0.3% of the memory tested): the error count and the first step that
    failed there (what confirmation replays). Only the first ``DETAIL_CAP`` mismatches are kept in
    detail, so a line fault failing every word costs the same as a page with one bad cell."""

    def __init__(self, ignored_pages: set[int] | None = None) -> None:
        self.count = 0
        self.address_dependent = 0  # mismatches of steps whose data differs from word to word
        self.details: list[Mismatch] = []
        # a page's count: 512 words a sweep, a few thousand sweeps a run: far below 2**32
        self.counts = np.zeros(0, dtype=np.uint32)
        self.first_step = np.zeros(0, dtype=np.int32)  # index into self.steps; -1: no error yet
        self.first_shift = np.zeros(0, dtype=np.int32)  # in pages: offset - index of that step
        self.steps: list[Step] = []
        self._step_ids: dict[int, int] = {}
        self.pages: dict[int, PageFinding] = {}  # the pages retested or described, by page number
        self.ignored = np.array(sorted(ignored_pages or ()), dtype=np.int64)  # retired pages: out of use
        self.pass_no = 1
        self.temp_c: float | None = None

    def reserve(self, n_pages: int) -> None:
        """Room for page numbers below ``n_pages`` (the runner calls it once the region is mapped)."""
        if n_pages <= self.counts.size:
            return
        n = max(n_pages, 2 * self.counts.size)
        grow = n - self.counts.size
        self.counts = np.concatenate((self.counts, np.zeros(grow, dtype=np.uint32)))
        self.first_step = np.concatenate((self.first_step, np.full(grow, -1, dtype=np.int32)))
        self.first_shift = np.concatenate((self.first_shift, np.zeros(grow, dtype=np.int32)))

    def _step_id(self, step: Step) -> int:
        key = id(step)
        if key not in self._step_ids:
            self._step_ids[key] = len(self.steps)
            self.steps.append(step)
        return self._step_ids[key]

    def add(self, step: Step, offset: int, index: int, mask: np.ndarray,
            values: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) -> None:
        """The engine's sink: ``mask[i]`` true when word ``offset + i`` failed, its data evaluated at
        ``index + i``; ``values(positions)`` gives (actual, expected) at positions of the mask."""
        if offset % PAGE_WORDS or mask.size % PAGE_WORDS:
            raise ValueError("the engine hands over whole pages")
        rows = mask.reshape(-1, PAGE_WORDS)
        per_page = np.add.reduce(rows.view(np.uint8), axis=1, dtype=np.uint16)  # <= 512 a page
        first = offset // PAGE_WORDS
        if self.ignored.size:
            lo, hi = np.searchsorted(self.ignored, (first, first + per_page.size))
            per_page[self.ignored[lo:hi] - first] = 0
        bad = np.flatnonzero(per_page)
        if bad.size == 0:
            return
        found = per_page[bad]
        total = int(found.sum(dtype=np.int64))
        self.count += total
        if step.address_dependent:
            self.address_dependent += total
        self.reserve(first + per_page.size)
        pages = first + bad
        self.counts[pages] += found
        new = pages[self.first_step[pages] < 0]
        if new.size:
            self.first_step[new] = self._step_id(step)
            self.first_shift[new] = (offset - index) // PAGE_WORDS
        room = DETAIL_CAP - len(self.details)
        if room > 0:
            # the first ``room`` mismatches, from as few pages as hold them
            upto = int(np.searchsorted(np.cumsum(found), room)) + 1
            r, c = np.nonzero(rows[bad[:upto]])
            pos = (bad[:upto][r] * PAGE_WORDS + c)[:room]
            actual, expected = values(pos)
            self.details.extend(
                Mismatch(offset + p, index + p, int(expected[k]), int(actual[k]), step, self.pass_no, self.temp_c)
                for k, p in enumerate(pos.tolist()))

    # ---- what was found, page by page ----

    def pages_with_errors(self) -> int:
        return int(np.count_nonzero(self.counts))

    def top(self, n: int) -> list[int]:
        """Up to ``n`` page numbers with errors, the most errors first (then the lowest page)."""
        bad = np.flatnonzero(self.counts)
        if bad.size > n:
            # the n-th largest count, then every page above it and the lowest pages equal to it
            cut = np.partition(self.counts[bad], bad.size - n)[bad.size - n]
            above = bad[self.counts[bad] > cut]
            bad = np.concatenate((above, bad[self.counts[bad] == cut][: n - above.size]))
        order = np.lexsort((bad, -self.counts[bad].astype(np.int64)))
        return bad[order].tolist()

    def page(self, page: int) -> PageFinding:
        """The page's finding (made once, then the same object: confirmation settles it)."""
        pf = self.pages.get(page)
        if pf is None:
            sid = int(self.first_step[page]) if page < self.first_step.size else -1
            pf = self.pages[page] = PageFinding(
                page, errors=int(self.counts[page]) if page < self.counts.size else 0,
                step=self.steps[sid] if sid >= 0 else None,
                shift=int(self.first_shift[page]) * PAGE_WORDS if sid >= 0 else 0)
        return pf

    def bad_page_numbers(self, limit: int) -> list[int]:
        """The first ``limit`` failing page numbers in address order."""
        return np.flatnonzero(self.counts)[:limit].tolist()

    def confirmed_pages(self) -> list[PageFinding]:
        return [p for p in self.pages.values() if p.confirmed]


def _address_line(findings: Findings) -> bool:
    if findings.pages_with_errors() < LINE_MIN_PAGES or findings.address_dependent < 0.9 * findings.count:
        return False
    candidates = [m for m in findings.details if m.step.address_dependent and m.step.check == EXPECTED]
    candidates = candidates[:RESULT_ERRORS]
    if len(candidates) < LINE_MIN_ERRORS:
        return False
    bits: Counter[int] = Counter()
    for m in candidates:
        partners = np.array([m.index ^ (1 << k) for k in range(40)], dtype=U64)
        hits = np.flatnonzero(m.step.expected(partners) == U64(m.actual))
        if hits.size:
            bits[int(hits[0])] += 1
    return bool(bits) and bits.most_common(1)[0][1] * 2 >= len(candidates)


def _data_line(findings: Findings) -> bool:
    constant = findings.count - findings.address_dependent
    if findings.pages_with_errors() < LINE_MIN_PAGES or not findings.details or constant == 0:
        return False
    bits: Counter[int] = Counter()
    for m in findings.details:
        diff = m.expected ^ m.actual
        for k in range(64):
            if diff >> k & 1:
                bits[k] += 1
    return bits.most_common(1)[0][1] >= 0.9 * len(findings.details)


def verdict(findings: Findings) -> str:
    if findings.count == 0:
        return "ok"
    if _data_line(findings):
        return "data_line"
    if _address_line(findings):
        return "address_line"
    confirmed = findings.confirmed_pages()
    hot = [m for m in findings.details if m.temp_c is not None and m.temp_c >= THERMAL_C]
    if findings.count >= 3 and not confirmed and len(hot) >= 0.8 * len(findings.details):
        return "thermal"
    if confirmed and sum(not p.intermittent for p in confirmed) * 2 > len(confirmed):
        return "weak_cells"
    return "unknown"


def error_entry(m: Mismatch, address_of_page: Any, confirmed_pages: set[int] | frozenset[int] = frozenset()
                ) -> dict[str, Any]:
    """One entry of a result's ``errors``: the spec's members (physAddr, expected, actual, mask,
    pattern, pass, tempMilliC, confirmed) and two documented extensions (offset: bytes into the tested
    region; iteration: the step of the pattern). physAddr is physical when the result's addressKind is
    physical, else the address in the tested mapping."""
    page = m.offset // PAGE_WORDS
    return {"physAddr": address_of_page(page) + (m.offset % PAGE_WORDS) * WORD,
            "expected": f"{m.expected:#018x}", "actual": f"{m.actual:#018x}",
            "mask": f"{m.expected ^ m.actual:#018x}", "pattern": m.step.pattern, "pass": m.pass_no,
            "tempMilliC": None if m.temp_c is None else int(m.temp_c * 1000),
            "confirmed": page in confirmed_pages,
            "offset": m.offset * WORD, "iteration": m.step.iteration}
