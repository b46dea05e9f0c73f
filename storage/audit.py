"""Audit events: one row per API call, written behind the response in batches."""

from __future__ import annotations

import json

from storage.db import Database


class Audit:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def write_many(self, events: list[dict]) -> None:
        if not events:
            return
        await self.db.execute(
            """INSERT INTO audit_events (id, org_id, at, actor_type, actor_id, actor_user_id, method, path,
                                         status, request_id, action, target, details)
               SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::timestamptz[], $4::text[], $5::text[],
                                    $6::uuid[], $7::text[], $8::text[], $9::int[], $10::text[], $11::text[],
                                    $12::text[], $13::jsonb[])""",
            *[list(col) for col in zip(*[
                (e["id"], e.get("org_id"), e["at"], e["actor_type"], e.get("actor_id"), e.get("actor_user_id"),
                 e["method"], e["path"], e["status"], e["request_id"], e.get("action"), e.get("target"),
                 json.dumps(e.get("details") or {})) for e in events])])
