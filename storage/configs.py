"""Configurations and their versions. A create or a spec change writes a new version row and moves
``current_version`` in the same transaction; versions never change once written."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import asyncpg

from storage.db import Database, NameTaken
from storage.rowcache import RowCache

SORT_COLUMNS = {"name": "c.name", "createdAt": "c.created_at", "updatedAt": "c.updated_at",
                "status": "c.status", "currentVersion": "c.current_version"}


class DuplicateConfigName(NameTaken):
    """A configuration with this name already exists in the organisation."""

    kind = "configuration"


def _version(row: asyncpg.Record | None) -> dict | None:
    if row is None:
        return None
    d = dict(row)
    if isinstance(d.get("spec"), str):
        d["spec"] = json.loads(d["spec"])
    return d


_SELECT = ("SELECT c.*, (SELECT count(*) FROM secret_files f WHERE f.config_id = c.id) AS secret_file_count, "
           "(SELECT count(*) FROM devices d WHERE d.config_id = c.id) AS device_count FROM configurations c")


async def _insert_version(conn: asyncpg.Connection, config_id: uuid.UUID, org_id: uuid.UUID, version: int,
                          spec: dict, now: dt.datetime, created_by: str | None) -> dict:
    return _version(await conn.fetchrow(
        "INSERT INTO configuration_versions (id, config_id, org_id, version, spec, created_at, created_by) "
        "VALUES ($1,$2,$3,$4,$5::jsonb,$6,$7) RETURNING *",
        uuid.uuid4(), config_id, org_id, version, json.dumps(spec), now, created_by))


def _like_escape(text: str) -> str:
    """A search term matched literally: its % and _ are not wildcards."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class Configurations:
    def __init__(self, db: Database, device_cache: RowCache | None = None) -> None:
        self.db = db
        # Deleting a configuration changes device rows (their assignment): evict them from the
        # device read cache the Devices repository shares with us.
        self.device_cache = device_cache

    async def create(self, org_id: uuid.UUID, now: dt.datetime, *, name: str, description: str, tags: list[str],
                     spec: dict, created_by: str | None, fleet_id: uuid.UUID | None = None) -> tuple[dict, dict]:
        async def body(conn: asyncpg.Connection) -> tuple[dict, dict]:
            config_id = uuid.uuid4()
            try:
                await conn.execute(
                    "INSERT INTO configurations (id, org_id, name, description, tags, created_at, updated_at, "
                    "current_version) VALUES ($1,$2,$3,$4,$5,$6,$6,1)",
                    config_id, org_id, name, description, tags, now)
            except asyncpg.UniqueViolationError:
                raise DuplicateConfigName(name) from None
            version = await _insert_version(conn, config_id, org_id, 1, spec, now, created_by)
            if fleet_id is not None:
                await conn.execute("UPDATE fleets SET config_id = $1, updated_at = $2 WHERE id = $3 AND org_id = $4",
                                   config_id, now, fleet_id, org_id)
            row = await conn.fetchrow(f"{_SELECT} WHERE c.id = $1", config_id)
            return dict(row), version

        return await self.db.run(body, transaction=True)

    async def get(self, org_id: uuid.UUID, config_id: uuid.UUID) -> tuple[dict, dict] | None:
        async def body(conn: asyncpg.Connection):
            row = await conn.fetchrow(f"{_SELECT} WHERE c.org_id = $1 AND c.id = $2", org_id, config_id)
            if row is None:
                return None
            version = await conn.fetchrow(
                "SELECT * FROM configuration_versions WHERE config_id = $1 AND version = $2",
                config_id, row["current_version"])
            return dict(row), _version(version)

        return await self.db.run(body)

    async def list(self, org_id: uuid.UUID, *, offset: int, limit: int, search: str | None, status: str | None,
                   sort_by: str, sort_order: str, only: set | None = None,
                   name: str | None = None) -> tuple[list[dict], int]:
        """``name``: the exact name (unique in an organisation), beside ``search``'s substring."""
        where, args = ["c.org_id = $1"], [org_id]
        if name is not None:
            args.append(name)
            where.append(f"c.name = ${len(args)}")
        if only is not None:
            args.append(list(only))
            where.append(f"c.id = ANY(${len(args)}::uuid[])")
        if search:
            args.append("%" + _like_escape(search) + "%")
            where.append(f"(c.name ILIKE ${len(args)} OR c.description ILIKE ${len(args)})")
        if status:
            args.append(status)
            where.append(f"c.status = ${len(args)}")
        cond = " AND ".join(where)
        order = f"{SORT_COLUMNS[sort_by]} {'DESC' if sort_order == 'desc' else 'ASC'}, c.id"

        async def body(conn: asyncpg.Connection) -> tuple[list[dict], int]:
            total = await conn.fetchval(f"SELECT count(*) FROM configurations c WHERE {cond}", *args)
            rows = await conn.fetch(f"{_SELECT} WHERE {cond} ORDER BY {order} OFFSET ${len(args) + 1} "
                                    f"LIMIT ${len(args) + 2}", *args, offset, limit)
            return [dict(r) for r in rows], total

        return await self.db.run(body)

    async def update(self, org_id: uuid.UUID, config_id: uuid.UUID, now: dt.datetime, *, metadata: dict,
                     spec: dict | None, created_by: str | None) -> tuple[dict, dict | None] | None:
        """Metadata changes and, when ``spec`` is given, a new version; None when missing."""

        async def body(conn: asyncpg.Connection):
            row = await conn.fetchrow("SELECT * FROM configurations WHERE org_id = $1 AND id = $2 FOR UPDATE",
                                      org_id, config_id)
            if row is None:
                return None
            sets = [f"{k} = ${i + 3}" for i, k in enumerate(metadata)]
            new_version = None
            if spec is not None:
                number = row["current_version"] + 1
                new_version = await _insert_version(conn, config_id, org_id, number, spec, now, created_by)
                sets.append(f"current_version = {number}")
            try:
                await conn.execute(f"UPDATE configurations SET updated_at = $2{''.join(', ' + s for s in sets)} "
                                   "WHERE id = $1", config_id, now, *metadata.values())
            except asyncpg.UniqueViolationError:
                raise DuplicateConfigName(metadata.get("name")) from None
            updated = await conn.fetchrow(f"{_SELECT} WHERE c.id = $1", config_id)
            return dict(updated), new_version

        return await self.db.run(body, transaction=True)

    async def versions(self, org_id: uuid.UUID, config_id: uuid.UUID) -> list[dict] | None:
        async def body(conn: asyncpg.Connection):
            if not await conn.fetchval("SELECT 1 FROM configurations WHERE org_id = $1 AND id = $2", org_id, config_id):
                return None
            rows = await conn.fetch("SELECT * FROM configuration_versions WHERE config_id = $1 ORDER BY version DESC",
                                    config_id)
            return [_version(r) for r in rows]

        return await self.db.run(body)

    async def version(self, org_id: uuid.UUID, version_id: uuid.UUID) -> dict | None:
        return _version(await self.db.fetchrow(
            "SELECT * FROM configuration_versions WHERE org_id = $1 AND id = $2", org_id, version_id))

    async def delete(self, org_id: uuid.UUID, config_id: uuid.UUID) -> tuple[int, list[tuple[uuid.UUID, str]]] | None:
        """Delete it with its versions and secret files; returns how many secret files it had and
        (device, path) of those that were on devices, so they can be removed there. None when missing."""

        async def body(conn: asyncpg.Connection):
            if not await conn.fetchval("SELECT 1 FROM configurations WHERE org_id = $1 AND id = $2 FOR UPDATE",
                                       org_id, config_id):
                return None
            on_devices = await conn.fetch(
                "SELECT d.device_id, f.path FROM secret_file_deliveries d JOIN secret_files f ON f.id = d.file_id "
                "WHERE f.config_id = $1 AND d.status <> 'overridden'", config_id)
            await conn.execute("UPDATE devices SET config_status = NULL, config_error = NULL "
                               "WHERE config_id = $1", config_id)
            assigned = await conn.fetch("SELECT id FROM devices WHERE config_id = $1", config_id)
            files = await conn.fetchval("SELECT count(*) FROM secret_files WHERE config_id = $1", config_id)
            await conn.execute("DELETE FROM configurations WHERE id = $1", config_id)
            return files, [(r["device_id"], r["path"]) for r in on_devices], [r["id"] for r in assigned]

        result = await self.db.run(body, transaction=True)
        if result is None:
            return None
        files, removed, assigned = result
        if self.device_cache is not None:
            self.device_cache.evict(assigned)
        return files, removed
