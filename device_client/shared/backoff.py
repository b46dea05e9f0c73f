"""Exponential backoff, once for the whole code base: the agent's reconnects (full jitter), the actor
supervisor's restarts, an actor's waits through a storage outage, the hub's retries of tunnel usage it
could not record yet, and the workload's restarts (no jitter: one process, nothing to spread).

The n-th delay's ceiling is ``min(maximum, initial * factor**n)``; with jitter the delay is drawn
uniformly from [0, ceiling] (AWS's "full jitter": a fleet that lost its hub at one moment comes back
spread out, not in waves), without it the delay is the ceiling. Randomness comes in (``rng``), so
a test names its sequence. Pure: no trio, no clock; the caller sleeps.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial: float, maximum: float, rng: random.Random | None = None, *,
                 factor: float = 2.0, jitter: bool = True) -> None:
        if not 0 < initial <= maximum:
            raise ValueError("need 0 < backoff_initial <= backoff_max")
        if factor < 1:
            raise ValueError("a backoff factor below 1 would shrink the delays")
        self.initial, self.maximum, self.factor, self.jitter = initial, maximum, factor, jitter
        self.attempt = 0
        # one shared generator by default: a Random per agent costs ~5 KB, times 15,000 simulated devices
        self._rng = rng or random

    def ceiling(self) -> float:
        return min(self.maximum, self.initial * self.factor**self.attempt)

    def next_delay(self) -> float:
        """The next delay; each call grows the ceiling until it reaches ``maximum``."""
        ceiling = self.ceiling()
        if ceiling < self.maximum:
            self.attempt += 1
        return self._rng.uniform(0, ceiling) if self.jitter else ceiling

    def reset(self) -> None:
        """Things went well (a welcome, a long enough run): start again from ``initial``."""
        self.attempt = 0

    def within(self, window: float) -> float:
        """A delay spread uniformly over ``window`` seconds (a drained hub's reconnect window)."""
        return self._rng.uniform(0, window)
