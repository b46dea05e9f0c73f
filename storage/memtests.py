"""Memory tests: results by run, the last known status and health of each device's tests, and the
memory it found bad (for the MemoryFault condition on the device record). One crossing per call.

Reads are scoped by organisation; writes come from the device's actor, which knows its device.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg

from storage.db import Database
from storage.rowcache import RowCache

# How a device's merged memory state turns into its MemoryFault condition (or None): pure, given
# by the caller (actors/machines/memory_fault.py holds the rule), run inside the same transaction.
ConditionRule = Callable[[int, int, str | None], dict[str, Any] | None]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _result_row(row: asyncpg.Record) -> dict[str, Any]:
    return _json(row["result"])


class MemoryTests:
    def __init__(self, db: Database, device_cache: RowCache | None = None) -> None:
        self.db = db
        self.device_cache = device_cache  # the device record shows conditions: evict it on change

    async def save_result(self, org_id: uuid.UUID, device_id: uuid.UUID, result: dict[str, Any],
                          at: dt.datetime) -> bool:
        """Store a result once per (device, runId); False when it was already stored."""
        status = await self.db.execute(
            "INSERT INTO memtest_results (device_id, run_id, org_id, outcome, verdict, at, result) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb) ON CONFLICT (device_id, run_id) DO NOTHING",
            device_id, str(result["runId"]), org_id, str(result.get("outcome") or "error"),
            result.get("verdict"), at, json.dumps(result))
        return status.endswith(" 1")

    async def results(self, org_id: uuid.UUID, device_id: uuid.UUID, limit: int) -> list[dict[str, Any]]:
        rows = await self.db.fetch(
            "SELECT result FROM memtest_results WHERE org_id = $1 AND device_id = $2 "
            "ORDER BY at DESC, run_id DESC LIMIT $3", org_id, device_id, limit)
        return [_result_row(r) for r in rows]

    async def save_status(self, org_id: uuid.UUID, device_id: uuid.UUID, status: dict[str, Any],
                          at: dt.datetime) -> None:
        await self.db.execute(
            "INSERT INTO memtest_devices (device_id, org_id, status, status_at) VALUES ($1, $2, $3::jsonb, $4) "
            "ON CONFLICT (device_id) DO UPDATE SET status = EXCLUDED.status, status_at = EXCLUDED.status_at",
            device_id, org_id, json.dumps(status), at)

    async def save_health(self, org_id: uuid.UUID, device_id: uuid.UUID, health: dict[str, Any],
                          at: dt.datetime) -> None:
        await self.db.execute(
            "INSERT INTO memtest_devices (device_id, org_id, health, health_reported_at) "
            "VALUES ($1, $2, $3::jsonb, $4) ON CONFLICT (device_id) DO UPDATE "
            "SET health = EXCLUDED.health, health_reported_at = EXCLUDED.health_reported_at",
            device_id, org_id, json.dumps(health), at)

    async def stored(self, org_id: uuid.UUID, device_id: uuid.UUID, history: int) -> dict[str, Any]:
        """What a stored read shows: status, health and when it was reported, recent results."""

        async def body(conn: asyncpg.Connection) -> dict[str, Any]:
            row = await conn.fetchrow(
                "SELECT status, health, health_reported_at FROM memtest_devices "
                "WHERE org_id = $1 AND device_id = $2", org_id, device_id)
            rows = await conn.fetch(
                "SELECT result FROM memtest_results WHERE org_id = $1 AND device_id = $2 "
                "ORDER BY at DESC, run_id DESC LIMIT $3", org_id, device_id, history)
            return {"status": _json(row["status"]) if row else None,
                    "health": _json(row["health"]) if row else None,
                    "healthReportedAt": row["health_reported_at"] if row else None,
                    "history": [_result_row(r) for r in rows]}

        return await self.db.run(body)

    async def merge_memory(self, org_id: uuid.UUID, device_id: uuid.UUID, *, retired: list[int],
                           bad: list[int], verdict: str | None, rule: ConditionRule,
                           since: str | None) -> dict[str, Any] | None:
        """Add retired and bad pages (pages never come back), set the newest complete run's verdict
        (None keeps the stored one), and put the device's MemoryFault condition in line with the
        result — in one transaction. Returns the condition now on the device (None: none)."""

        async def body(conn: asyncpg.Connection) -> dict[str, Any] | None:
            row = await conn.fetchrow(
                """INSERT INTO memtest_devices (device_id, org_id, retired_pages, bad_pages, verdict)
                   VALUES ($1, $2, $3::bigint[], $4::bigint[], $5)
                   ON CONFLICT (device_id) DO UPDATE SET
                     retired_pages = ARRAY(SELECT DISTINCT unnest(memtest_devices.retired_pages
                                                                  || EXCLUDED.retired_pages) ORDER BY 1),
                     bad_pages = ARRAY(SELECT DISTINCT unnest(memtest_devices.bad_pages
                                                              || EXCLUDED.bad_pages) ORDER BY 1),
                     verdict = COALESCE(EXCLUDED.verdict, memtest_devices.verdict)
                   RETURNING cardinality(retired_pages) AS retired,
                             cardinality(ARRAY(SELECT DISTINCT unnest(retired_pages || bad_pages))) AS bad,
                             verdict""",
                device_id, org_id, sorted(set(retired)), sorted(set(bad)), verdict)
            condition = rule(row["retired"], row["bad"], row["verdict"])
            current = _json(await conn.fetchval("SELECT conditions FROM devices WHERE id = $1 FOR UPDATE",
                                                device_id)) or []
            previous = next((c for c in current if c.get("type") == "MemoryFault"), None)
            if condition is not None and previous is not None:
                condition["since"] = previous.get("since") or since  # the fault holds since it first did
            elif condition is not None:
                condition["since"] = since
            others = [c for c in current if c.get("type") != "MemoryFault"]
            wanted = others + ([condition] if condition is not None else [])
            if wanted != current:
                await conn.execute("UPDATE devices SET conditions = $2::jsonb WHERE id = $1", device_id,
                                   json.dumps(wanted))
            return condition

        condition = await self.db.run(body, transaction=True)
        if self.device_cache is not None:
            self.device_cache.evict([device_id])
        return condition

    async def save_page_map(self, org_id: uuid.UUID, device_id: uuid.UUID, run_id: str, *, pages: int,
                            complete: bool, body: bytes, at: dt.datetime, keep: int) -> bool:
        """Store (or replace: a device may upload again after a lost answer) a run's page map; False
        when this device has no stored result of that run (a map belongs to a real run). The device
        keeps its ``keep`` newest maps: older ones are deleted in the same transaction."""
        async def body_(conn: asyncpg.Connection) -> bool:
            if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM memtest_results "
                                       "WHERE device_id = $1 AND run_id = $2 AND org_id = $3)",
                                       device_id, run_id, org_id):
                return False
            await conn.execute(
                "INSERT INTO memtest_page_maps (device_id, run_id, org_id, at, pages, complete, body) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (device_id, run_id) DO UPDATE SET "
                "at = EXCLUDED.at, pages = EXCLUDED.pages, complete = EXCLUDED.complete, body = EXCLUDED.body",
                device_id, run_id, org_id, at, pages, complete, body)
            await conn.execute(
                """DELETE FROM memtest_page_maps WHERE device_id = $1 AND run_id NOT IN
                   (SELECT run_id FROM memtest_page_maps WHERE device_id = $1 ORDER BY at DESC, run_id DESC
                    LIMIT $2)""", device_id, keep)
            return True

        return await self.db.run(body_, transaction=True)

    async def page_map(self, org_id: uuid.UUID, device_id: uuid.UUID, run_id: str) -> dict[str, Any] | None:
        row = await self.db.fetchrow(
            "SELECT at, pages, complete, body FROM memtest_page_maps "
            "WHERE org_id = $1 AND device_id = $2 AND run_id = $3", org_id, device_id, run_id)
        return dict(row) if row is not None else None
