"""Personal API tokens. Only the SHA-256 of a secret is stored; lookups are by that hash."""

from __future__ import annotations

import datetime as dt
import uuid

from storage.db import Database


class Tokens:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create_pat(self, pat_id: str, user_id: uuid.UUID, secret_hash: bytes, now: dt.datetime, *,
                         description: str = "", expires_at: dt.datetime | None = None) -> dict:
        row = await self.db.fetchrow(
            "INSERT INTO pats (id, user_id, description, secret_hash, expires_at, created_at) "
            "VALUES ($1, $2, $3, $4, $5, $6) "
            "RETURNING id, user_id, description, expires_at, created_at, last_used_at",
            pat_id, user_id, description, secret_hash, expires_at, now)
        return dict(row)

    async def list_pats(self, user_id: uuid.UUID) -> list[dict]:
        rows = await self.db.fetch(
            "SELECT id, user_id, description, expires_at, created_at, last_used_at FROM pats "
            "WHERE user_id = $1 ORDER BY created_at", user_id)
        return [dict(r) for r in rows]

    async def delete_pat(self, pat_id: str, user_id: uuid.UUID) -> bool:
        status = await self.db.execute("DELETE FROM pats WHERE id = $1 AND user_id = $2", pat_id, user_id)
        return status.endswith(" 1")

    async def find_pat_in_org(self, secret_hash: bytes, org_id) -> dict | None:
        """The token with this secret, its user's role in ``org_id`` (None when not a member) and the
        organisation's rate-limit tier: authentication and the organisation check in one crossing."""
        row = await self.db.fetchrow(
            "SELECT p.id, p.user_id, p.expires_at, u.is_staff, m.role, o.tier, o.rate_limit "
            "FROM pats p JOIN users u ON u.id = p.user_id "
            "LEFT JOIN memberships m ON m.user_id = p.user_id AND m.org_id = $2 "
            "LEFT JOIN organizations o ON o.id = m.org_id "
            "WHERE p.secret_hash = $1", secret_hash, org_id)
        return dict(row) if row else None
