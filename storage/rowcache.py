"""A small read cache of rows by key, for the hottest single-row reads (GET /v1/devices/{id}).

Every write that goes through a repository evicts the rows it touches in this process before it
returns, so a reader here sees its own writes at once. Another hub process's write is seen within
``ttl`` seconds (trio time): reads of a device record are allowed to be that stale across processes,
its live state (online, last seen) comes from the device's actor anyway. A read that decides a write
(what configuration version a device is sent) goes past the cache (storage/devices.py ``current``). A cache that must not be
stale at all (``ttl=math.inf``, storage/devices.py's identities) is evicted by the database's own
notifications instead (a trigger's NOTIFY reaches every process).

A read that raced a write must not put back the row the write replaced: ``generation`` counts
evictions, a reader notes it before its query and ``put(..., seen=...)`` keeps nothing when an
eviction came in between (the read may have seen the row before the write).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable
from typing import Any

import trio


class RowCache:
    def __init__(self, ttl: float = 2.0, max_entries: int = 100_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._rows: dict[Hashable, tuple[float, Any]] = {}
        self.hits = 0
        self.misses = 0
        self.generation = 0  # evictions so far (see the module docstring)

    def get(self, key: Hashable) -> Any | None:
        entry = self._rows.get(key)
        if entry is None or entry[0] < trio.current_time():
            self.misses += 1
            return None
        self.hits += 1
        return entry[1]

    def put(self, key: Hashable, row: Any, *, seen: int | None = None) -> None:
        """Keep ``row``; ``seen``: the ``generation`` noted before the read that produced it."""
        if seen is not None and seen != self.generation:
            return
        now = trio.current_time()
        self._rows.pop(key, None)  # re-inserted at the end: the dict stays in expiry order
        self._rows[key] = (now + self.ttl, row)
        # Expired entries leave from the front as new ones arrive, so the cache holds only what was
        # read in the last ``ttl`` seconds (a row per device that reconnected, otherwise, for ever).
        for old in list(itertools.islice(self._rows, 8)):
            if self._rows[old][0] >= now:
                break
            del self._rows[old]
        if len(self._rows) > self.max_entries:
            self._rows.pop(next(iter(self._rows)))

    def evict(self, keys: Iterable[Hashable]) -> None:
        self.generation += 1
        for key in keys:
            self._rows.pop(key, None)

    def clear(self) -> None:
        self.generation += 1
        self._rows.clear()

    def __len__(self) -> int:
        return len(self._rows)

    def purge(self) -> int:
        """Drop every expired row; returns how many. ``put`` sweeps only a few as new rows arrive, so
        without this the rows read during a connect storm (one per device) stay until the next reads."""
        now, gone = trio.current_time(), 0
        for key in list(self._rows):
            if self._rows[key][0] >= now:
                break  # insertion order is expiry order: the rest are newer
            del self._rows[key]
            gone += 1
        return gone

    async def keep_purged(self, every: float = 5.0, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """``purge`` every ``every`` seconds, for as long as the caller's nursery runs."""
        task_status.started()
        while True:
            await trio.sleep(every)
            self.purge()
