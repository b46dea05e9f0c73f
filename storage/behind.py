"""Write-behind: coalesce high-rate rows (presence, audit) and write them in batches.

``put`` never blocks and never crosses into storage; ``run`` flushes every ``interval`` seconds (or
sooner when ``max_batch`` rows wait), one crossing per batch. Rows with the same key are merged, so
a device sending a heartbeat every second costs one row per flush, not one write per heartbeat.
On shutdown the last batch is flushed under a shield.

Faults stay where they happened:

- PostgreSQL unreachable (``DatabaseUnavailable``): the rows wait for the next flush.
- A batch the database refuses for another reason (one row it cannot store): the batch is written
  again in halves, and halves of halves, so every other row is written and only the rows refused on
  their own are set aside: counted (``set_aside``, /metrics) and logged by safe id, never by content.
- The buffer is capped (``max_pending``) so a long outage cannot take the hub's memory: past the
  cap the row that has waited longest is dropped (a presence row is rebuilt by the device's next
  change; an audit row is kept as long as the cap allows). Drops are counted (``dropped``, /metrics)
  and logged once per outage.

``append_written`` is the durable form (audit rows of answered API calls, issue 38 item 7): the row is
appended and the caller waits until a flush has written it, so the answer leaves only once its row is
in PostgreSQL. Rows waited for meanwhile by other callers go in the same statement (a group commit):
a request waits one flush's round trip, and the database sees one statement per flush, not per row.
A row PostgreSQL has not confirmed within the wait (it is frozen, or the last flush found it
unreachable, in which case nobody waits) goes to the writer's local journal (storage/journal.py): the
answer leaves once the row is fsync'd there, and the journal is emptied once PostgreSQL has every row
it held; a process killed meanwhile has its journal replayed by the next start. Without a journal (or
when the disk refuses it) the row is written behind like any other, and counted in ``unconfirmed``.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

from storage.db import DatabaseUnavailable
from storage.journal import DiskJournal

log = logging.getLogger("fleethub.storage")

# Rows one writer keeps while PostgreSQL is away. Presence holds one row per device (merged), so the
# cap is above any fleet one process serves; an audit row is ~1 KiB, so 100,000 are ~100 MiB.
MAX_PENDING = 100_000


def merge_newer(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Newer values win, but a None never erases a value the older row carried."""
    merged = dict(old)
    merged.update({k: v for k, v in new.items() if v is not None or k not in old})
    return merged


def _safe_id(key: Hashable, row: dict) -> str:
    """What a log may say about a row: its uuid (or the uuids of its key), never its text."""
    ident = row.get("id")
    if isinstance(ident, uuid.UUID):
        return str(ident)
    parts = key if isinstance(key, tuple) else (key,)
    ids = [str(p) for p in parts if isinstance(p, uuid.UUID)]
    return "/".join(ids) or "-"


def _reason(exc: BaseException) -> str:
    """The class and SQLSTATE of a refusal; the message may quote the row, so it is left out."""
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__}{f' (SQLSTATE {state})' if state else ''}"


class _Wait:
    __slots__ = ("done", "refused", "written")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.written = False
        self.refused = False  # set aside: the database will never take it


