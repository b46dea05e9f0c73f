"""A fault model for tests and simulated devices: faulty memory, acted out on the tested region.

Real memory on a test machine is (almost always) good, so a simulated device is given a fault
(``fleethub sim --memory-fault KIND``) and the engine calls ``FaultModel.corrupt`` between writing a
step and verifying it. The model changes the region the way such a part would have: it sees the
words just written (``spans``) and the conditions of the moment (``idle_seconds`` since the write,
``temp_c`` from hwsim.py), and everything is deterministic from its seed, so a test knows what a run
must find. Locations are word offsets in the region: on a simulated device the region is its memory.

Kinds (and the verdict a run must reach, see verdict.py):

- ``stuck``: three bits in three words of two pages always read the same value (stuck at 0 or 1).
  Every pattern that writes the other value finds them; confirmation reproduces them in every round;
  the pages are retired. Verdict weak_cells (faults of single cells).
- ``weak``: four cells in three pages lose their charge (1 reads 0) when left alone for
  ``WEAK_RETENTION_S`` seconds or more: only idle decay (a 5-minute wait) finds them; confirmation
  with an idle wait reproduces them; retired. Verdict weak_cells.
- ``data_line``: data bit ``DATA_LINE_BIT`` of every word is stuck at 0 (a broken DQ line). Every page
  fails, always at the same bit. Confirmed, but not retired: retiring pages cannot fix a line.
  Verdict data_line (MemoryFault).
- ``address_line``: address bit ``ADDRESS_LINE_BIT`` (of the word offset) does not switch: the words
  whose offset has it clear and set are one cell, so the later write wins. Only address-dependent
  data (stuck address, random, compare, increment) sees it, and a page written alone reads back what
  was written: confirmation cannot reproduce it, nothing is retired. Verdict address_line
  (MemoryFault) from what the wrong words hold: their partner's data.
- ``thermal``: while the simulated temperature is at or above ``THERMAL_C`` a hot part flips random
  bits at random places (on average ``THERMAL_FLIPS`` per sweep of the whole region, fewer for a
  smaller span). Errors do not repeat in place: one-offs, counted, nothing retired. Verdict thermal.
- ``intermittent``: two cells flip on a fraction (``INTERMITTENT_P``) of the writes that cover them,
  at any temperature. Confirmation sees some rounds fail and others pass, so it runs 8 rounds; a
  page reproduced in at least 2 of them is retired. Verdict unknown (a marginal part, power, or
  noise: the errors do not say which).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine import PAGE_WORDS
from .hwsim import KINDS
from .patterns import U64, Step

WEAK_RETENTION_S = 120.0
DATA_LINE_BIT = 13
ADDRESS_LINE_BIT = 12  # of the word offset: words 32 KiB apart share a cell
THERMAL_C = 70.0
THERMAL_FLIPS = 0.25
INTERMITTENT_P = 0.12


@dataclass(frozen=True)
class Cell:
    word: int
    mask: int
    value: int  # for stuck cells: what the bit reads


def _pages(n_pages: int, count: int, rng: np.random.Generator) -> list[int]:
    # spread over the region, never the same page twice
    return sorted(int(p) for p in rng.choice(n_pages, size=min(count, n_pages), replace=False))


class FaultModel:
    def __init__(self, kind: str, words: int, *, seed: int = 1) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown memory fault {kind!r}: one of {', '.join(KINDS)}")
        if words < 4 * PAGE_WORDS:
            raise ValueError("a fault model needs a region of at least 4 pages")
        self.kind = kind
        self.words = words
        self.seed = seed
        self.idle_seconds = 0.0  # set by the runner before each verify
        self.temp_c = 40.0
        self.injections = 0
        rng = np.random.default_rng(seed)
        n_pages = words // PAGE_WORDS
        self.cells: list[Cell] = []
        if kind == "stuck":
            a, b = _pages(n_pages, 2, rng)
            for page, value in ((a, 0), (a, 1), (b, 0)):
                word = page * PAGE_WORDS + int(rng.integers(PAGE_WORDS))
                self.cells.append(Cell(word, 1 << int(rng.integers(64)), value))
        elif kind == "weak":
            for page in _pages(n_pages, 3, rng):
                self.cells.append(Cell(page * PAGE_WORDS + int(rng.integers(PAGE_WORDS)),
                                       1 << int(rng.integers(64)), 0))
            first = self.cells[0]
            self.cells.append(Cell(first.word ^ 1, 1 << int(rng.integers(64)), 0))  # a neighbour
        elif kind == "intermittent":
            for page in _pages(n_pages, 2, rng):
                self.cells.append(Cell(page * PAGE_WORDS + int(rng.integers(PAGE_WORDS)),
                                       1 << int(rng.integers(64)), 0))

    def _rng(self) -> np.random.Generator:
        self.injections += 1
        return np.random.default_rng([self.seed, self.injections])

    def bad_pages(self) -> set[int]:
        """The region's pages a cell fault lives in (for tests; line and thermal faults have none)."""
        return {c.word // PAGE_WORDS for c in self.cells}

    def corrupt(self, view: np.ndarray, spans: list[tuple[int, int]], step: Step) -> None:
        rng = self._rng()
        n = view.size
        if self.kind in ("stuck", "weak", "intermittent"):
            for cell in self.cells:
                if cell.word >= n or not any(s <= cell.word < e for s, e in spans):
                    continue
                if self.kind == "weak" and self.idle_seconds < WEAK_RETENTION_S:
                    continue
                if self.kind == "intermittent":
                    if rng.random() >= INTERMITTENT_P:
                        continue
                    view[cell.word] ^= U64(cell.mask)
                    continue
                keep = view[cell.word] & ~U64(cell.mask)
                view[cell.word] = keep | (U64(cell.mask) if cell.value else U64(0))
        elif self.kind == "data_line":
            clear = ~U64(1 << DATA_LINE_BIT)
            for s, e in spans:
                np.bitwise_and(view[s:e], clear, out=view[s:e])
        elif self.kind == "address_line":
            bit = 1 << ADDRESS_LINE_BIT
            for s, e in spans:
                e = min(e, n)
                if s % (2 * bit) == 0 and e % (2 * bit) == 0:
                    # whole blocks (the engine's sweeps): each low half takes its high partner's data
                    blocks = view[s:e].reshape(-1, 2, bit)
                    blocks[:, 0, :] = blocks[:, 1, :]
                    continue
                low = np.arange(s, e, dtype=np.int64)
                low = low[(low & bit) == 0]
                high = low | bit
                # a word and its partner are one cell: the later write (the higher offset) wins,
                # when both were written now; a word written alone holds its own data
                both = (high < n) & (high < e)
                view[low[both]] = view[high[both]]
        elif self.kind == "thermal" and self.temp_c >= THERMAL_C:
            for s, e in spans:
                flips = rng.poisson(THERMAL_FLIPS * (e - s) / self.words)
                for _ in range(int(flips)):
                    word = int(rng.integers(s, e))
                    view[word] ^= U64(1 << int(rng.integers(64)))
