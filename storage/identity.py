"""Service accounts, relation tuples and dashboard sessions."""

from __future__ import annotations

import datetime as dt
import uuid

import asyncpg

from storage.db import Database


class DuplicateServiceAccount(Exception):
    """A service account with this name already exists in the organisation."""


class Identity:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- service accounts -------------------------------------------------------------------
    async def create_service_account(self, org_id: uuid.UUID, name: str, description: str, client_id: str,
                                     secret_hash: bytes, created_by: uuid.UUID | None, now: dt.datetime,
                                     grants: list[tuple[str, uuid.UUID, str]]) -> dict:
        """The account and its IAM policy (relation tuples) in one transaction."""

        async def body(conn: asyncpg.Connection) -> dict:
            try:
                row = await conn.fetchrow(
                    "INSERT INTO service_accounts (id, org_id, name, description, client_id, secret_hash, "
                    "created_by, created_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8) "
                    "RETURNING id, org_id, name, description, client_id, created_at",
                    uuid.uuid4(), org_id, name, description, client_id, secret_hash, created_by, now)
            except asyncpg.UniqueViolationError:
                raise DuplicateServiceAccount(name) from None
            await conn.executemany(
                "INSERT INTO relations (org_id, object_type, object_id, relation, subject_type, subject_id, "
                "created_at) VALUES ($1,$2,$3,$4,'service',$5,$6) ON CONFLICT DO NOTHING",
                [(org_id, t, oid, rel, row["id"], now) for t, oid, rel in grants])
            return dict(row)

        return await self.db.run(body, transaction=True)

    async def list_service_accounts(self, org_id: uuid.UUID) -> list[dict]:
        rows = await self.db.fetch(
            "SELECT id, org_id, name, description, client_id, created_at FROM service_accounts "
            "WHERE org_id = $1 ORDER BY created_at", org_id)
        return [dict(r) for r in rows]

    async def delete_service_account(self, org_id: uuid.UUID, sa_id: uuid.UUID) -> bool:
        async def body(conn: asyncpg.Connection) -> bool:
            status = await conn.execute("DELETE FROM service_accounts WHERE org_id = $1 AND id = $2", org_id, sa_id)
            await conn.execute("DELETE FROM relations WHERE org_id = $1 AND subject_type = 'service' "
                               "AND subject_id = $2", org_id, sa_id)
            return status.endswith(" 1")

        return await self.db.run(body, transaction=True)

    async def find_client(self, client_id: str) -> dict | None:
        row = await self.db.fetchrow(
            "SELECT id, org_id, name, client_id, secret_hash FROM service_accounts WHERE client_id = $1", client_id)
        return dict(row) if row else None

    async def service_account_org(self, sa_id: uuid.UUID) -> uuid.UUID | None:
        """The organisation the account belongs to now (None: no such account)."""
        return await self.db.fetchval("SELECT org_id FROM service_accounts WHERE id = $1", sa_id)

    async def service_account_exists(self, sa_id: uuid.UUID) -> bool:
        return bool(await self.db.fetchval("SELECT EXISTS (SELECT 1 FROM service_accounts WHERE id = $1)", sa_id))

    # -- relations ----------------------------------------------------------------------------
    async def relations_of(self, org_id: uuid.UUID, subject_type: str, subject_id: uuid.UUID) -> list[tuple]:
        rows = await self.db.fetch(
            "SELECT object_type, object_id, relation FROM relations "
            "WHERE org_id = $1 AND subject_type = $2 AND subject_id = $3", org_id, subject_type, subject_id)
        return [(r["object_type"], r["object_id"], r["relation"]) for r in rows]

    async def grant(self, org_id: uuid.UUID, object_type: str, object_id: uuid.UUID, relation: str,
                    subject_type: str, subject_id: uuid.UUID, now: dt.datetime) -> bool:
        status = await self.db.execute(
            "INSERT INTO relations (org_id, object_type, object_id, relation, subject_type, subject_id, created_at) "
            "VALUES ($1,$2,$3,$4,$5,$6,$7) ON CONFLICT DO NOTHING",
            org_id, object_type, object_id, relation, subject_type, subject_id, now)
        return status.endswith(" 1")

    async def revoke(self, org_id: uuid.UUID, object_type: str, object_id: uuid.UUID, relation: str,
                     subject_type: str, subject_id: uuid.UUID) -> bool:
        status = await self.db.execute(
            "DELETE FROM relations WHERE org_id = $1 AND object_type = $2 AND object_id = $3 AND relation = $4 "
            "AND subject_type = $5 AND subject_id = $6",
            org_id, object_type, object_id, relation, subject_type, subject_id)
        return status.endswith(" 1")

    async def list_relations(self, org_id: uuid.UUID, *, object_type: str | None = None,
                             object_id: uuid.UUID | None = None) -> list[dict]:
        rows = await self.db.fetch(
            "SELECT object_type, object_id, relation, subject_type, subject_id, created_at FROM relations "
            "WHERE org_id = $1 AND ($2::text IS NULL OR object_type = $2) AND ($3::uuid IS NULL OR object_id = $3) "
            "ORDER BY created_at", org_id, object_type, object_id)
        return [dict(r) for r in rows]

    async def object_in_org(self, org_id: uuid.UUID, object_type: str, object_id: uuid.UUID) -> bool:
        table = {"fleet": "fleets", "device": "devices", "configuration": "configurations"}.get(object_type)
        if table is None:
            return object_type == "organization" and object_id == org_id
        return bool(await self.db.fetchval(
            f"SELECT EXISTS (SELECT 1 FROM {table} WHERE org_id = $1 AND id = $2)", org_id, object_id))

    # -- sessions -----------------------------------------------------------------------------
    async def create_session(self, id_hash: bytes, user_id: uuid.UUID, csrf_token: str, now: dt.datetime,
                             expires_at: dt.datetime, client_addr: str | None) -> None:
        await self.db.execute(
            "INSERT INTO sessions (id_hash, user_id, csrf_token, created_at, expires_at, client_addr) "
            "VALUES ($1,$2,$3,$4,$5,$6)", id_hash, user_id, csrf_token, now, expires_at, client_addr)

    async def find_session_in_org(self, id_hash: bytes, org_id: uuid.UUID | None) -> dict | None:
        row = await self.db.fetchrow(
            "SELECT s.user_id, s.csrf_token, s.expires_at, u.is_staff, m.role, o.tier, o.rate_limit "
            "FROM sessions s JOIN users u ON u.id = s.user_id "
            "LEFT JOIN memberships m ON m.user_id = s.user_id AND m.org_id = $2 "
            "LEFT JOIN organizations o ON o.id = m.org_id "
            "WHERE s.id_hash = $1", id_hash, org_id)
        return dict(row) if row else None

    async def delete_session(self, id_hash: bytes) -> None:
        await self.db.execute("DELETE FROM sessions WHERE id_hash = $1", id_hash)
