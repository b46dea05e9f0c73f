"""Metering rows: quantities per organisation, UTC day, product and key (0006_metering.sql).

Writes come in batches from hub/metering.py; one transaction per batch adds to the stored sums and
records the batch's id (0013_usage_flushes.sql), so a batch sent twice counts once. A batch with a
row PostgreSQL refuses rolls back whole, id included: the meter writes it again in halves, each under
an id of its own.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import asyncpg

from storage.db import Database


class Usage:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add_many(self, rows: list[dict], *, batch_id: uuid.UUID) -> bool:
        """rows: {org_id, day, product, key, quantity}; quantities are added to what is stored, once
        per ``batch_id``: the id is recorded in the same transaction, so a batch sent again (its first
        outcome unknown to the sender) adds nothing. Returns False for such a replay."""
        if not rows:
            return True

        async def body(conn: asyncpg.Connection) -> bool:
            fresh = await conn.fetchval(
                "INSERT INTO usage_flushes (id, at) VALUES ($1, now()) ON CONFLICT DO NOTHING RETURNING true",
                batch_id)
            if not fresh:
                return False
            await conn.execute(
                """INSERT INTO usage_daily (org_id, day, product, key, quantity)
                   SELECT * FROM unnest($1::uuid[], $2::date[], $3::text[], $4::text[], $5::numeric[])
                   ON CONFLICT (org_id, product, day, key)
                   DO UPDATE SET quantity = usage_daily.quantity + EXCLUDED.quantity""",
                [r["org_id"] for r in rows], [r["day"] for r in rows], [r["product"] for r in rows],
                [r["key"] for r in rows], [Decimal(str(r["quantity"])) for r in rows])
            # A batch is sent again within seconds or never: a day of ids is plenty.
            await conn.execute("DELETE FROM usage_flushes WHERE at < now() - interval '1 day'")
            return True

        return await self.db.run(body, transaction=True)

    async def mark_active_many(self, rows: list[dict]) -> None:
        """rows: {org_id, day, device_id}; a device counts once per day however often it is seen."""
        if not rows:
            return
        await self.db.execute(
            """INSERT INTO device_active_days (org_id, day, device_id)
               SELECT * FROM unnest($1::uuid[], $2::date[], $3::uuid[]) ON CONFLICT DO NOTHING""",
            [r["org_id"] for r in rows], [r["day"] for r in rows], [r["device_id"] for r in rows])

    async def daily(self, org_id: uuid.UUID, start: dt.date, end: dt.date,
                    products: list[str] | None = None) -> list[dict]:
        """Rows with start <= day < end, ordered by day."""
        rows = await self.db.fetch(
            """SELECT day, product, key, quantity FROM usage_daily
               WHERE org_id = $1 AND day >= $2 AND day < $3 AND ($4::text[] IS NULL OR product = ANY($4))
               ORDER BY day, product, key""", org_id, start, end, products)
        return [dict(r) for r in rows]

    async def active_devices_daily(self, org_id: uuid.UUID, start: dt.date, end: dt.date) -> list[dict]:
        rows = await self.db.fetch(
            """SELECT day, count(*) AS devices FROM device_active_days
               WHERE org_id = $1 AND day >= $2 AND day < $3 GROUP BY day ORDER BY day""", org_id, start, end)
        return [dict(r) for r in rows]
