"""Webhook endpoints, their delivery leases and their delivery log (migration 0026).

An endpoint's ``cursor`` is the last event (org_seq) it has handled; the event after it is retried
until it is delivered or the endpoint is disabled, so an endpoint receives its events in cursor
order. One cluster node delivers an endpoint's events at a time: it holds the endpoint's lease
(``acquire``: free, expired or already its own, always a new epoch), and every write of progress
names that (owner, epoch) and changes nothing when another node has taken the lease since (``Stale``),
as rollouts fence their writes (storage/leases.py). The cursor moves only after a receiver's 2xx, in
the transaction that logs the delivery: a node killed mid-delivery loses nothing, and the next
holder sends that event again (at least once).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from storage.db import Database

_META = ("id, org_id, url, event_types, fleet_ids, enabled, disabled_reason, cursor, attempts, failing_since, "
         "next_attempt_at, lease_owner, lease_expires_at, created_at, updated_at")
EXCERPT_CHARS = 1024


class Stale(Exception):
    """This node's lease on the endpoint is gone (another node took it over, or it was deleted)."""


@dataclass(frozen=True)
class WebhookFence:
    endpoint_id: uuid.UUID
    owner: str
    epoch: int


@dataclass(frozen=True)
class Attempt:
    """One delivery attempt as the log keeps it."""
    event_id: uuid.UUID
    type: str
    org_seq: int | None
    attempt: int
    status: int | None
    ok: bool
    latency_ms: float
    excerpt: str
    error: str | None
    manual: bool
    at: dt.datetime



_LOG = """INSERT INTO webhook_deliveries (endpoint_id, org_seq, event_id, type, attempt, status, ok, latency_ms,
                                          excerpt, error, manual, at)
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"""


def _log_args(endpoint_id: uuid.UUID, a: Attempt) -> tuple:
    return (endpoint_id, a.org_seq, a.event_id, a.type, a.attempt, a.status, a.ok, a.latency_ms,
            a.excerpt[:EXCERPT_CHARS], a.error, a.manual, a.at)


async def _log(conn: asyncpg.Connection, endpoint_id: uuid.UUID, a: Attempt) -> int:
    return await conn.fetchval(_LOG + " RETURNING id", *_log_args(endpoint_id, a))


async def _fenced(conn: asyncpg.Connection, fence: WebhookFence) -> None:
    held = await conn.fetchval("SELECT 1 FROM webhook_endpoints WHERE id = $1 AND lease_owner = $2 AND "
                               "lease_epoch = $3 FOR UPDATE", fence.endpoint_id, fence.owner, fence.epoch)
    if held is None:
        raise Stale(f"webhook endpoint {fence.endpoint_id}: lease epoch {fence.epoch} of {fence.owner} is gone")


