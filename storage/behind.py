"""The outbox: writes that must survive a PostgreSQL outage, buffered, capped, halved, idempotent.

One mechanism for every write the hub makes behind its callers' backs (issue 34, item 4). ``put`` and
``append`` never block and never cross into storage; ``run`` flushes every ``interval`` seconds (or
sooner when ``max_batch`` rows wait), one crossing per batch; on shutdown the last batch is flushed
under a shield. Its users, each an instance with its ``name`` and a ``kind`` label on /metrics
(``fleethub_write_behind_{rows,set_aside,dropped,pending}``, hub/metrics.py):

    kind           flush                           what it needed that the others did not
    presence       storage/devices write_presence  merge by key (``merge_newer``: a device sending a
                                                   heartbeat a second costs one row per flush)
    audit          storage/audit write_many        group commit (``append_written``: the answer waits
                                                   for its row) and a local journal (storage/journal.py)
    active_device  storage/usage mark_active_many  nothing beyond the common part
    metering       storage/usage add_many          sums (``merge``: adding), so a batch whose outcome is
                                                   unknown may not be merged with newer counts: it is
                                                   kept as it is and sent again under its batch id
                                                   (``batch_ids``), halves under derived ids (``piece_id``)
    tunnel_usage   storage/tunnels record_usage    merge by the largest total, one row a statement, the
                                                   oldest kept when full (``when_full="refuse_new"``: a
                                                   device naming made-up sessions must not push out the
                                                   real ones), fed only by writes that found PostgreSQL
                                                   away, drained on demand with a backoff (``drain``)

The common part:

- PostgreSQL unreachable (``DatabaseUnavailable``): the rows wait for the next flush.
- A batch the database refuses for another reason (one row it cannot store): the batch is written
  again in halves, and halves of halves, so every other row is written and only the rows refused on
  their own are set aside: counted (``set_aside``) and logged by safe id (``describe``), never by
  content.
- The buffer is capped (``max_pending``) so a long outage cannot take the hub's memory: past the
  cap the row that has waited longest is dropped (a presence row is rebuilt by the device's next
  change; an audit row is kept as long as the cap allows), or the new row is (``refuse_new``). Drops
  are counted (``dropped``) and logged once per outage.
- Idempotent: a batch whose outcome is unknown (unreachable, or cancelled at its COMMIT) is written
  again. Rows merged by key are idempotent by themselves (the newest state, an id that is the primary
  key, a cumulative total), so they are put back under anything newer; sums are not, so with
  ``batch_ids`` each batch carries an id its write stores in the same transaction, and a batch is kept
  with its id, unmerged, until its outcome is known.

``append_written`` is the durable form (audit rows of answered API calls, issue 38 item 7): the row is
appended and the caller waits until a flush has written it, so the answer leaves only once its row is
in PostgreSQL. Rows waited for meanwhile by other callers go in the same statement (a group commit):
a request waits one flush's round trip, and the database sees one statement per flush, not per row.
A row PostgreSQL has not confirmed within the wait (it is frozen, or the last flush found it
unreachable, in which case nobody waits) goes to the writer's local journal (storage/journal.py): the
answer leaves once the row is fsync'd there, and the journal is emptied once PostgreSQL has every row
it held; a process killed meanwhile has its journal replayed by the next start. Without a journal (or
when the disk refuses it) the row is written behind like any other, and counted in ``unconfirmed``.

Not here: ``Actor.until_stored`` (actors/_runtime/actor.py) waits out an outage too, but it is no buffer. Its
caller awaits the result and goes on with it (device_delivery's reads, a configuration result whose
rollout step follows), the work is a closure in the actor's order, not a row that can be batched,
merged or halved, its bound is the actor's job slots, not a cap, a refusal is that job's failure, and
its waits share the actor's storage backoff and ``fleethub_actor_storage_waits_total`` with the
actor's deadlines. Making it a buffer would let the actor go on before the write it depends on.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Literal, Protocol

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


def piece_id(parent: uuid.UUID, half: int) -> uuid.UUID:
    """The id of half 0 or 1 of a refused batch: a function of the parent's id, so a half is always
    sent under the same id, and never under an id another batch or half could have."""
    return uuid.uuid5(parent, str(half))


def safe_id(key: Hashable, row: Any) -> str:
    """What a log may say about a row: its uuid (or the uuids of its key), never its text."""
    ident = row.get("id") if isinstance(row, dict) else None
    if isinstance(ident, uuid.UUID):
        return f"row {ident}"
    parts = key if isinstance(key, tuple) else (key,)
    ids = [str(p) for p in parts if isinstance(p, uuid.UUID)]
    return f"row {'/'.join(ids) or '-'}"


def reason(exc: BaseException) -> str:
    """The class and SQLSTATE of a refusal; the message may quote the row, so it is left out."""
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__}{f' (SQLSTATE {state})' if state else ''}"


class Retry(Protocol):
    """The backoff ``drain`` waits by (device_client/shared/backoff.py's, which storage may not import)."""

    def ceiling(self) -> float: ...

    def next_delay(self) -> float: ...

    def reset(self) -> None: ...


class _Wait:
    __slots__ = ("done", "refused", "written")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.written = False
        self.refused = False  # set aside: the database will never take it


class _Piece:
    """Rows taken for one statement and not known stored; ``ident`` is its batch id (or None)."""
    __slots__ = ("ident", "rows")

    def __init__(self, ident: uuid.UUID | None, rows: dict[Hashable, Any]) -> None:
        self.ident = ident
        self.rows = rows


class WriteBehind:
    def __init__(self, flush: Callable[..., Awaitable[Any]], *, interval: float = 0.5,
                 max_batch: int = 2000, max_pending: int = MAX_PENDING, name: str = "rows",
                 journal: DiskJournal | None = None, merge: Callable[[Any, Any], Any] = merge_newer,
                 batch_ids: bool = False, when_full: Literal["drop_oldest", "refuse_new"] = "drop_oldest",
                 describe: Callable[[Hashable, Any], str] = safe_id) -> None:
        self._flush = flush  # flush(rows), or flush(rows, batch_id=...) with batch_ids
        self.interval = interval
        self.max_batch = max_batch
        self.max_pending = max_pending
        self.name = name
        self._merge = merge
        self.batch_ids = batch_ids
        self.refuse_new = when_full == "refuse_new"
        self._describe = describe
        self._pending: dict[Hashable, Any] = {}
        # Pieces taken and not known stored, oldest first; a refused piece is replaced by its halves.
        # Without batch ids they live only within a flush (the rest is put back into _pending); with
        # them a piece whose outcome is unknown stays, so it is sent again as it was, under its id.
        self._unsent: list[_Piece] = []
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
        self.unreachable = False  # the last flush found the database unreachable
        self._waiters: dict[Hashable, _Wait] = {}  # rows append_written waits for, by key
        # One flush at a time: a caller of flush() (a reader of the audit log, shutdown) waits for the
        # batch already on its way, so "flushed" means every row put before the call was written; and
        # two flushes would send the same piece and each take the other's outcome for its own.
        self._flushing = trio.Lock()

    def pending(self) -> int:
        """Rows not known written: waiting, or taken by a flush (or kept with their batch id)."""
        return len(self._pending) + sum(len(p.rows) for p in self._unsent)

    def put(self, key: Hashable, row: Any, *, merge: bool = True) -> None:
        old = self._pending.get(key)
        # (counting the rows a flush has taken: put back after a failed try, they must not overflow)
        if old is None and self.refuse_new and self.pending() >= self.max_pending:
            self._count_dropped(1)
            return
        self._pending[key] = self._merge(old, row) if (merge and old is not None) else row
        self._after_put()

    def append(self, row: dict) -> None:
        """A row that is never merged (audit events)."""
        self.put(id(row), row, merge=False)

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
        if wait.refused or not self._holds(key):
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

    def _holds(self, key: Hashable) -> bool:
        return key in self._pending or any(key in p.rows for p in self._unsent)

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
        # dicts keep insertion order: the first keys are the rows that have waited longest. Kept pieces
        # are not touched: they hold at most max_batch rows, taken when none was kept.
        for key in list(self._pending)[:n] if n > 1 else [next(iter(self._pending))]:
            del self._pending[key]
            self._journaled.discard(key)  # still in the journal file, which the next start replays
        self._count_dropped(n)

    def _count_dropped(self, n: int) -> None:
        self.dropped += n
        if not self._dropped_this_outage:
            log.error("write-behind of %s is full (%d rows waiting for the database): dropping the %s",
                      self.name, self.max_pending, "newest" if self.refuse_new else "oldest")
        self._dropped_this_outage += n

    async def flush(self) -> None:
        async with self._flushing:
            await self._flush_pending()

    async def drain(self, backoff: Retry) -> None:
        """Flush until nothing is pending, waiting ``backoff``'s delay before each try, which grows
        while the database is unreachable and starts again once it answers: for a writer fed only
        during outages, whose task lives only while there is something to write (no ``run``)."""
        while self.pending():
            await trio.sleep(backoff.ceiling())
            await self.flush()
            if self.unreachable:
                backoff.next_delay()
            else:
                backoff.reset()

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """No flush, the timer's or a caller's, until the block ends, so the rows put meanwhile go out
        in one batch: what a test of one statement carrying several tenants' rows needs. Rows wait;
        none is lost (the cap still holds). Do not call ``flush`` inside: it would wait for the block."""
        async with self._flushing:
            yield

    def _take(self) -> None:
        # At most max_batch rows a crossing, oldest first: after an outage up to max_pending wait, and
        # one statement carrying them all could outlast the storage call bound (storage/db.py) every
        # time, so that they would never be written.
        keys = list(itertools.islice(self._pending, self.max_batch))
        self._unsent.append(_Piece(uuid.uuid4() if self.batch_ids else None,
                                   {key: self._pending.pop(key) for key in keys}))

    async def _flush_pending(self) -> None:
        while self._unsent or self._pending:
            if not self._unsent:
                self._take()
            piece = self._unsent[0]
            rows = list(piece.rows.values())
            try:
                if self.batch_ids:
                    await self._flush(rows, batch_id=piece.ident)
                else:
                    await self._flush(rows)
            except trio.Cancelled:
                # Shutting down mid-write: the final, shielded flush in run() writes the rest (a kept
                # piece as it was, or the rows put back under anything newer).
                self._put_back()
                raise
            except DatabaseUnavailable:
                # PostgreSQL is down or restarting: keep the rows for the next flush.
                self.retries += 1
                self.unreachable = True
                # nobody waits through an outage: these rows are written behind, like those put meanwhile
                self._release([key for p in self._unsent for key in p.rows], written=False)
                self._put_back()
                return
            except Exception as exc:  # noqa: BLE001 — refused: the statement rolled back whole
                self.failures += 1
                self._refused(exc)
            else:
                self._unsent.pop(0)
                self._journaled.difference_update(piece.rows)
                self._release(piece.rows, written=True)
                self.written += len(rows)
            self.unreachable = False
            if self._dropped_this_outage:
                log.warning("write-behind of %s writes again; %d rows were dropped while the database was away",
                            self.name, self._dropped_this_outage)
                self._dropped_this_outage = 0
        if self.journal is not None and self.journal.has_rows and not self._journaled:
            await self.journal.empty()  # PostgreSQL has every row it held

    def _refused(self, exc: BaseException) -> None:
        """The first piece was refused whole (not unreachable: a row it cannot store): halve it, or set
        a single row aside."""
        piece = self._unsent[0]
        if len(piece.rows) == 1:
            self._unsent.pop(0)
            ((key, row),) = piece.rows.items()
            self._release((key,), written=False, refused=True)  # for good: waiting changes nothing
            self._journaled.discard(key)
            self.set_aside += 1
            log.error("write-behind of %s: the database refused %s (%s); set aside",
                      self.name, self._describe(key, row), reason(exc))
            return
        log.warning("write-behind of %d %s was refused (%s); writing it again in halves",
                    len(piece.rows), self.name, reason(exc))
        items = list(piece.rows.items())
        half = len(items) // 2
        ids = (piece_id(piece.ident, 0), piece_id(piece.ident, 1)) if piece.ident else (None, None)
        self._unsent[0:1] = [_Piece(ids[0], dict(items[:half])), _Piece(ids[1], dict(items[half:]))]

    def _put_back(self) -> None:
        if self.batch_ids:
            return  # kept as they are, with their ids: their outcome is unknown
        # The older rows go first (they have waited longest), each merged under its newer version.
        newer, self._pending = self._pending, {}
        for piece in self._unsent:
            for key, row in piece.rows.items():
                later = newer.pop(key, None)
                self._pending[key] = self._merge(row, later) if later is not None else row
        self._unsent = []
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
