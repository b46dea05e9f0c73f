"""The test patterns: what each one writes, and what any word must read back.

Every pattern is a list of steps. A step knows two things:

- ``expected(idx)``: the value word ``idx`` must hold after the step, as a pure function of the
  index (and the step's constants or seed). That is what lets one page be retested in place, alone:
  confirmation writes ``expected`` for that page's indices and verifies it.
- ``write(arr, start)``: the fast way to put the step's data into ``arr`` (words ``start`` onwards),
  which for the compare patterns is an in-place operation on what the previous step left there.

Random data comes from splitmix64 of (seed, index): a counter-based generator, so any word of a run
can be recomputed from the run's seed without replaying the words before it.

The memtester-equivalent suite follows memtester 4.x (stuck address, random value, compare
XOR/SUB/MUL/DIV/OR/AND, sequential increment, solid bits, block sequential, checkerboard, bit
spread, bit flip, walking ones, walking zeros), with the same iteration counts, so the benchmark
compares equal work. Random value and the compare patterns (``HALVES``) fill both halves of the
region with the same data and compare the halves, as memtester does; every other step verifies
against ``expected`` directly. Moving inversions (memtest86+) and idle decay (bit fade) complete the
spec's list; they are run by the engine specially (they verify and rewrite in one sweep, or wait).
"""

from __future__ import annotations

import ctypes
import abc
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

U64 = np.uint64
ALL = 0xFFFF_FFFF_FFFF_FFFF
CHECKER1 = 0x5555_5555_5555_5555
CHECKER2 = 0xAAAA_AAAA_AAAA_AAAA
_GOLDEN = U64(0x9E37_79B9_7F4A_7C15)
_MIX1 = U64(0xBF58_476D_1CE4_E5B9)
_MIX2 = U64(0x94D0_49BB_1331_11EB)

_libc = ctypes.CDLL(None)
_libc.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_libc.memcmp.restype = ctypes.c_int

HALVES = "halves"      # fill both halves alike, compare them (memtester's compare_regions)
EXPECTED = "expected"  # compare every word with expected(idx)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal contents, by libc memcmp: the common case (no error) at memory bandwidth; numpy's
    elementwise compare only runs to find where a difference is."""
    return a.size == b.size and _libc.memcmp(a.ctypes.data, b.ctypes.data, a.nbytes) == 0


def splitmix64(seed: int, idx: np.ndarray) -> np.ndarray:
    """Word ``idx`` of the random stream ``seed``: splitmix64's finaliser over seed + (idx+1)*golden."""
    z = idx.astype(U64, copy=True)
    z += U64(1)
    z *= _GOLDEN
    z += U64(seed & ALL)
    t = np.empty_like(z)
    for shift, mul in ((30, _MIX1), (27, _MIX2)):
        np.right_shift(z, U64(shift), out=t)
        z ^= t
        z *= mul
    np.right_shift(z, U64(31), out=t)
    z ^= t
    return z


class Scratch:
    """Reusable buffers for one engine: an index ramp and alternating-word templates, so a sweep
    runs at memcpy/memcmp speed instead of numpy's slow small-period broadcasts."""

    def __init__(self, words: int) -> None:
        self.words = words
        self._ramp = np.arange(words, dtype=U64)
        self._idx = np.empty(words, dtype=U64)
        self._templates = [np.empty(words, dtype=U64) for _ in range(2)]

    def indices(self, start: int, n: int) -> np.ndarray:
        out = self._idx[:n]
        np.add(self._ramp[:n], U64(start), out=out)
        return out

    def template(self, x: int, y: int, slot: int = 0) -> np.ndarray:
        t = self._templates[slot]
        t[0], t[1] = x, y
        filled = 2
        while filled < t.size:  # doubling copies: log2(n) memcpys
            n = min(filled, t.size - filled)
            t[filled: filled + n] = t[:n]
            filled += n
        return t