class WriteBehind:
    def __init__(self, flush: Callable[[list[dict]], Awaitable[None]], *, interval: float = 0.5,
                 max_batch: int = 2000, max_pending: int = MAX_PENDING, name: str = "rows",
                 journal: DiskJournal | None = None) -> None:
        self._flush = flush
        self.interval = interval
        self.max_batch = max_batch
        self.max_pending = max_pending
        self.name = name
        self._pending: dict[Hashable, dict] = {}
        self._wake = trio.Event()
        self.written = 0
        self.failures = 0  # statements the database refused (a batch is then written again in halves)
        self.set_aside = 0  # rows refused on their own: never written, counted and logged
        self.dropped = 0  # rows dropped because the buffer was full (PostgreSQL away too long)
        self.retries = 0  # flushes put back because the database was unreachable
        self._dropped_this_outage = 0
        self.unconfirmed = 0  # rows append_written could confirm neither in PostgreSQL nor in the journal
        self.journal = journal
        self.journaled = 0  # rows append_written confirmed in the journal (PostgreSQL had not answered)
        self._journaled: set[Hashable] = set()  # keys of journaled rows not yet written
        self._inflight: dict[Hashable, dict] = {}  # the rows of the flush in progress not yet written
        self.unreachable = False  # the last flush found the database unreachable
        self._waiters: dict[Hashable, _Wait] = {}  # rows append_written waits for, by key
        # One flush at a time: a caller of flush() (a reader of the audit log, shutdown) waits for the
        # batch already on its way, so "flushed" means every row put before the call was written.
        self._flushing = trio.Lock()

    def pending(self) -> int:
        return len(self._pending)

    def put(self, key: Hashable, row: dict, *, merge: bool = True) -> None:
        old = self._pending.get(key)
        self._pending[key] = merge_newer(old, row) if (merge and old is not None) else row
        self._after_put()

    def append(self, row: dict) -> None:
        """A row that is never merged (audit events)."""
        self._pending[id(row)] = row
        self._after_put()

    async def append_written(self, row: dict, *, within: float) -> bool:
        """Append ``row`` (never merged) and wait, at most ``within`` seconds, until it is written.
        Returns whether it was; if not, it stays pending and is written behind."""
        key = id(row)  # unique while the row lives, and it lives until written
        wait = self._waiters[key] = _Wait()
        self.append(row)
        if not self.unreachable:
            self._wake.set()
            with trio.move_on_after(within):
                await wait.done.wait()
        self._waiters.pop(key, None)
        if wait.written:
            return True
        if wait.refused or (key not in self._pending and key not in self._inflight):
            self.unconfirmed += 1  # set aside or dropped: no journal makes it storable
            return False
        # Still to write: journaled now, with no await between this check and the mark, so the flush
        # that writes it later unmarks it (and the journal is emptied once nothing marked is left).
        if self.journal is not None:
            self._journaled.add(key)
            if await self.journal.append(row):
                self.journaled += 1
                return True
            self._journaled.discard(key)
        self.unconfirmed += 1
        return False

    def _release(self, keys: Iterable[Hashable], *, written: bool, refused: bool = False) -> None:
        if self._waiters:
            for key in keys:
                wait = self._waiters.pop(key, None)
                if wait is not None:
                    wait.written, wait.refused = written, refused
                    wait.done.set()

    def _after_put(self) -> None:
        if len(self._pending) > self.max_pending:
            self._drop_oldest(len(self._pending) - self.max_pending)
        if len(self._pending) >= self.max_batch:
            self._wake.set()

    def _drop_oldest(self, n: int) -> None:
        # dicts keep insertion order: the first keys are the rows that have waited longest.
        for key in list(self._pending)[:n] if n > 1 else [next(iter(self._pending))]:
            del self._pending[key]
            self._journaled.discard(key)  # still in the journal file, which the next start replays
        self.dropped += n
        if not self._dropped_this_outage:
            log.error("write-behind of %s is full (%d rows waiting for the database): dropping the oldest",
                      self.name, self.max_pending)
        self._dropped_this_outage += n

    async def flush(self) -> None:
        async with self._flushing:
            await self._flush_pending()

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """No flush, the timer's or a caller's, until the block ends, so the rows put meanwhile go out
        in one batch: what a test of one statement carrying several tenants' rows needs. Rows wait;
        none is lost (the cap still holds). Do not call ``flush`` inside: it would wait for the block."""
        async with self._flushing:
            yield

    async def _flush_pending(self) -> None:
        while self._pending:
            # At most max_batch rows a crossing, oldest first: after an outage up to max_pending wait,
            # and one statement carrying them all could outlast the storage call bound (storage/db.py)
            # every time, so that they would never be written.
            taken = {key: self._pending.pop(key) for key in list(itertools.islice(self._pending, self.max_batch))}
            unwritten = self._inflight = dict(taken)  # still to write: a refused half is written again by halves
            try:
                await self._write(list(taken.items()), unwritten)
            except trio.Cancelled:
                # Shutting down mid-write: put the rest back (under anything newer) so the final,
                # shielded flush in run() writes it.
                self._put_back(unwritten)
                raise
            except DatabaseUnavailable:
                # PostgreSQL is down or restarting: keep the rows for the next flush.
                self._put_back(unwritten)
                self.retries += 1
                self.unreachable = True
                # nobody waits through an outage: these rows are written behind, like those put meanwhile
                self._release(unwritten, written=False)
                return
            finally:
                self._inflight = {}
            self.unreachable = False
            if self._dropped_this_outage:
                log.warning("write-behind of %s writes again; %d rows were dropped while the database was away",
                            self.name, self._dropped_this_outage)
                self._dropped_this_outage = 0
        if self.journal is not None and self.journal.has_rows and not self._journaled:
            await self.journal.empty()  # PostgreSQL has every row it held

    async def _write(self, items: list[tuple[Hashable, dict]], unwritten: dict) -> None:
        """Write ``items`` in one statement; when the database refuses it (not unreachable: a row it
        cannot store), write each half again, down to single rows, which are set aside."""
        try:
            await self._flush([row for _, row in items])
        except (trio.Cancelled, DatabaseUnavailable):
            raise
        except Exception as exc:
            self.failures += 1
            if len(items) == 1:
                key, row = items[0]
                del unwritten[key]
                self._release((key,), written=False, refused=True)  # for good: waiting changes nothing
                self._journaled.discard(key)
                self.set_aside += 1
                log.error("write-behind of %s: the database refused row %s (%s); set aside",
                          self.name, _safe_id(key, row), _reason(exc))
                return
            log.warning("write-behind of %d %s was refused (%s); writing it again in halves",
                        len(items), self.name, _reason(exc))
            half = len(items) // 2
            await self._write(items[:half], unwritten)
            await self._write(items[half:], unwritten)
            return
        for key, _ in items:
            del unwritten[key]
            self._journaled.discard(key)
        self._release((key for key, _ in items), written=True)
        self.written += len(items)

    def _put_back(self, unwritten: dict) -> None:
        # The older rows go first (they have waited longest), each merged under its newer version.
        newer, self._pending = self._pending, {}
        for key, row in unwritten.items():
            later = newer.pop(key, None)
            self._pending[key] = merge_newer(row, later) if later is not None else row
        self._pending.update(newer)
        if len(self._pending) > self.max_pending:
            self._drop_oldest(len(self._pending) - self.max_pending)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self.journal is not None:
            for row in await self.journal.orphans():  # a killed process's rows PostgreSQL never had
                self._journaled.add(id(row))
                self.append(row)
        task_status.started()
        try:
            while True:
                with trio.move_on_after(self.interval):
                    await self._wake.wait()
                self._wake = trio.Event()
                await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                await self.flush()
                if self.journal is not None:
                    self.journal.close()
