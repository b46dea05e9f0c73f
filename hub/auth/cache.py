"""A short-lived cache of authentication lookups, so a request costs no storage crossing for them.

Entries live ``ttl`` seconds (trio time) and carry string tags (``pat:<id>``, ``user:<id>``,
``org:<id>``, ``session:<hash>``, ``service:<id>``, ``relations:<org>``, ``subject:<id>``). What must
take effect at once — a PAT deleted, a user removed, a role changed, a session ended, a service
account deleted, a relation granted or revoked — calls ``Services.invalidate(tag)`` before it
answers: that forgets the tag here at once and sends it with PostgreSQL NOTIFY to every other process
on the database (``fleethub admin`` included), which forget it too. Expiry of a PAT or session is
checked on every request against the cached expiry, never cached away.

Entries a request still uses are refreshed before they expire, off the request path: within the
last ``refresh_before`` seconds of its life, a hit hands the entry to ``keep_fresh`` (one task of the
hub's, started with it) and answers from the cache at once. So a warm caller never waits on a load,
and a credential used by sixteen requests at once is loaded once per ``ttl``, not sixteen times when
it expires (bench/command_rtt.py counted those crossings as the pings' own).

A load that was in flight when a tag was forgotten does not put back what it read: ``generation``
counts forgets, and a value read before one is answered but not kept (it may be the revoked one).

Long-lived requests (SSE streams) ``watch`` the tags their access depends on: a forgotten tag, or the
whole cache cleared (after PostgreSQL reconnects, when invalidations may have been missed), wakes
the watch so the stream re-checks its credential and relation at once (hub/auth/streams.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

import trio

log = logging.getLogger("fleethub.auth")


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
    def __init__(self, ttl: float = 30.0, max_entries: int = 50_000, refresh_before: float = 10.0) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.refresh_before = refresh_before
        self._entries: dict[Hashable, tuple[float, frozenset, Any]] = {}
        self._watches: dict[str, set[Watch]] = {}
        self.hits = 0
        self.misses = 0
        self.refreshes = 0  # entries loaded again by keep_fresh before they expired
        self.generation = 0  # forgets and clears so far: a load that saw an older one keeps nothing
        # keys due for a refresh -> (load, tags); None while no keep_fresh task runs (refreshes then
        # do not happen, and an entry is loaded again by the first request after it expires)
        self._due: dict[Hashable, tuple[Callable, Callable]] | None = None
        self._refreshing: set[Hashable] = set()
        self._loading: dict[Hashable, trio.Event] = {}  # key -> set when its load (a miss) is done
        self._wake = trio.Event()

    def get(self, key: Hashable) -> Any | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] < trio.current_time():
            self.misses += 1
            return None
        self.hits += 1
        return entry[2]

    def put(self, key: Hashable, value: Any, tags: frozenset, *, seen: int | None = None) -> None:
        """Keep ``value``; ``seen``: the ``generation`` noted before the load that produced it (a
        forget since then means the value may be what was revoked, so it is not kept)."""
        if seen is not None and seen != self.generation:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()  # rare; bounded memory matters more than hit rate
        self._entries[key] = (trio.current_time() + self.ttl, tags, value)

    async def get_or_load(self, key: Hashable, load, tags) -> Any | None:
        """The cached value, else ``await load()`` cached under ``tags(value)``. A None from
        ``load`` (no such credential) is not cached: the next attempt looks again. A value close to
        its expiry is answered and handed to ``keep_fresh`` to load again in the background."""
        entry = self._entries.get(key)
        now = trio.current_time()
        if entry is not None and now < entry[0]:
            self.hits += 1
            due = self._due
            if due is not None and now >= entry[0] - self.refresh_before and key not in due \
                    and key not in self._refreshing:
                due[key] = (load, tags)
                self._wake.set()
            return entry[2]
        self.misses += 1
        # One load per key at a time: callers that miss while it is on its way wait for it (sixteen
        # requests arriving together after an idle spell cost one crossing, not sixteen).
        loading = self._loading.get(key)
        if loading is not None:
            await loading.wait()
            entry = self._entries.get(key)
            if entry is not None and trio.current_time() < entry[0]:
                return entry[2]
            # nothing kept (no such credential, or forgotten meanwhile): look for ourselves
        done = self._loading[key] = trio.Event()
        try:
            seen = self.generation
            value = await load()
            if value is not None:
                self.put(key, value, frozenset(tags(value)), seen=seen)
            return value
        finally:
            if self._loading.get(key) is done:
                del self._loading[key]
            done.set()

    async def keep_fresh(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Load again, one at a time, the entries hits found close to their expiry (see the module
        docstring). A load that fails (storage away) leaves the entry to expire as it would have."""
        self._due = {}
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                while self._due:
                    key = next(iter(self._due))
                    load, tags = self._due.pop(key)
                    self._refreshing.add(key)
                    seen = self.generation
                    try:
                        value = await load()
                    except Exception as exc:  # noqa: BLE001 — the request path loads it if it expires
                        log.debug("refreshing a cached credential failed (%s); it expires as it was",
                                  type(exc).__name__)
                        continue
                    finally:
                        self._refreshing.discard(key)
                    if value is None:
                        if seen == self.generation:
                            self._entries.pop(key, None)  # gone from storage: the next request says so
                        continue
                    if seen == self.generation:  # else forgotten meanwhile: what it read is not kept
                        self.put(key, value, frozenset(tags(value)))
                        self.refreshes += 1
        finally:
            self._due = None

    def forget(self, tag: str) -> None:
        self.generation += 1
        for key in [k for k, (_, tags, _) in self._entries.items() if tag in tags]:
            del self._entries[key]
        for watch in list(self._watches.get(tag, ())):
            watch.signal()

    def clear(self) -> None:
        self.generation += 1
        self._entries.clear()
        for watch in {w for watchers in self._watches.values() for w in watchers}:
            watch.signal()

    def watch(self, tags) -> Watch:
        """``with cache.watch(tags) as w:`` — woken whenever one of ``tags`` is forgotten."""
        return Watch(self, frozenset(tags))