class Step(abc.ABC):
    check = EXPECTED
    address_dependent = False  # its data differs from word to word (it can reveal address aliasing)

    def __init__(self, pattern: str, iteration: int = 0) -> None:
        self.pattern = pattern
        self.iteration = iteration
        self.scratch: Scratch | None = None

    def prepare(self, scratch: Scratch, slot: int = 0) -> None:
        """Called by the engine before a sweep of this step; write/mismatch may then use it."""
        self.scratch = scratch

    def release(self) -> None:
        """The sweep is over: forget the scratch buffers (the next step reuses them)."""
        self.scratch = None

    @abc.abstractmethod
    def expected(self, idx: np.ndarray) -> np.ndarray:
        """The words this step writes at word indices ``idx``."""

    def _expected_chunk(self, start: int, n: int) -> np.ndarray:
        if self.scratch is not None and n <= self.scratch.words:
            return self.expected(self.scratch.indices(start, n))
        return self.expected(np.arange(start, start + n, dtype=U64))

    def write(self, arr: np.ndarray, start: int) -> None:
        arr[:] = self._expected_chunk(start, arr.size)

    def write_pair(self, a: np.ndarray, b: np.ndarray, start: int) -> None:
        self.write(a, start)
        self.write(b, start)

    def mismatch(self, arr: np.ndarray, start: int, out: np.ndarray) -> bool:
        """Mark in ``out`` (bool, arr's size) the words that differ from expected; any marked?"""
        want = self._expected_chunk(start, arr.size)
        if same(arr, want):
            return False
        np.not_equal(arr, want, out=out)
        return bool(out.any())

    def __repr__(self) -> str:
        return f"<{self.pattern}[{self.iteration}]>"


class Pair(Step):
    """Even words ``x``, odd words ``y`` (a constant when x == y). Chunks start on even words."""

    def __init__(self, pattern: str, iteration: int, x: int, y: int | None = None) -> None:
        super().__init__(pattern, iteration)
        self.x, self.y = x & ALL, (x if y is None else y) & ALL
        self._tmpl: np.ndarray | None = None

    def prepare(self, scratch: Scratch, slot: int = 0) -> None:
        super().prepare(scratch, slot)
        self._tmpl = scratch.template(self.x, self.y, slot)

    def expected(self, idx: np.ndarray) -> np.ndarray:
        return np.where(idx % U64(2) == 0, U64(self.x), U64(self.y))

    def _template(self, n: int) -> np.ndarray:
        if self._tmpl is None or n > self._tmpl.size:
            self._tmpl = Scratch(n).template(self.x, self.y)
        return self._tmpl[:n]

    def write(self, arr: np.ndarray, start: int) -> None:
        if self.x == self.y:
            arr.fill(self.x)
        else:
            arr[:] = self._template(arr.size)

    def mismatch(self, arr: np.ndarray, start: int, out: np.ndarray) -> bool:
        want = self._template(arr.size)
        if same(arr, want):
            return False
        np.not_equal(arr, want, out=out)
        return bool(out.any())

    def release(self) -> None:
        super().release()
        self._tmpl = None


class Address(Step):
    """memtester's stuck address: each word holds its own index, or its complement on alternate
    words (alternating with the iteration), so a word that answers for another word is caught."""

    address_dependent = True

    def expected(self, idx: np.ndarray) -> np.ndarray:
        flip = (idx + U64(self.iteration)) & U64(1)
        return idx ^ (U64(0) - flip)

    def _expected_chunk(self, start: int, n: int) -> np.ndarray:
        if self.scratch is None or n > self.scratch.words:
            return super()._expected_chunk(start, n)
        out = self.scratch.indices(start, n)
        np.bitwise_xor(out, self._mask[:n], out=out)
        return out

    def prepare(self, scratch: Scratch, slot: int = 0) -> None:
        super().prepare(scratch, slot)
        # chunks start on even words: the complement mask is an alternating template
        odd = self.iteration % 2
        self._mask = scratch.template(ALL if odd else 0, 0 if odd else ALL, 1)


class Increment(Step):
    check = HALVES
    address_dependent = True

    def __init__(self, pattern: str, q: int) -> None:
        super().__init__(pattern)
        self.q = q & ALL

    def expected(self, idx: np.ndarray) -> np.ndarray:
        return idx + U64(self.q)


class Random(Step):
    check = HALVES
    address_dependent = True

    def __init__(self, pattern: str, seed: int, iteration: int = 0) -> None:
        super().__init__(pattern, iteration)
        self.seed = seed & ALL

    def expected(self, idx: np.ndarray) -> np.ndarray:
        return splitmix64(self.seed, idx)

    def write_pair(self, a: np.ndarray, b: np.ndarray, start: int) -> None:
        a[:] = self.expected(np.arange(start, start + a.size, dtype=U64))
        b[:] = a


def _div(x: np.ndarray, q: int) -> np.ndarray:
    return x // U64(q)


_OPS: dict[str, Callable[[np.ndarray, np.uint64], np.ndarray]] = {
    "xor": np.bitwise_xor, "sub": np.subtract, "mul": np.multiply, "or": np.bitwise_or, "and": np.bitwise_and,
}


