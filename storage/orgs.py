"""Organisations, users and memberships."""

from __future__ import annotations

import datetime as dt
import uuid

import asyncpg

from storage.db import Database


class Orgs:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create_org(self, name: str, now: dt.datetime, *, tier: str = "standard") -> dict:
        row = await self.db.fetchrow(
            "INSERT INTO organizations (id, name, tier, created_at) VALUES ($1, $2, $3, $4) RETURNING *",
            uuid.uuid4(), name, tier, now)
        return dict(row)

    async def get_org(self, org_id: uuid.UUID) -> dict | None:
        row = await self.db.fetchrow("SELECT * FROM organizations WHERE id = $1", org_id)
        return dict(row) if row else None

    async def create_user(self, email: str, now: dt.datetime, *, name: str = "",
                          password_hash: str | None = None, is_staff: bool = False) -> dict:
        row = await self.db.fetchrow(
            "INSERT INTO users (id, email, name, password_hash, is_staff, created_at) "
            "VALUES ($1, $2, $3, $4, $5, $6) RETURNING id, email, name, is_staff, created_at",
            uuid.uuid4(), email.lower(), name, password_hash, is_staff, now)
        return dict(row)

    async def get_user_by_email(self, email: str) -> dict | None:
        row = await self.db.fetchrow("SELECT * FROM users WHERE email = $1", email.lower())
        return dict(row) if row else None

    async def add_member(self, org_id: uuid.UUID, user_id: uuid.UUID, role: str, now: dt.datetime) -> None:
        await self.db.execute(
            "INSERT INTO memberships (org_id, user_id, role, created_at) VALUES ($1, $2, $3, $4) "
            "ON CONFLICT (org_id, user_id) DO UPDATE SET role = EXCLUDED.role",
            org_id, user_id, role, now)

    async def role_of(self, org_id: uuid.UUID, user_id: uuid.UUID) -> str | None:
        return await self.db.fetchval(
            "SELECT role FROM memberships WHERE org_id = $1 AND user_id = $2", org_id, user_id)

    async def ensure_demo(self, *, org_name: str, email: str, password_hash: str | None,
                          now: dt.datetime) -> tuple[dict, dict]:
        """The demo organisation and its admin, created once and found again on later runs."""

        async def body(conn: asyncpg.Connection) -> tuple[dict, dict]:
            user = await conn.fetchrow("SELECT id, email, name FROM users WHERE email = $1", email)
            if user is None:
                user = await conn.fetchrow(
                    "INSERT INTO users (id, email, name, password_hash, created_at) VALUES ($1,$2,$3,$4,$5) "
                    "RETURNING id, email, name", uuid.uuid4(), email, "Demo Admin", password_hash, now)
            org = await conn.fetchrow(
                "SELECT o.* FROM organizations o JOIN memberships m ON m.org_id = o.id "
                "WHERE m.user_id = $1 AND o.name = $2", user["id"], org_name)
            if org is None:
                # Professional tier: a demo explored by hand and by scripts should not hit 1,000/hour.
                org = await conn.fetchrow(
                    "INSERT INTO organizations (id, name, tier, created_at) VALUES ($1, $2, 'professional', $3) "
                    "RETURNING *", uuid.uuid4(), org_name, now)
                await conn.execute(
                    "INSERT INTO memberships (org_id, user_id, role, created_at) VALUES ($1,$2,'admin',$3)",
                    org["id"], user["id"], now)
            return dict(org), dict(user)

        return await self.db.run(body, transaction=True)
