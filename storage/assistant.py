"""The assistant's budgets and the token sums its decisions read (0010_assistant.sql, usage_daily).

``snapshot`` is one crossing: the organisation's budget row, its billing anchor day, the period's
token sums per product and per day, and the caller's sum for today.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable

import asyncpg

from storage.db import Database

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
        async def body(conn: asyncpg.Connection) -> dict:
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

        return await self.db.run(body)
