"""Tunnel entitlements and sessions (0006_metering.sql tunnel_sessions, 0008_tunnels.sql).

Each method is one storage crossing. Opening a session counts the open sessions and inserts the new
row in one transaction under a per-organisation advisory lock, so two opens racing for the last slot
cannot both win. Usage columns only grow (GREATEST); every update returns by how much they grew,
which is what the caller meters: a repeated or out-of-order tunnel.usage event meters nothing twice.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal

import asyncpg

from storage.db import Database

ENTITLEMENT_FIELDS = ("enabled", "relay_allowed", "max_sessions_per_device", "max_sessions", "bandwidth_bps",
                      "max_session_seconds")
_SESSION_COLUMNS = ("id, org_id, device_id, principal_kind, principal_id, target, relay_allowed, state, opened_at, "
                    "expires_at, closed_at, close_reason, duration_seconds, bytes_in, bytes_out, relayed_bytes, "
                    "grant_payload, max_expires_at, updated_at")
OPEN_STATES = ("opening", "open")


def _session(row: asyncpg.Record | None) -> dict | None:
    if row is None:
        return None
    out = dict(row)
    if isinstance(out.get("grant_payload"), str):
        out["grant_payload"] = json.loads(out["grant_payload"])
    return out


class Tunnels:
    def __init__(self, db: Database) -> None:
        self.db = db

    # ---- entitlements ----
    async def entitlement(self, org_id: uuid.UUID) -> dict | None:
        row = await self.db.fetchrow(
            f"SELECT org_id, {', '.join(ENTITLEMENT_FIELDS)}, updated_at FROM tunnel_entitlements WHERE org_id = $1",
            org_id)
        return dict(row) if row else None

    async def set_entitlement(self, org_id: uuid.UUID, changes: dict, now: dt.datetime) -> dict:
        """Upsert: fields not in ``changes`` keep their stored value (or the column default)."""
        unknown = set(changes) - set(ENTITLEMENT_FIELDS)
        if unknown:
            raise ValueError(f"not entitlement fields: {sorted(unknown)}")

        async def body(conn: asyncpg.Connection) -> dict:
            await conn.execute("INSERT INTO tunnel_entitlements (org_id, updated_at) VALUES ($1, $2) "
                               "ON CONFLICT (org_id) DO NOTHING", org_id, now)
            sets = ", ".join(f"{name} = ${i + 3}" for i, name in enumerate(changes))
            row = await conn.fetchrow(
                f"UPDATE tunnel_entitlements SET updated_at = $2{', ' + sets if sets else ''} WHERE org_id = $1 "
                f"RETURNING org_id, {', '.join(ENTITLEMENT_FIELDS)}, updated_at",
                org_id, now, *changes.values())
            return dict(row)

        return await self.db.run(body, transaction=True)

    # ---- sessions ----
    async def open_session(self, row: dict, *, max_sessions: int, max_per_device: int) -> str | None:
        """Insert the session (state opening) unless a limit is reached: then None is not returned but
        the name of the limit, ``too_many_sessions`` or ``device_busy``. Sessions count while their
        state is opening or open and their grant has not expired."""

        async def body(conn: asyncpg.Connection) -> str | None:
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1::text, 7))", str(row["org_id"]))
            counts = await conn.fetchrow(
                """SELECT count(*) AS org, count(*) FILTER (WHERE device_id = $2) AS device
                   FROM tunnel_sessions WHERE org_id = $1 AND state IN ('opening', 'open') AND expires_at > $3""",
                row["org_id"], row["device_id"], row["opened_at"])
            if counts["org"] >= max_sessions:
                return "too_many_sessions"
            if counts["device"] >= max_per_device:
                return "device_busy"
            await conn.execute(
                """INSERT INTO tunnel_sessions (id, org_id, device_id, principal_kind, principal_id, target,
                       relay_allowed, state, opened_at, expires_at, grant_payload, max_expires_at, updated_at)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, 'opening', $8, $9, $10::jsonb, $11, $8)""",
                row["id"], row["org_id"], row["device_id"], row["principal_kind"], row["principal_id"],
                row["target"], row["relay_allowed"], row["opened_at"], row["expires_at"],
                json.dumps(row["grant_payload"]), row["max_expires_at"])
            return None

        return await self.db.run(body, transaction=True)

    async def get(self, sid: uuid.UUID) -> dict | None:
        return _session(await self.db.fetchrow(f"SELECT {_SESSION_COLUMNS} FROM tunnel_sessions WHERE id = $1", sid))

    async def get_in_org(self, org_id: uuid.UUID, sid: uuid.UUID) -> dict | None:
        return _session(await self.db.fetchrow(
            f"SELECT {_SESSION_COLUMNS} FROM tunnel_sessions WHERE id = $1 AND org_id = $2", sid, org_id))

    async def open_ids(self) -> list[uuid.UUID]:
        return [r["id"] for r in await self.db.fetch(
            "SELECT id FROM tunnel_sessions WHERE state IN ('opening', 'open')")]

    async def set_open(self, sid: uuid.UUID, now: dt.datetime) -> None:
        await self.db.execute("UPDATE tunnel_sessions SET state = 'open', updated_at = $2 "
                              "WHERE id = $1 AND state = 'opening'", sid, now)

    async def renew(self, sid: uuid.UUID, payload: dict, expires_at: dt.datetime, now: dt.datetime) -> bool:
        status = await self.db.execute(
            """UPDATE tunnel_sessions SET grant_payload = $2::jsonb, expires_at = $3, updated_at = $4
               WHERE id = $1 AND state IN ('opening', 'open')""", sid, json.dumps(payload), expires_at, now)
        return status.endswith(" 1")

    async def finish(self, sid: uuid.UUID, state: str, reason: str, now: dt.datetime) -> dict | None:
        """Close (or fail) the session once; its duration becomes at least the time it was open by
        the hub's clock. Returns the usage growth to meter, or None when it had already ended."""
        return await self._grow(sid, None, now, final_state=state, reason=reason)

    async def record_usage(self, sid: uuid.UUID, device_id: uuid.UUID, usage: dict, now: dt.datetime,
                           *, final: bool, reason: str | None) -> dict | None:
        """A device's tunnel.usage totals for its own session (another device's session: None)."""
        return await self._grow(sid, device_id, now, usage=usage, final_state="closed" if final else None,
                                reason=reason)

    async def _grow(self, sid: uuid.UUID, device_id: uuid.UUID | None, now: dt.datetime, *,
                    usage: dict | None = None, final_state: str | None, reason: str | None) -> dict | None:
        async def body(conn: asyncpg.Connection) -> dict | None:
            old = await conn.fetchrow(
                "SELECT org_id, device_id, state, opened_at, duration_seconds, bytes_in, bytes_out, relayed_bytes "
                "FROM tunnel_sessions WHERE id = $1 FOR UPDATE", sid)
            if old is None or (device_id is not None and old["device_id"] != device_id):
                return None
            ended = old["state"] not in OPEN_STATES
            if ended and usage is None:
                return None
            u = usage or {}
            duration = max(old["duration_seconds"], Decimal(str(u.get("durationSeconds", 0))))
            if final_state is not None and not ended:
                duration = max(duration, Decimal(str(round((now - old["opened_at"]).total_seconds(), 3))))
            new = {"duration_seconds": duration,
                   "bytes_in": max(old["bytes_in"], int(u.get("bytesIn", 0))),
                   "bytes_out": max(old["bytes_out"], int(u.get("bytesOut", 0))),
                   "relayed_bytes": max(old["relayed_bytes"], int(u.get("relayedBytes", 0)))}
            closing = final_state is not None and not ended
            await conn.execute(
                """UPDATE tunnel_sessions SET duration_seconds = $2, bytes_in = $3, bytes_out = $4,
                       relayed_bytes = $5, updated_at = $6,
                       state = CASE WHEN $7::text IS NULL THEN state ELSE $7 END,
                       closed_at = CASE WHEN $7::text IS NULL THEN closed_at ELSE $6 END,
                       close_reason = CASE WHEN $7::text IS NULL THEN close_reason ELSE $8 END
                   WHERE id = $1""",
                sid, new["duration_seconds"], new["bytes_in"], new["bytes_out"], new["relayed_bytes"], now,
                final_state if closing else None, reason)
            return {"org_id": old["org_id"], "device_id": old["device_id"], "closed": closing,
                    "seconds": new["duration_seconds"] - old["duration_seconds"],
                    "bytes": (new["bytes_in"] + new["bytes_out"]) - (old["bytes_in"] + old["bytes_out"]),
                    "relayed": new["relayed_bytes"] - old["relayed_bytes"]}

        return await self.db.run(body, transaction=True)
