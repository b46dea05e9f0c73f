"""A small read cache of rows by key, for the hottest single-row reads (GET /v1/devices/{id}).

Every write that goes through a repository evicts the rows it touches in this process before it
returns, so a reader here sees its own writes at once. Another hub process's write is seen within
``ttl`` seconds (trio time): reads of a device record are allowed to be that stale across processes,
its live state (online, last seen) comes from the device's actor anyway.
"""

from __future__ import annotations

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

    def get(self, key: Hashable) -> Any | None:
        entry = self._rows.get(key)
        if entry is None or entry[0] < trio.current_time():
            self.misses += 1
            return None
        self.hits += 1
        return entry[1]

    def put(self, key: Hashable, row: Any) -> None:
        if len(self._rows) >= self.max_entries:
            self._rows.clear()
        self._rows[key] = (trio.current_time() + self.ttl, row)

    def evict(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._rows.pop(key, None)

    def clear(self) -> None:
        self._rows.clear()
