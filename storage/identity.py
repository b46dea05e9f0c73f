"""Service accounts, relation tuples, dashboard sessions, memberships and invitations."""

from __future__ import annotations

import datetime as dt
import uuid

import asyncpg

from storage.db import Database, NameTaken


class DuplicateServiceAccount(NameTaken):
    """A service account with this name already exists in the organisation."""

    kind = "service account"


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

    # -- memberships and invitations ------------------------------------------------------------
    async def _lock_admins(self, conn: asyncpg.Connection, org_id: uuid.UUID) -> list[uuid.UUID]:
        """Lock the organisation's row, so two admins demoting or removing each other at once are
        serialised (each would otherwise see the other still admin), and return its admins."""
        await conn.execute("SELECT 1 FROM organizations WHERE id = $1 FOR UPDATE", org_id)
        rows = await conn.fetch("SELECT user_id FROM memberships WHERE org_id = $1 AND role = 'admin'", org_id)
        return [r["user_id"] for r in rows]

    async def set_role(self, org_id: uuid.UUID, user_id: uuid.UUID, role: str) -> str:
        """A member's new role: "updated", "not_member", or "last_admin" (refused: the organisation
        would be left without an admin)."""

        async def body(conn: asyncpg.Connection) -> str:
            admins = await self._lock_admins(conn, org_id)
            if role != "admin" and admins == [user_id]:
                return "last_admin"
            status = await conn.execute("UPDATE memberships SET role = $3 WHERE org_id = $1 AND user_id = $2",
                                        org_id, user_id, role)
            return "updated" if status.endswith(" 1") else "not_member"

        return await self.db.run(body, transaction=True)

    async def remove_member(self, org_id: uuid.UUID, user_id: uuid.UUID) -> str:
        """"removed" (with the member's relation tuples), "not_member", or "last_admin" (refused)."""

        async def body(conn: asyncpg.Connection) -> str:
            admins = await self._lock_admins(conn, org_id)
            if admins == [user_id]:
                return "last_admin"
            status = await conn.execute("DELETE FROM memberships WHERE org_id = $1 AND user_id = $2", org_id, user_id)
            if not status.endswith(" 1"):
                return "not_member"
            await conn.execute("DELETE FROM relations WHERE org_id = $1 AND subject_type = 'user' "
                               "AND subject_id = $2", org_id, user_id)
            return "removed"

        return await self.db.run(body, transaction=True)

    async def member_by_email(self, org_id: uuid.UUID, email: str) -> dict | None:
        row = await self.db.fetchrow(
            "SELECT u.id, u.email, m.role FROM users u JOIN memberships m ON m.user_id = u.id AND m.org_id = $1 "
            "WHERE u.email = $2", org_id, email.lower())
        return dict(row) if row else None

    async def invite(self, org_id: uuid.UUID, email: str, role: str, invited_by: uuid.UUID | None,
                     now: dt.datetime, expires_at: dt.datetime) -> dict:
        """The open invitation of ``email`` to the organisation, created or refreshed (role, expiry).
        Never looks at whether the email is a registered user's."""
        row = await self.db.fetchrow(
            "INSERT INTO invitations (id, org_id, email, role, invited_by, created_at, expires_at) "
            "VALUES ($1,$2,$3,$4,$5,$6,$7) "
            "ON CONFLICT (org_id, email) WHERE accepted_at IS NULL DO UPDATE SET role = EXCLUDED.role, "
            "invited_by = EXCLUDED.invited_by, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at "
            "RETURNING *", uuid.uuid4(), org_id, email.lower(), role, invited_by, now, expires_at)
        return dict(row)

    async def org_invitations(self, org_id: uuid.UUID, now: dt.datetime) -> list[dict]:
        rows = await self.db.fetch(
            "SELECT * FROM invitations WHERE org_id = $1 AND accepted_at IS NULL AND expires_at > $2 "
            "ORDER BY created_at", org_id, now)
        return [dict(r) for r in rows]

    async def revoke_invitation(self, org_id: uuid.UUID, invitation_id: uuid.UUID) -> bool:
        status = await self.db.execute("DELETE FROM invitations WHERE org_id = $1 AND id = $2 AND accepted_at IS NULL",
                                       org_id, invitation_id)
        return status.endswith(" 1")

    async def invitations_of(self, user_id: uuid.UUID, now: dt.datetime) -> list[dict]:
        """Open invitations addressed to this user's email."""
        rows = await self.db.fetch(
            "SELECT i.*, o.name AS org_name FROM invitations i JOIN users u ON u.email = i.email "
            "JOIN organizations o ON o.id = i.org_id "
            "WHERE u.id = $1 AND i.accepted_at IS NULL AND i.expires_at > $2 ORDER BY i.created_at", user_id, now)
        return [dict(r) for r in rows]

    async def accept_invitation(self, invitation_id: uuid.UUID, user_id: uuid.UUID, now: dt.datetime) -> dict | None:
        """Join the organisation with the invited role (a current member keeps the role they have);
        None when there is no open invitation with this id for this user's email."""

        async def body(conn: asyncpg.Connection) -> dict | None:
            inv = await conn.fetchrow(
                "UPDATE invitations i SET accepted_at = $3, accepted_by = $2 FROM users u "
                "WHERE i.id = $1 AND u.id = $2 AND u.email = i.email AND i.accepted_at IS NULL "
                "AND i.expires_at > $3 RETURNING i.*", invitation_id, user_id, now)
            if inv is None:
                return None
            await conn.execute(
                "INSERT INTO memberships (org_id, user_id, role, created_at) VALUES ($1,$2,$3,$4) "
                "ON CONFLICT (org_id, user_id) DO NOTHING", inv["org_id"], user_id, inv["role"], now)
            role = await conn.fetchval("SELECT role FROM memberships WHERE org_id = $1 AND user_id = $2",
                                       inv["org_id"], user_id)
            return {**dict(inv), "member_role": role}

        return await self.db.run(body, transaction=True)