class Op(Step):
    """memtester's compare tests: apply ``op q`` in place to what the previous step left."""

    check = HALVES
    address_dependent = True

    def __init__(self, pattern: str, prev: Step, op: str, q: int) -> None:
        super().__init__(pattern)
        self.prev, self.op, self.q = prev, op, (q & ALL) or 1  # memtester: a zero divisor becomes 1

    def _apply(self, x: np.ndarray, out: np.ndarray) -> None:
        if self.op == "div":
            np.floor_divide(x, U64(self.q), out=out)
        else:
            _OPS[self.op](x, U64(self.q), out=out)

    def expected(self, idx: np.ndarray) -> np.ndarray:
        x = self.prev.expected(idx)
        self._apply(x, x)
        return x

    def write(self, arr: np.ndarray, start: int) -> None:
        self._apply(arr, arr)


@dataclass
class Pattern:
    name: str
    steps: list[Step] = field(default_factory=list)
    special: str | None = None  # "moving_inversions" | "idle_decay": run by the engine/runner


def _rand64(seed: int, n: int) -> int:
    return int(splitmix64(seed ^ 0x5EED, np.array([n], dtype=U64))[0])


def memtester_suite(seed: int) -> list[Pattern]:
    """memtester 4.x's tests in its order and iteration counts (8/16-bit writes excepted)."""
    out = [Pattern("stuck_address", [Address("stuck_address", j) for j in range(16)])]
    rnd = Random("random_value", seed)
    out.append(Pattern("random_value", [rnd]))
    prev: Step = rnd
    for k, op in enumerate(("xor", "sub", "mul", "div", "or", "and")):
        prev = Op(f"compare_{op}", prev, op, _rand64(seed, k))
        out.append(Pattern(f"compare_{op}", [prev]))
    out.append(Pattern("sequential_increment", [Increment("sequential_increment", _rand64(seed, 9))]))
    out.append(Pattern("solid_bits", [Pair("solid_bits", j, q, ~q) for j in range(64)
                                      for q in [ALL if j % 2 == 0 else 0]]))
    out.append(Pattern("block_sequential", [Pair("block_sequential", j, j * 0x0101_0101_0101_0101)
                                            for j in range(256)]))
    out.append(Pattern("checkerboard", [Pair("checkerboard", j, q, ~q) for j in range(64)
                                        for q in [CHECKER1 if j % 2 == 0 else CHECKER2]]))
    spread = []
    for j in range(128):
        q = (1 << j) | (1 << (j + 2)) if j < 64 else (1 << (127 - j)) | (1 << (129 - j))
        spread.append(Pair("bit_spread", j, q & ALL, ~q & ALL))
    out.append(Pattern("bit_spread", spread))
    flips = []
    for k in range(64):
        q = 1 << k
        for j in range(8):
            q = ~q & ALL
            flips.append(Pair("bit_flip", k * 8 + j, q, ~q & ALL))
    out.append(Pattern("bit_flip", flips))
    walk = [(1 << j) if j < 64 else (1 << (127 - j)) for j in range(128)]
    out.append(Pattern("walking_ones", [Pair("walking_ones", j, q) for j, q in enumerate(walk)]))
    out.append(Pattern("walking_zeros", [Pair("walking_zeros", j, ~q & ALL) for j, q in enumerate(walk)]))
    return out


MOVING_INVERSION_VALUES = (0, CHECKER1)
IDLE_DECAY_VALUE = ALL  # charged cells: a leaky cell decays to 0


def full_suite(seed: int, *, idle_decay: bool) -> list[Pattern]:
    """Every pattern the spec names, in the order a run works them."""
    suite = memtester_suite(seed)
    suite.append(Pattern("moving_inversions", [Pair("moving_inversions", i, v)
                                               for i, v in enumerate(MOVING_INVERSION_VALUES)],
                         special="moving_inversions"))
    if idle_decay:
        suite.append(Pattern("idle_decay", [Pair("idle_decay", 0, IDLE_DECAY_VALUE)], special="idle_decay"))
    return suite


def targeted_steps(failed: Step) -> list[Step]:
    """What confirmation retests a page with: the step that failed, replayed, then solid zeros and
    ones and both checkerboards (every cell in both states, neighbours opposite)."""
    return [failed, Pair("confirm_zeros", 0, 0), Pair("confirm_ones", 0, ALL),
            Pair("confirm_checker", 0, CHECKER1, CHECKER2), Pair("confirm_checker", 1, CHECKER2, CHECKER1)]
