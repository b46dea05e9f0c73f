"""A short-lived cache of authentication lookups, so a request costs no storage crossing for them.

Entries live ``ttl`` seconds (trio time) and carry string tags (``pat:<id>``, ``user:<id>``,
``org:<id>``, ``session:<hash>``, ``service:<id>``, ``relations:<org>``, ``subject:<id>``). What must
take effect at once — a PAT deleted, a user removed, a role changed, a session ended, a service
account deleted, a relation granted or revoked — calls ``Services.invalidate(tag)`` before it
answers: that forgets the tag here at once and sends it with PostgreSQL NOTIFY to every other process
on the database (``fleethub admin`` included), which forget it too. Expiry of a PAT or session is
checked on every request against the cached expiry, never cached away.

Long-lived requests (SSE streams) ``watch`` the tags their access depends on: a forgotten tag, or the
whole cache cleared (after PostgreSQL reconnects, when invalidations may have been missed), wakes
the watch so the stream re-checks its credential and relation at once (hub/auth/streams.py).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import trio


class Watch:
    """Tags one long-lived request depends on; ``changed`` turns true when any of them is forgotten,
    and ``on_change`` (the waiting stream's cancel, say) is called. ``rearm`` before re-checking."""

    def __init__(self, cache: "AuthCache", tags: frozenset[str]) -> None:
        self.cache, self.tags = cache, tags
        self.changed = False
        self.on_change: Callable[[], None] | None = None

    def signal(self) -> None:
        self.changed = True
        if self.on_change is not None:
            self.on_change()

    def rearm(self) -> None:
        self.changed = False

    def __enter__(self) -> "Watch":
        for tag in self.tags:
            self.cache._watches.setdefault(tag, set()).add(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        for tag in self.tags:
            watchers = self.cache._watches.get(tag)
            if watchers is not None:
                watchers.discard(self)
                if not watchers:
                    del self.cache._watches[tag]


class AuthCache:
    def __init__(self, ttl: float = 30.0, max_entries: int = 50_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[Hashable, tuple[float, frozenset, Any]] = {}
        self._watches: dict[str, set[Watch]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Any | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] < trio.current_time():
            self.misses += 1
            return None
        self.hits += 1
        return entry[2]

    def put(self, key: Hashable, value: Any, tags: frozenset) -> None:
        if len(self._entries) >= self.max_entries:
            self._entries.clear()  # rare; bounded memory matters more than hit rate
        self._entries[key] = (trio.current_time() + self.ttl, tags, value)

    async def get_or_load(self, key: Hashable, load, tags) -> Any | None:
        """The cached value, else ``await load()`` cached under ``tags(value)``. A None from
        ``load`` (no such credential) is not cached: the next attempt looks again."""
        value = self.get(key)
        if value is None:
            value = await load()
            if value is not None:
                self.put(key, value, frozenset(tags(value)))
        return value

    def forget(self, tag: str) -> None:
        for key in [k for k, (_, tags, _) in self._entries.items() if tag in tags]:
            del self._entries[key]
        for watch in list(self._watches.get(tag, ())):
            watch.signal()

    def clear(self) -> None:
        self._entries.clear()
        for watch in {w for watchers in self._watches.values() for w in watchers}:
            watch.signal()

    def watch(self, tags) -> Watch:
        """``with cache.watch(tags) as w:`` — woken whenever one of ``tags`` is forgotten."""
        return Watch(self, frozenset(tags))
