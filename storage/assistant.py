"""The assistant's budgets and the token sums its decisions read (0010_assistant.sql, usage_daily).

``snapshot`` is one crossing: the organisation's budget row, its billing anchor day, the period's
token sums per product and per day, and the caller's sum for today.

``reserve`` and ``settle`` hold and release the tokens of an answer in progress
(0022_assistant_reservations.sql). ``reserve`` reads the sums and the holds and writes its own hold
under one advisory lock per organisation, so two answers on two hub nodes cannot both take the last of
the budget. ``settle`` deletes the hold and adds the answer's actual tokens in one transaction.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable

import asyncpg

from storage.db import Database

# The key space of the reservation lock (pg_advisory_xact_lock(hashtextextended(org, seed))).
_LOCK_SEED = 23

TOKEN_PRODUCTS = ("assistant_prompt_tokens", "assistant_completion_tokens", "assistant_tool_tokens")


class AssistantStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def set_budget(self, org_id: uuid.UUID, monthly_tokens: int, soft_percent: int,
                         now: dt.datetime) -> bool:
        """False when there is no such organisation."""
        async def body(conn: asyncpg.Connection) -> bool:
            if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM organizations WHERE id = $1)", org_id):
                return False
            await conn.execute(
                """INSERT INTO assistant_budgets (org_id, monthly_tokens, soft_percent, updated_at)
                   VALUES ($1, $2, $3, $4)
                   ON CONFLICT (org_id) DO UPDATE SET monthly_tokens = EXCLUDED.monthly_tokens,
                       soft_percent = EXCLUDED.soft_percent, updated_at = EXCLUDED.updated_at""",
                org_id, monthly_tokens, soft_percent, now)
            return True

        return await self.db.run(body)

    async def set_staff(self, email: str, on: bool) -> dict | None:
        row = await self.db.fetchrow("UPDATE users SET is_staff = $2 WHERE email = $1 RETURNING id, email, is_staff",
                                     email.lower(), on)
        return dict(row) if row else None

    async def snapshot(self, org_id: uuid.UUID, user_key: str, today: dt.date,
                       period_of: Callable[[dt.date, int], tuple[dt.date, dt.date]]) -> dict:
        """{budget: row | None, period: (start, end), by_day: [{day, product, quantity}], user_today}.
        ``period_of(today, anchor_day)`` gives the billing period from the billing profile's anchor."""
        return await self.db.run(_snapshot, org_id, user_key, today, period_of)

    async def reserve(self, org_id: uuid.UUID, user_key: str, today: dt.date,
                      period_of: Callable[[dt.date, int], tuple[dt.date, dt.date]],
                      judge: Callable[[dict], int | None], now: dt.datetime, ttl: dt.timedelta) -> dict:
        """The snapshot plus ``held`` (tokens held by the organisation's answers in progress) and
        ``user_held``; ``judge(snapshot)`` returns the tokens to hold, or None to refuse. Admitted:
        ``reservation`` is the hold's id; refused: it is None and nothing was written."""
        async def body(conn: asyncpg.Connection) -> dict:
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))", str(org_id), _LOCK_SEED)
            await conn.execute("DELETE FROM assistant_reservations WHERE org_id = $1 AND expires_at <= $2",
                               org_id, now)
            snap = await _snapshot(conn, org_id, user_key, today, period_of)
            held = await conn.fetchrow(
                """SELECT coalesce(sum(tokens), 0) AS org,
                          coalesce(sum(tokens) FILTER (WHERE user_key = $2 AND day = $3), 0) AS user_today
                   FROM assistant_reservations WHERE org_id = $1""", org_id, user_key, today)
            snap["held"], snap["user_held"] = int(held["org"]), int(held["user_today"])
            tokens = judge(snap)
            snap["reservation"] = None
            if tokens is not None:
                snap["reservation"] = uuid.uuid4()
                await conn.execute(
                    """INSERT INTO assistant_reservations (id, org_id, user_key, day, tokens, expires_at)
                       VALUES ($1, $2, $3, $4, $5, $6)""",
                    snap["reservation"], org_id, user_key, today, tokens, now + ttl)
            return snap

        return await self.db.run(body, transaction=True)

    async def settle(self, reservation: uuid.UUID, org_id: uuid.UUID, user_key: str, day: dt.date,
                     tokens: dict[str, int]) -> None:
        """Release the hold and add the answer's tokens by product, in one transaction."""
        async def body(conn: asyncpg.Connection) -> None:
            await conn.execute("DELETE FROM assistant_reservations WHERE id = $1", reservation)
            rows = [(p, n) for p, n in tokens.items() if n > 0]
            if rows:
                await conn.execute(
                    """INSERT INTO usage_daily (org_id, day, product, key, quantity)
                       SELECT $1, $2, p, $3, q FROM unnest($4::text[], $5::numeric[]) AS t(p, q)
                       ON CONFLICT (org_id, product, day, key)
                       DO UPDATE SET quantity = usage_daily.quantity + EXCLUDED.quantity""",
                    org_id, day, user_key, [p for p, _ in rows], [n for _, n in rows])

        await self.db.run(body, transaction=True)


async def _snapshot(conn: asyncpg.Connection, org_id: uuid.UUID, user_key: str, today: dt.date,
                    period_of: Callable[[dt.date, int], tuple[dt.date, dt.date]]) -> dict:
    anchor = await conn.fetchval("SELECT anchor_day FROM billing_profiles WHERE org_id = $1", org_id)
    start, end = period_of(today, anchor or 1)
    budget = await conn.fetchrow("SELECT monthly_tokens, soft_percent FROM assistant_budgets "
                                 "WHERE org_id = $1", org_id)
    by_day = await conn.fetch(
        """SELECT day, product, sum(quantity) AS quantity FROM usage_daily
           WHERE org_id = $1 AND day >= $2 AND day < $3 AND product = ANY($4::text[])
           GROUP BY day, product ORDER BY day, product""", org_id, start, end, list(TOKEN_PRODUCTS))
    mine = await conn.fetchval(
        """SELECT coalesce(sum(quantity), 0) FROM usage_daily
           WHERE org_id = $1 AND day = $2 AND key = $3 AND product = ANY($4::text[])""",
        org_id, today, user_key, list(TOKEN_PRODUCTS))
    return {"budget": dict(budget) if budget else None, "period": (start, end), "by_day": [dict(r) for r in by_day],
            "user_today": mine}
