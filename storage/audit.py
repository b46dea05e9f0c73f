"""Audit events: one row per API call, written behind the response in batches, and their query."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import asyncpg

from storage.db import Database

_COLUMNS = ("id", "org_id", "at", "actor_type", "actor_id", "actor_user_id", "credential_kind", "method", "path",
            "query", "status", "request_id", "client_addr", "duration_ms", "action", "target", "details")
_TYPES = ("uuid", "uuid", "timestamptz", "text", "text", "uuid", "text", "text", "text", "text", "int", "text",
          "text", "real", "text", "text", "jsonb")


def _event(row: asyncpg.Record) -> dict:
    d = dict(row)
    if isinstance(d.get("details"), str):
        d["details"] = json.loads(d["details"])
    return d


class Audit:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def write_many(self, events: list[dict]) -> None:
        """All rows of a batch in one statement."""
        if not events:
            return
        columns = [[e.get(c) for e in events] for c in _COLUMNS]
        columns[-1] = [json.dumps(d) if d is not None else "{}" for d in columns[-1]]
        params = ", ".join(f"${i + 1}::{t}[]" for i, t in enumerate(_TYPES))
        # ON CONFLICT: a batch whose first write's outcome was unknown (cancelled at its COMMIT) and is
        # written again adds each event once (ids are the events' own).
        await self.db.execute(
            f"INSERT INTO audit_events ({', '.join(_COLUMNS)}) SELECT * FROM unnest({params}) "
            "ON CONFLICT (id) DO NOTHING", *columns)

    async def query(self, org_id: uuid.UUID, *, offset: int, limit: int, since: dt.datetime | None = None,
                    until: dt.datetime | None = None, method: str | None = None, path_prefix: str | None = None,
                    actor_user_id: uuid.UUID | None = None) -> tuple[list[dict], int]:
        """A page of the organisation's events, newest first, each with what its actor is called now:
        ``actor_email`` (the user), ``actor_token_description`` and ``actor_token_found`` (the PAT the
        call was made with), ``actor_service_name`` (the service account)."""
        where, args = ["org_id = $1"], [org_id]
        for cond, value in (("at >= ${}", since), ("at <= ${}", until), ("method = ${}", method),
                            ("starts_with(path, ${})", path_prefix), ("actor_user_id = ${}", actor_user_id)):
            if value is not None:
                args.append(value)
                where.append(cond.format(len(args)))
        sql_where = " AND ".join(where)

        async def body(conn: asyncpg.Connection) -> tuple[list[dict], int]:
            total = await conn.fetchval(f"SELECT count(*) FROM audit_events WHERE {sql_where}", *args)
            # The page first, then who its actors are now: a join per page row, not per matching row.
            # A user, token or service account deleted since leaves its columns null.
            rows = await conn.fetch(
                "SELECT a.*, u.email AS actor_email, p.description AS actor_token_description, "
                "p.id IS NOT NULL AS actor_token_found, sa.name AS actor_service_name "
                f"FROM (SELECT * FROM audit_events WHERE {sql_where} ORDER BY at DESC, id "
                f"OFFSET ${len(args) + 1} LIMIT ${len(args) + 2}) a "
                "LEFT JOIN users u ON u.id = a.actor_user_id "
                "LEFT JOIN pats p ON p.id = a.actor_id AND p.user_id = a.actor_user_id "
                "LEFT JOIN service_accounts sa ON a.actor_type = 'service' AND sa.org_id = a.org_id "
                "AND sa.id::text = a.actor_id "
                "ORDER BY a.at DESC, a.id", *args, offset, limit)
            return [_event(r) for r in rows], total

        return await self.db.run(body)
