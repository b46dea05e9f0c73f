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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .engine import PAGE_WORDS, WORD
from .patterns import EXPECTED, U64, Step

DETAIL_CAP = 4096
RESULT_ERRORS = 256
LINE_MIN_ERRORS = 4
LINE_MIN_PAGES = 8
THERMAL_C = 70.0
MAX_SAMPLES_PER_PAGE = 4


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
    page: int
    errors: int = 0
    samples: list[Mismatch] = field(default_factory=list)  # for the in-place retest
    rounds: int = 0
    reproduced: int = 0
    confirmed: bool | None = None  # None: not retested (over the confirmation cap)
    intermittent: bool = False
    retired: bool = False


_EMPTY = PageFinding(-1)


class Findings:
    def __init__(self, ignored_pages: set[int] | None = None) -> None:
        self.count = 0
        self.address_dependent = 0  # mismatches of steps whose data differs from word to word
        self.details: list[Mismatch] = []
        self.pages: dict[int, PageFinding] = {}
        self.ignored = ignored_pages or set()  # retired pages of a simulated device: out of use
        self.pass_no = 1
        self.temp_c: float | None = None

    def add(self, step: Step, offsets: np.ndarray, idx: np.ndarray,
            values: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) -> None:
        """The engine's sink: ``offsets`` ascending; ``values(positions)`` → (actual, expected)."""
        pages = offsets // PAGE_WORDS
        pos = np.arange(offsets.size)
        if self.ignored:
            keep = ~np.isin(pages, np.fromiter(self.ignored, dtype=np.int64))
            pages, pos = pages[keep], pos[keep]
        if pos.size == 0:
            return
        self.count += int(pos.size)
        if step.address_dependent:
            self.address_dependent += int(pos.size)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(pages)) + 1))
        counts = np.diff(np.concatenate((starts, [pages.size])))
        want_pages = [i for i, page in enumerate(pages[starts].tolist())
                      if len(self.pages.get(page, _EMPTY).samples) < MAX_SAMPLES_PER_PAGE]
        room = max(0, DETAIL_CAP - len(self.details))
        chosen = np.unique(np.concatenate((pos[starts[want_pages]] if want_pages else pos[:0],
                                           pos[:room])))
        actual, expected = values(chosen)
        found = {int(p): Mismatch(int(offsets[p]), int(idx[p]), int(expected[k]), int(actual[k]), step,
                                  self.pass_no, self.temp_c) for k, p in enumerate(chosen.tolist())}
        for k, page in enumerate(pages[starts].tolist()):
            pf = self.pages.get(page)
            if pf is None:
                pf = self.pages[page] = PageFinding(page)
            pf.errors += int(counts[k])
            first = found.get(int(pos[starts[k]]))
            if first is not None and len(pf.samples) < MAX_SAMPLES_PER_PAGE:
                pf.samples.append(first)
        self.details.extend(found[int(p)] for p in pos[:room].tolist())

    def confirmed_pages(self) -> list[PageFinding]:
        return [p for p in self.pages.values() if p.confirmed]


def _address_line(findings: Findings) -> bool:
    if len(findings.pages) < LINE_MIN_PAGES or findings.address_dependent < 0.9 * findings.count:
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
    if len(findings.pages) < LINE_MIN_PAGES or not findings.details or constant == 0:
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


def error_entry(m: Mismatch, address_of_page: Any) -> dict[str, Any]:
    page = m.offset // PAGE_WORDS
    base = address_of_page(page)
    return {"address": base + (m.offset % PAGE_WORDS) * WORD, "page": base, "offset": m.offset * WORD,
            "expected": f"{m.expected:#018x}", "actual": f"{m.actual:#018x}",
            "bits": f"{m.expected ^ m.actual:#018x}", "pattern": m.step.pattern,
            "iteration": m.step.iteration, "pass": m.pass_no,
            "tempMilliC": None if m.temp_c is None else int(m.temp_c * 1000)}
