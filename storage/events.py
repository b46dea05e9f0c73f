"""The event log (migration 0026): every event the SSE streams carry, in order per organisation.

``append`` writes events of any organisations in one statement (one round trip, atomic on its own);
a caller with a transaction of its own (a rollout's save) passes its connection to ``append_on`` so
the events commit with the change they describe. Each organisation's counter row is updated before its events are inserted, and that
row stays locked until the commit: two appends of one organisation commit one after the other, in
sequence order, so a reader that sees ``org_seq`` N sees every event before it (no gap for a reader
that resumes after N).

Rows are read back as ``Event`` records; hub/eventlog.py turns them into CloudEvents and SSE frames.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import asyncpg

from storage.db import Database

#: The most rows one page (``page``) returns and one prune statement deletes.
MAX_PAGE = 1000
PRUNE_BATCH = 5000


class NewEvent(NamedTuple):
    """An event to append: ``kind`` is its stable name (hub/eventlog.py prefixes it into a type).
    A tuple, not a frozen dataclass: one is built for every event the hub records (1,000 a second
    under a fleet's load), and a frozen dataclass's __init__ costs a setattr call per field."""
    org_id: uuid.UUID
    kind: str
    subject: str
    time: dt.datetime
    data: Any
    device_id: uuid.UUID | None = None
    rollout_id: uuid.UUID | None = None
    fleet_ids: tuple[uuid.UUID, ...] | None = None  # None for a device event: its fleet is looked up
    id: uuid.UUID | None = None  # None: PostgreSQL gives it one (gen_random_uuid) as it appends


# A device's id as its events name it -> (its subject, its id): parsing and printing a
# UUID were most of what recording an event cost in Python (the same few devices send most events).
# Cleared when full rather than evicted one by one: a refill costs what the cache saves for a moment.
_DEVICES: dict[str, tuple[str, uuid.UUID]] = {}
_DEVICES_MAX = 50_000


def _device(raw: Any) -> tuple[str, uuid.UUID]:
    key = str(raw)
    found = _DEVICES.get(key)
    if found is None:
        device_id = uuid.UUID(key)  # refuses what is not an id, as before the cache
        if len(_DEVICES) >= _DEVICES_MAX:
            _DEVICES.clear()
        found = _DEVICES[key] = (f"devices/{device_id}", device_id)
    return found


def subject_of(event: dict[str, Any]) -> tuple[str, uuid.UUID | None, uuid.UUID | None]:
    """(subject, device id, rollout id) of an event record as the actors publish it
    (``{kind, deviceId | rolloutId | webhookId | orgId, at, payload}``)."""
    if "orgId" in event:  # the organisation's own (a billing lock)
        return f"organizations/{uuid.UUID(str(event['orgId']))}", None, None
    if "rolloutId" in event:
        rollout_id = uuid.UUID(str(event["rolloutId"]))
        return f"rollouts/{rollout_id}", None, rollout_id
    if "webhookId" in event:
        return f"webhooks/{uuid.UUID(str(event['webhookId']))}", None, None
    subject, device_id = _device(event["deviceId"])
    return subject, device_id, None


def new_event(org_id: uuid.UUID, event: dict[str, Any], fleet_ids: tuple[uuid.UUID, ...] | None = None) -> NewEvent:
    """The record's ``at`` (RFC 3339, milliseconds) is the event's time: a stream replaying it from
    the log sends the same ``at`` the live stream sent."""
    subject, device_id, rollout_id = subject_of(event)
    return NewEvent(org_id=org_id, kind=str(event["kind"]), subject=subject,
                    time=dt.datetime.fromisoformat(str(event["at"])),
                    data=event.get("payload") or {}, device_id=device_id, rollout_id=rollout_id,
                    fleet_ids=fleet_ids)


@dataclass(frozen=True)
class Event:
    seq: int
    org_id: uuid.UUID
    org_seq: int
    id: uuid.UUID
    kind: str
    subject: str
    time: dt.datetime
    device_id: uuid.UUID | None
    rollout_id: uuid.UUID | None
    fleet_ids: tuple[uuid.UUID, ...]
    data: Any


@dataclass(frozen=True)
class Visibility:
    """Which events a caller may read: all of them, or those of these devices, or of events whose
    every fleet is one of these (a rollout over two fleets needs both, as its own stream does)."""
    everything: bool
    device_ids: frozenset[uuid.UUID] = frozenset()
    fleet_ids: frozenset[uuid.UUID] = frozenset()


_COLUMNS = "seq, org_id, org_seq, id, type, subject, time, device_id, rollout_id, fleet_ids, data"


def _event(row: asyncpg.Record) -> Event:
    return Event(seq=row["seq"], org_id=row["org_id"], org_seq=row["org_seq"], id=row["id"], kind=row["type"],
                 subject=row["subject"], time=row["time"], device_id=row["device_id"],
                 rollout_id=row["rollout_id"], fleet_ids=tuple(row["fleet_ids"] or ()),
                 data=json.loads(row["data"]))


# One statement (so one round trip, and atomic without a transaction of its own): the counters of the
# batch's organisations are moved on, in org_id order (one lock order for every writer: no deadlock
# between two batches), and the events inserted with the sequence numbers that frees, in the order given.
_APPEND = """
WITH r AS (
    SELECT r.*, n.ord FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS n(rec, ord),
         jsonb_to_record(n.rec) AS r(org_id uuid, id uuid, type text, subject text, time timestamptz,
                                     device_id uuid, rollout_id uuid, fleet_ids uuid[], data jsonb)),
counts AS (SELECT org_id, count(*) AS n FROM r GROUP BY org_id),
c AS (
    INSERT INTO event_counters AS c (org_id, last) SELECT org_id, n FROM counts ORDER BY org_id
    ON CONFLICT (org_id) DO UPDATE SET last = c.last + EXCLUDED.last RETURNING c.org_id, c.last),
ins AS (
    INSERT INTO events (org_id, org_seq, id, type, subject, time, device_id, rollout_id, fleet_ids, data)
    SELECT r.org_id, c.last - counts.n + row_number() OVER (PARTITION BY r.org_id ORDER BY r.ord),
           COALESCE(r.id, gen_random_uuid()), r.type, r.subject, r.time, r.device_id, r.rollout_id,
           COALESCE(r.fleet_ids, (SELECT ARRAY[d.fleet_id] FROM devices d
                                  WHERE d.id = r.device_id AND d.fleet_id IS NOT NULL), '{}'),
           r.data
    FROM r JOIN c ON c.org_id = r.org_id JOIN counts ON counts.org_id = r.org_id)
SELECT org_id, last FROM c"""


async def append_on(conn: asyncpg.Connection, events: Sequence[NewEvent]) -> list[int]:
    """Append ``events`` on ``conn`` (inside the caller's transaction, if it has one); their org_seq,
    in the order given."""
    if not events:
        return []
    counts: dict[uuid.UUID, int] = {}
    orgs: dict[uuid.UUID, str] = {}
    rows = []
    for e in events:
        org = orgs.get(e.org_id)
        if org is None:
            org = orgs[e.org_id] = str(e.org_id)
        counts[e.org_id] = counts.get(e.org_id, 0) + 1
        rows.append({"org_id": org, "id": e.id and str(e.id), "type": e.kind, "subject": e.subject,
                     "time": e.time.isoformat(), "device_id": e.device_id and str(e.device_id),
                     "rollout_id": e.rollout_id and str(e.rollout_id),
                     "fleet_ids": None if e.fleet_ids is None else [str(f) for f in e.fleet_ids],
                     "data": e.data})
    lasts = await conn.fetch(_APPEND, json.dumps(rows, separators=(",", ":")))
    next_seq = {r["org_id"]: r["last"] - counts[r["org_id"]] + 1 for r in lasts}
    seqs = []
    for e in events:
        seqs.append(next_seq[e.org_id])
        next_seq[e.org_id] += 1
    return seqs


def _visible_sql(v: Visibility, args: list[Any]) -> str:
    if v.everything:
        return "true"
    args.append(list(v.device_ids))
    devices = len(args)
    args.append(list(v.fleet_ids))
    fleets = len(args)
    return (f"(device_id = ANY(${devices}::uuid[]) OR "
            f"(cardinality(fleet_ids) > 0 AND fleet_ids <@ ${fleets}::uuid[]))")


def _type_sql(types: Sequence[str], args: list[Any]) -> str:
    """Exact kinds, or prefixes where a pattern ends in ``*`` (``device.*``)."""
    exact = [t for t in types if not t.endswith("*")]
    prefixes = [t[:-1] for t in types if t.endswith("*")]
    parts = []
    if exact:
        args.append(exact)
        parts.append(f"type = ANY(${len(args)}::text[])")
    for p in prefixes:
        args.append(p.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
        parts.append(f"type LIKE ${len(args)}")
    return "(" + " OR ".join(parts) + ")" if parts else "true"


class EventLog:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def append(self, events: Sequence[NewEvent]) -> list[int]:
        return await self.db.run(append_on, events)  # one statement: atomic on its own

    async def page(self, org_id: uuid.UUID, after: int, *, limit: int = 100, types: Sequence[str] = (),
                   subject: str | None = None, visibility: Visibility = Visibility(True),
                   fleets_any: Sequence[uuid.UUID] | None = None, upto: int | None = None) -> list[Event]:
        """The organisation's events after cursor ``after`` (and up to ``upto``), oldest first, at most
        ``limit``. ``fleets_any``: only events of one of these fleets (a webhook's filter)."""
        args: list[Any] = [org_id, after, min(limit, MAX_PAGE)]
        where = ["org_id = $1", "org_seq > $2", _visible_sql(visibility, args), _type_sql(types, args)]
        if subject is not None:
            args.append(subject)
            where.append(f"subject = ${len(args)}")
        if fleets_any is not None:
            args.append(list(fleets_any))
            where.append(f"fleet_ids && ${len(args)}::uuid[]")
        if upto is not None:
            args.append(upto)
            where.append(f"org_seq <= ${len(args)}")
        rows = await self.db.fetch(
            f"SELECT {_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY org_seq LIMIT $3", *args)
        return [_event(r) for r in rows]

    async def get(self, org_id: uuid.UUID, org_seqs: Sequence[int]) -> list[Event]:
        rows = await self.db.fetch(f"SELECT {_COLUMNS} FROM events WHERE org_id = $1 AND org_seq = ANY($2::bigint[]) "
                                   "ORDER BY org_seq", org_id, list(org_seqs))
        return [_event(r) for r in rows]

    async def cursors(self, org_id: uuid.UUID) -> tuple[int, int]:
        """(the last org_seq written, the last one pruned): 0, 0 for an organisation with none yet."""
        row = await self.db.fetchrow("SELECT last, pruned_through FROM event_counters WHERE org_id = $1", org_id)
        return (row["last"], row["pruned_through"]) if row is not None else (0, 0)

    async def prune(self, before: dt.datetime, *, batch: int = PRUNE_BATCH) -> int:
        """Delete up to ``batch`` events older than ``before`` (oldest first) and move each
        organisation's ``pruned_through`` past them; the number deleted (call again while it is
        ``batch``). Small batches keep each transaction short under a steady append load."""

        async def body(conn: asyncpg.Connection) -> int:
            rows = await conn.fetch(
                """WITH gone AS (
                       DELETE FROM events WHERE seq IN (
                           SELECT seq FROM events WHERE time < $1 ORDER BY seq LIMIT $2)
                       RETURNING org_id, org_seq)
                   SELECT org_id, max(org_seq) AS upto, count(*) AS n FROM gone GROUP BY org_id""", before, batch)
            for r in sorted(rows, key=lambda r: r["org_id"]):
                await conn.execute("UPDATE event_counters SET pruned_through = GREATEST(pruned_through, $2) "
                                   "WHERE org_id = $1", r["org_id"], r["upto"])
            return sum(r["n"] for r in rows)

        return await self.db.run(body, transaction=True)
