"""Fleets: a named group of devices with what rollouts need (architecture, tags, configuration)."""

from __future__ import annotations

import datetime as dt
import uuid

import asyncpg

from storage.db import Database, NameTaken

FLEET_FIELDS = ("name", "description", "tags", "architecture", "config_id", "registry_proxy",
                "registry_proxy_mode")


class DuplicateName(NameTaken):
    """A fleet with this name already exists in the organisation."""

    kind = "fleet"


class Fleets:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, org_id: uuid.UUID, now: dt.datetime, **fields) -> dict:
        values = {k: fields[k] for k in FLEET_FIELDS if fields.get(k) is not None}
        cols = ["id", "org_id", "created_at", "updated_at", *values]
        args = [uuid.uuid4(), org_id, now, now, *values.values()]
        sql = (f"INSERT INTO fleets ({', '.join(cols)}) VALUES "
               f"({', '.join(f'${i + 1}' for i in range(len(cols)))}) RETURNING *")
        try:
            return dict(await self.db.fetchrow(sql, *args))
        except asyncpg.UniqueViolationError:
            raise DuplicateName(values.get("name")) from None

    async def registry_proxy_mode(self, fleet_id: uuid.UUID | None) -> str:
        """How the fleet's devices use the registry proxy (config.apply's registryProxy): off (the fleet's
        proxy is off, or no fleet), fallback or always."""
        row = await self.db.fetchrow("SELECT registry_proxy, registry_proxy_mode FROM fleets WHERE id = $1",
                                     fleet_id) if fleet_id is not None else None
        return row["registry_proxy_mode"] if row is not None and row["registry_proxy"] else "off"

    async def get(self, org_id: uuid.UUID, fleet_id: uuid.UUID) -> dict | None:
        row = await self.db.fetchrow(
            "SELECT f.*, (SELECT count(*) FROM devices d WHERE d.fleet_id = f.id) AS device_count "
            "FROM fleets f WHERE f.org_id = $1 AND f.id = $2", org_id, fleet_id)
        return dict(row) if row else None

    async def list(self, org_id: uuid.UUID, *, offset: int, limit: int,
                   only: set | None = None, name: str | None = None) -> tuple[list[dict], int]:
        """``only``: restrict to these fleet ids (a member's permitted fleets); ``name``, the exact name."""
        ids = list(only) if only is not None else None

        async def body(conn: asyncpg.Connection) -> tuple[list[dict], int]:
            cond = ("f.org_id = $1 AND ($2::uuid[] IS NULL OR f.id = ANY($2::uuid[])) "
                    "AND ($3::text IS NULL OR f.name = $3)")
            total = await conn.fetchval(f"SELECT count(*) FROM fleets f WHERE {cond}", org_id, ids, name)
            rows = await conn.fetch(
                "SELECT f.*, (SELECT count(*) FROM devices d WHERE d.fleet_id = f.id) AS device_count "
                f"FROM fleets f WHERE {cond} ORDER BY f.created_at, f.id OFFSET $4 LIMIT $5",
                org_id, ids, name, offset, limit)
            return [dict(r) for r in rows], total

        return await self.db.run(body)

    async def update(self, org_id: uuid.UUID, fleet_id: uuid.UUID, now: dt.datetime, changes: dict) -> dict | None:
        """Apply the given fields (None clears a nullable one); returns the fleet or None when missing."""
        values = {k: v for k, v in changes.items() if k in FLEET_FIELDS}
        sets = ", ".join(f"{k} = ${i + 4}" for i, k in enumerate(values))
        sql = (f"UPDATE fleets SET updated_at = $3{', ' + sets if sets else ''} "
               "WHERE org_id = $1 AND id = $2 RETURNING *")
        try:
            row = await self.db.fetchrow(sql, org_id, fleet_id, now, *values.values())
        except asyncpg.UniqueViolationError:
            raise DuplicateName(values.get("name")) from None
        return dict(row) if row else None
