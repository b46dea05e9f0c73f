"""The memory under test and the sweeps over it.

``Region`` is real memory: an anonymous private mapping, locked with mlock(2) where the process may
(RLIMIT_MEMLOCK or CAP_IPC_LOCK; otherwise it stays unlocked and says so), faulted in by writing
every page, and seen by numpy as uint64 words. Physical addresses come from /proc/self/pagemap when
the kernel shows page frame numbers (root, or CAP_SYS_ADMIN); otherwise addresses are the mapping's
offsets and ``address_kind`` says "virtual".

``Engine`` works one step of a pattern over the region in chunks (``chunk_words`` words, 4 MiB by
default: big enough that numpy and memcmp run at memory bandwidth and Python's per-chunk overhead
stays small, small enough that the agent's trio loop gets a turn every millisecond or so). Each sweep is a generator that yields after every chunk, so the same
code runs flat out in the benchmark and cooperatively in the agent. Between a step's write and its
verify the fault model (faults.py), when one is configured, corrupts the region the way a faulty
part would. Mismatches go to ``sink(step, offset, index, mask, values)``: a chunk's mismatch mask
(whole pages: chunks and halves start on page boundaries), the global word offset of its first word,
the index the step's ``expected`` was evaluated at for that word, and a getter of the values at some
positions. Nothing here costs per mismatch: a line fault failing every word is one mask a chunk.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from collections.abc import Callable, Iterator
from typing import Any, Self

import numpy as np

from .patterns import HALVES, U64, Pair, Scratch, Step, same

log = logging.getLogger("fleethub.agent.memtest")

PAGE = mmap.PAGESIZE
WORD = 8
PAGE_WORDS = PAGE // WORD
CHUNK_WORDS = 1 << 19  # 4 MiB
PREPARE_PIECE = 16 << 20
PAGEMAP = "/proc/self/pagemap"
_PFN_MASK = (1 << 55) - 1
_PRESENT = 1 << 63

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mlock.argtypes = _libc.munlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)

# sink(step, offset, index, mask, values): ``values(positions)`` gives (actual, expected) at some
# positions of the mask only, so a line fault failing every word does not cost a gather of every word
Values = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
Sink = Callable[[Step, int, int, np.ndarray, Values], None]


class Region:
    """``Region(n)`` is ready to use; ``Region(n, prepare=False)`` leaves the locking and faulting in
    to ``prepare()``, a generator yielding after every ``PREPARE_PIECE`` bytes, so an agent can map
    gigabytes without stalling its event loop."""

    def __init__(self, nbytes: int, *, lock: bool = True, physical: bool = True, prepare: bool = True) -> None:
        nbytes -= nbytes % (2 * PAGE)
        if nbytes < 2 * PAGE:
            raise ValueError(f"a region needs at least {2 * PAGE} bytes")
        self.nbytes = nbytes
        self._map = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.words = np.frombuffer(self._map, dtype=U64)
        self.address = self.words.ctypes.data
        self.active_words = self.words.size
        self.locked = False
        self.pfns: np.ndarray | None = None
        self._lock, self._physical = lock, physical
        if prepare:
            for _ in self.prepare():
                pass

    def prepare(self) -> Iterator[None]:
        """Lock (mlock also faults in) and write every page, piece by piece; then read the frames."""
        locking = self._lock
        for start in range(0, self.nbytes, PREPARE_PIECE):
            size = min(PREPARE_PIECE, self.nbytes - start)
            if locking and _libc.mlock(ctypes.c_void_p(self.address + start), ctypes.c_size_t(size)) != 0:
                log.info("memtest: mlock refused (%s); testing unlocked memory", os.strerror(ctypes.get_errno()))
                if start:
                    _libc.munlock(ctypes.c_void_p(self.address), ctypes.c_size_t(start))
                locking = False
            self.words[start // WORD: (start + size) // WORD].fill(0)  # fault the pages in
            yield
        self.locked = locking
        self.pfns = self._pagemap() if self._physical else None

    @property
    def address_kind(self) -> str:
        return "physical" if self.pfns is not None else "virtual"

    @property
    def active_bytes(self) -> int:
        return self.active_words * WORD

    def view(self) -> np.ndarray:
        return self.words[: self.active_words]

    def page_address(self, page: int) -> int:
        """The address reported for page number ``page`` of the region (physical when known)."""
        if self.pfns is not None:
            return int(self.pfns[page]) * PAGE
        return page * PAGE

    def _pagemap(self) -> np.ndarray | None:
        pages = self.nbytes // PAGE
        try:
            with open(PAGEMAP, "rb") as f:
                f.seek(self.address // PAGE * 8)
                raw = f.read(pages * 8)
        except OSError:
            return None
        if len(raw) != pages * 8:
            return None
        entries = np.frombuffer(raw, dtype=U64)
        pfns = entries & U64(_PFN_MASK)
        # without the privilege the kernel reports every frame number as 0
        if not bool(np.all(entries & U64(_PRESENT))) or not bool(np.all(pfns)):
            return None
        return pfns.copy()

    def shrink(self, nbytes: int) -> None:
        """Give memory back (Live backing off): the tail past ``nbytes`` is unlocked and dropped."""
        nbytes = max(2 * PAGE, nbytes - nbytes % (2 * PAGE))
        if nbytes >= self.active_bytes:
            return
        tail = self.active_bytes - nbytes
        if self.locked:
            _libc.munlock(ctypes.c_void_p(self.address + nbytes), ctypes.c_size_t(tail))
        self._map.madvise(mmap.MADV_DONTNEED, nbytes, tail)
        self.active_words = nbytes // WORD

    def close(self) -> None:
        if self._map.closed:
            return
        if self.locked:
            _libc.munlock(ctypes.c_void_p(self.address), ctypes.c_size_t(self.nbytes))
        self.active_words = 0
        del self.words
        try:
            self._map.close()
        except BufferError:
            # a numpy view of the mapping is still referenced somewhere: give the memory back now,
            # the mapping itself goes with the last view
            self._map.madvise(mmap.MADV_DONTNEED)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Engine:
    def __init__(self, region: Region, sink: Sink, *, chunk_words: int = CHUNK_WORDS,
                 fault: Any = None) -> None:
        self.region = region
        self.sink = sink
        self.chunk = max(PAGE_WORDS, chunk_words - chunk_words % PAGE_WORDS)
        self.fault = fault  # a faults.FaultModel, or None for memory as it is
        self.verified_bytes = 0  # every verified word counts once per sweep
        self._mask = np.empty(self.chunk, dtype=bool)
        self._differ = np.empty(self.chunk, dtype=bool)
        self.scratch = Scratch(self.chunk)

    def _chunks(self, n: int, reverse: bool = False) -> list[tuple[int, int]]:
        spans = [(s, min(s + self.chunk, n)) for s in range(0, n, self.chunk)]
        return spans[::-1] if reverse else spans

    def _halves(self) -> tuple[np.ndarray, np.ndarray, int]:
        view = self.region.view()
        h = view.size // 2
        return view[:h], view[h: 2 * h], h

    # ---- one step: write, (fault), verify ----

    def step(self, step: Step) -> Iterator[None]:
        yield from self.write(step)
        self.inject(step)
        yield from self.verify(step)

    def _prepared(self, step: Step, slot: int = 0) -> Step:
        if step.scratch is not self.scratch:
            step.prepare(self.scratch, slot)
        return step

    def write(self, step: Step) -> Iterator[None]:
        self._prepared(step)
        if step.check == HALVES:
            a, b, h = self._halves()
            for s, e in self._chunks(h):
                step.write_pair(a[s:e], b[s:e], s)
                yield
        else:
            view = self.region.view()
            for s, e in self._chunks(view.size):
                step.write(view[s:e], s)
                yield
        step.release()

    def inject(self, step: Step, spans: list[tuple[int, int]] | None = None) -> None:
        if self.fault is not None:
            self.fault.corrupt(self.region.view(), spans or [(0, self.region.active_words)], step)

    def conditions(self, *, idle_seconds: float | None = None, temp_c: float | None = None) -> None:
        """What the fault model acts under: seconds since the data was written, temperature."""
        if self.fault is not None:
            if idle_seconds is not None:
                self.fault.idle_seconds = idle_seconds
            if temp_c is not None:
                self.fault.temp_c = temp_c

    def verify(self, step: Step) -> Iterator[None]:
        self._prepared(step)
        if step.check == HALVES:
            a, b, h = self._halves()
            for s, e in self._chunks(h):
                if not same(a[s:e], b[s:e]):
                    self._halves_mismatch(step, a, b, h, s, e)
                self.verified_bytes += 2 * (e - s) * WORD
                yield
        else:
            view = self.region.view()
            for s, e in self._chunks(view.size):
                self._check(step, view, s, e)
                yield
        step.release()

    def _check(self, step: Step, view: np.ndarray, s: int, e: int) -> None:
        mask = self._mask[: e - s]
        if step.mismatch(view[s:e], s, mask):
            self.sink(step, s, s, mask, lambda pos: (view[s + pos], step.expected(pos.astype(U64) + U64(s))))
        self.verified_bytes += (e - s) * WORD

    def _halves_mismatch(self, step: Step, a: np.ndarray, b: np.ndarray, h: int, s: int, e: int) -> None:
        # the halves differ: the expected value says which of the two is wrong (or both are); a word
        # counts only where the halves differ, as memtester's compare sees it
        differ = self._differ[: e - s]
        np.not_equal(a[s:e], b[s:e], out=differ)
        want = step.expected(np.arange(s, e, dtype=U64))
        mask = self._mask[: e - s]
        for half, base in ((a, 0), (b, h)):
            np.not_equal(half[s:e], want, out=mask)
            mask &= differ
            if mask.any():
                self.sink(step, base + s, s, mask,
                          lambda pos, half=half: (half[s + pos], want[pos]))

    # ---- moving inversions (memtest86+): verify and rewrite in one sweep, up then down ----

    def moving_inversion(self, value: Pair) -> Iterator[None]:
        inverse = Pair(value.pattern, value.iteration, ~value.x & 0xFFFF_FFFF_FFFF_FFFF,
                       ~value.y & 0xFFFF_FFFF_FFFF_FFFF)
        yield from self.write(value)
        self.inject(value)
        view = self.region.view()
        value.prepare(self.scratch, 0)
        inverse.prepare(self.scratch, 1)
        for check, then, reverse in ((value, inverse, False), (inverse, value, True)):
            for s, e in self._chunks(view.size, reverse):
                self._check(check, view, s, e)
                then.write(view[s:e], s)
                yield
            self.inject(then)
        value.release()
        inverse.release()

    # ---- confirmation: one page at a time, in place ----

    def retest(self, step: Step, offset: int, index: int, words: int = PAGE_WORDS) -> np.ndarray:
        """Write ``step``'s data (evaluated from ``index`` on) over the words at ``offset``, let the
        fault model act, verify: the global offsets of the words that failed."""
        self.place(step, offset, index, words)
        return self.check(step, offset, index, words)

    def place(self, step: Step, offset: int, index: int, words: int = PAGE_WORDS) -> None:
        self.region.view()[offset: offset + words] = step.expected(np.arange(index, index + words, dtype=U64))

    def check(self, step: Step, offset: int, index: int, words: int = PAGE_WORDS) -> np.ndarray:
        self.inject(step, [(offset, offset + words)])
        want = step.expected(np.arange(index, index + words, dtype=U64))
        self.verified_bytes += words * WORD
        return offset + np.flatnonzero(self.region.view()[offset: offset + words] != want).astype(np.int64)


def drain(sweep: Iterator[None]) -> None:
    """Run a sweep flat out (the benchmark, and work too small to interleave)."""
    for _ in sweep:
        pass