class Webhooks:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- endpoints (the API) -----------------------------------------------------------------
    async def create(self, org_id: uuid.UUID, url: str, event_types: Sequence[str],
                     fleet_ids: Sequence[uuid.UUID] | None, ciphertext: bytes, now: dt.datetime) -> dict:
        """A new endpoint starts at the organisation's current cursor: it receives what happens from now."""
        row = await self.db.fetchrow(
            f"""INSERT INTO webhook_endpoints (id, org_id, url, ciphertext, event_types, fleet_ids, cursor,
                                                created_at, updated_at)
                VALUES ($1, $2, $3, $4, $5, $6,
                        COALESCE((SELECT last FROM event_counters WHERE org_id = $2), 0), $7, $7)
                RETURNING {_META}""",
            uuid.uuid4(), org_id, url, ciphertext, list(event_types),
            None if fleet_ids is None else list(fleet_ids), now)
        return dict(row)

    async def list(self, org_id: uuid.UUID) -> list[dict]:
        rows = await self.db.fetch(f"SELECT {_META} FROM webhook_endpoints WHERE org_id = $1 ORDER BY created_at, id",
                                   org_id)
        return [dict(r) for r in rows]

    async def get(self, org_id: uuid.UUID, endpoint_id: uuid.UUID) -> dict | None:
        row = await self.db.fetchrow(f"SELECT {_META} FROM webhook_endpoints WHERE org_id = $1 AND id = $2",
                                     org_id, endpoint_id)
        return dict(row) if row is not None else None

    async def secret(self, endpoint_id: uuid.UUID) -> bytes | None:
        return await self.db.fetchval("SELECT ciphertext FROM webhook_endpoints WHERE id = $1", endpoint_id)

    async def update(self, org_id: uuid.UUID, endpoint_id: uuid.UUID, now: dt.datetime, *,
                     url: str | None = None, event_types: Sequence[str] | None = None,
                     fleet_ids: Sequence[uuid.UUID] | None = None, clear_fleets: bool = False,
                     enabled: bool | None = None) -> dict | None:
        """Re-enabling an endpoint clears its failure state: the event it stopped at is tried at once."""
        row = await self.db.fetchrow(
            f"""UPDATE webhook_endpoints SET url = COALESCE($3, url), event_types = COALESCE($4, event_types),
                       fleet_ids = CASE WHEN $6 THEN NULL ELSE COALESCE($5, fleet_ids) END,
                       enabled = COALESCE($7, enabled),
                       disabled_reason = CASE WHEN $7 THEN NULL ELSE disabled_reason END,
                       attempts = CASE WHEN $7 THEN 0 ELSE attempts END,
                       failing_since = CASE WHEN $7 THEN NULL ELSE failing_since END,
                       next_attempt_at = CASE WHEN $7 THEN NULL ELSE next_attempt_at END,
                       updated_at = $8
                WHERE org_id = $1 AND id = $2 RETURNING {_META}""",
            org_id, endpoint_id, url, None if event_types is None else list(event_types),
            None if fleet_ids is None else list(fleet_ids), clear_fleets, enabled, now)
        return dict(row) if row is not None else None

    async def delete(self, org_id: uuid.UUID, endpoint_id: uuid.UUID) -> bool:
        status = await self.db.execute("DELETE FROM webhook_endpoints WHERE org_id = $1 AND id = $2",
                                       org_id, endpoint_id)
        return status.endswith(" 1")

    async def deliveries(self, endpoint_id: uuid.UUID, *, limit: int = 50, before: int | None = None) -> list[dict]:
        rows = await self.db.fetch(
            """SELECT id, org_seq, event_id, type, attempt, status, ok, latency_ms, excerpt, error, manual, at
               FROM webhook_deliveries WHERE endpoint_id = $1 AND ($2::bigint IS NULL OR id < $2)
               ORDER BY id DESC LIMIT $3""", endpoint_id, before, limit)
        return [dict(r) for r in rows]

    async def log_manual(self, endpoint_id: uuid.UUID, attempt: Attempt) -> int:
        """A ping or a redelivery an admin asked for: logged (its id), the cursor untouched."""
        return await self.db.run(_log, endpoint_id, attempt)

    # -- delivery (hub/webhooks/worker.py) ----------------------------------------------------
    async def enabled_ids(self) -> list[uuid.UUID]:
        return [r["id"] for r in await self.db.fetch("SELECT id FROM webhook_endpoints WHERE enabled")]

    async def acquire(self, endpoint_id: uuid.UUID, owner: str, ttl: float) -> WebhookFence | None:
        """Leases are timed on the database's clock, as rollouts' are (storage/leases.py): nodes whose
        clocks disagree still agree on whose lease has lapsed."""
        epoch = await self.db.fetchval(
            """UPDATE webhook_endpoints SET lease_owner = $2, lease_epoch = lease_epoch + 1,
                      lease_expires_at = clock_timestamp() + make_interval(secs => $3)
               WHERE id = $1 AND enabled
                 AND (lease_owner IS NULL OR lease_expires_at < clock_timestamp() OR lease_owner = $2)
               RETURNING lease_epoch""", endpoint_id, owner, ttl)
        return WebhookFence(endpoint_id, owner, int(epoch)) if epoch is not None else None

    async def renew(self, fence: WebhookFence, ttl: float) -> dict:
        """Extend the lease; the endpoint's row as it is now (its filters may have changed). Stale
        when the lease is no longer this one's or the endpoint was disabled or deleted."""
        row = await self.db.fetchrow(
            f"""UPDATE webhook_endpoints SET lease_expires_at = clock_timestamp() + make_interval(secs => $4)
                WHERE id = $1 AND lease_owner = $2 AND lease_epoch = $3 AND enabled RETURNING {_META}""",
            fence.endpoint_id, fence.owner, fence.epoch, ttl)
        if row is None:
            raise Stale(f"webhook endpoint {fence.endpoint_id}: lease epoch {fence.epoch} is gone")
        return dict(row)

    async def release(self, fence: WebhookFence) -> None:
        await self.db.execute("UPDATE webhook_endpoints SET lease_owner = NULL, lease_expires_at = NULL "
                              "WHERE id = $1 AND lease_owner = $2 AND lease_epoch = $3",
                              fence.endpoint_id, fence.owner, fence.epoch)

    async def skip_to(self, fence: WebhookFence, cursor: int) -> None:
        """No matching event up to ``cursor``: the next read starts after it."""
        async def body(conn: asyncpg.Connection) -> None:
            await _fenced(conn, fence)
            await conn.execute("UPDATE webhook_endpoints SET cursor = GREATEST(cursor, $2) WHERE id = $1",
                               fence.endpoint_id, cursor)

        await self.db.run(body, transaction=True)

    async def delivered(self, fence: WebhookFence, attempts: Sequence[Attempt], cursor: int | None = None) -> None:
        """Receivers took these events: logged, and the cursor moved to ``cursor`` (default: past the
        last of them), in one transaction. A cursor that moves clears the retry state (it belonged to
        the event it moved past)."""
        upto = cursor if cursor is not None else max(a.org_seq for a in attempts)

        async def body(conn: asyncpg.Connection) -> None:
            await _fenced(conn, fence)
            await conn.executemany(_LOG, [_log_args(fence.endpoint_id, a) for a in attempts])
            await conn.execute(
                """UPDATE webhook_endpoints SET cursor = GREATEST(cursor, $2),
                          attempts = CASE WHEN $2 > cursor THEN 0 ELSE attempts END,
                          failing_since = CASE WHEN $2 > cursor THEN NULL ELSE failing_since END,
                          next_attempt_at = CASE WHEN $2 > cursor THEN NULL ELSE next_attempt_at END
                   WHERE id = $1""", fence.endpoint_id, upto)

        if attempts:
            await self.db.run(body, transaction=True)

    async def failed(self, fence: WebhookFence, attempt: Attempt, next_attempt_at: dt.datetime | None,
                     disable_reason: str | None = None) -> None:
        """An attempt failed: logged, and the retry set for ``next_attempt_at``; with
        ``disable_reason``, the endpoint is disabled instead (its cursor stays at the event)."""
        async def body(conn: asyncpg.Connection) -> None:
            await _fenced(conn, fence)
            await _log(conn, fence.endpoint_id, attempt)
            await conn.execute(
                """UPDATE webhook_endpoints SET attempts = $2, failing_since = COALESCE(failing_since, $3),
                          next_attempt_at = $4, enabled = enabled AND $5::text IS NULL,
                          disabled_reason = COALESCE($5, disabled_reason), updated_at = $3
                   WHERE id = $1""", fence.endpoint_id, attempt.attempt, attempt.at, next_attempt_at, disable_reason)

        await self.db.run(body, transaction=True)

