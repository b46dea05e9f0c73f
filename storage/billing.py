"""Billing rows: profiles (0006), prices and feature states (0009), and the reads the billing
endpoints make over metering (usage_daily, device_active_days) and tunnel_sessions. Each method is
one storage crossing."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from decimal import Decimal

import asyncpg

from storage.db import Database
from storage.events import NewEvent
from storage.events import append_on as append_events

PROFILE_FIELDS = ("plan", "enterprise", "anchor_day", "locked")


class Billing:
    def __init__(self, db: Database) -> None:
        self.db = db

    # ---- profiles ----
    async def profile(self, org_id: uuid.UUID) -> dict | None:
        row = await self.db.fetchrow("SELECT * FROM billing_profiles WHERE org_id = $1", org_id)
        return dict(row) if row else None

    async def put_profile(self, org_id: uuid.UUID, now: dt.datetime, *, log_events: bool = True, **changes) -> dict:
        """Create the profile (plan required) or change the given fields of an existing one. A lock
        set or lifted is an event (``billing.lock``, docs/events.md), appended in the same transaction
        (``log_events``: the event log is on)."""
        changes = {k: v for k, v in changes.items() if k in PROFILE_FIELDS and v is not None}

        async def body(conn: asyncpg.Connection) -> dict:
            old = await conn.fetchrow("SELECT * FROM billing_profiles WHERE org_id = $1 FOR UPDATE", org_id)
            if old is None:
                if "plan" not in changes:
                    raise ValueError("a new billing profile needs a plan")
                row = await conn.fetchrow(
                    """INSERT INTO billing_profiles (org_id, plan, enterprise, anchor_day, locked, created_at, updated_at)
                       VALUES ($1, $2, $3, $4, $5, $6, $6) RETURNING *""",
                    org_id, changes["plan"], changes.get("enterprise", False), changes.get("anchor_day", 1),
                    changes.get("locked", False), now)
            else:
                merged = {**dict(old), **changes}
                row = await conn.fetchrow(
                    """UPDATE billing_profiles SET plan = $2, enterprise = $3, anchor_day = $4, locked = $5,
                       updated_at = $6 WHERE org_id = $1 RETURNING *""",
                    org_id, merged["plan"], merged["enterprise"], merged["anchor_day"], merged["locked"], now)
            if log_events and bool(row["locked"]) != bool(old is not None and old["locked"]):
                await append_events(conn, [NewEvent(
                    org_id=org_id, kind="billing.lock", subject=f"organizations/{org_id}", time=now,
                    data={"locked": row["locked"], "plan": row["plan"]}, fleet_ids=())])
            return dict(row)

        return await self.db.run(body, transaction=True)

    async def profiles(self) -> list[dict]:
        return [dict(r) for r in await self.db.fetch("SELECT * FROM billing_profiles ORDER BY created_at")]

    # ---- prices ----
    async def set_price(self, product: str, org_id: uuid.UUID | None, effective_from: dt.date,
                        unit_price: Decimal, now: dt.datetime) -> dict:
        row = await self.db.fetchrow(
            """INSERT INTO billing_prices (id, product, org_id, effective_from, unit_price, created_at)
               VALUES ($1, $2, $3, $4, $5, $6)
               ON CONFLICT (product, COALESCE(org_id, '00000000-0000-0000-0000-000000000000'::uuid), effective_from)
               DO UPDATE SET unit_price = EXCLUDED.unit_price, created_at = EXCLUDED.created_at
               RETURNING *""", uuid.uuid4(), product, org_id, effective_from, unit_price, now)
        return dict(row)

    async def prices(self, org_id: uuid.UUID | None) -> list[dict]:
        """List prices and (when org_id is given) that organisation's overrides, oldest first."""
        rows = await self.db.fetch(
            """SELECT product, org_id, effective_from, unit_price FROM billing_prices
               WHERE org_id IS NULL OR org_id = $1 ORDER BY product, effective_from""", org_id)
        return [dict(r) for r in rows]

    async def all_prices(self) -> list[dict]:
        rows = await self.db.fetch("SELECT product, org_id, effective_from, unit_price, created_at FROM billing_prices "
                                   "ORDER BY product, org_id NULLS FIRST, effective_from")
        return [dict(r) for r in rows]

    # ---- features ----
    async def record_feature(self, org_id: uuid.UUID, feature: str, enabled: bool, source: str,
                             now: dt.datetime) -> None:
        await self.db.execute(
            "INSERT INTO billing_feature_states (org_id, feature, enabled, source, changed_at) VALUES ($1, $2, $3, $4, $5)",
            org_id, feature, enabled, source, now)

    async def latest_features(self, org_id: uuid.UUID) -> dict[str, bool]:
        rows = await self.db.fetch(
            """SELECT DISTINCT ON (feature) feature, enabled FROM billing_feature_states
               WHERE org_id = $1 ORDER BY feature, changed_at DESC, id DESC""", org_id)
        return {r["feature"]: r["enabled"] for r in rows}

    async def feature_history(self, org_id: uuid.UUID, until: dt.datetime) -> dict[str, list[tuple[dt.datetime, bool]]]:
        rows = await self.db.fetch(
            """SELECT feature, enabled, changed_at FROM billing_feature_states
               WHERE org_id = $1 AND changed_at < $2 ORDER BY changed_at, id""", org_id, until)
        out: dict[str, list] = defaultdict(list)
        for r in rows:
            out[r["feature"]].append((r["changed_at"], r["enabled"]))
        return dict(out)

    async def device_ids(self, org_id: uuid.UUID) -> list[uuid.UUID]:
        return [r["id"] for r in await self.db.fetch("SELECT id FROM devices WHERE org_id = $1", org_id)]

    # ---- metering reads ----
    async def usage(self, org_id: uuid.UUID, start: dt.date, end: dt.date) -> dict[str, dict[dt.date, Decimal]]:
        """{product: {day: quantity}} for start <= day < end, summed over keys; active_device from
        device_active_days (devices active that day)."""
        async def body(conn: asyncpg.Connection):
            summed = await conn.fetch(
                """SELECT product, day, sum(quantity) AS q FROM usage_daily
                   WHERE org_id = $1 AND day >= $2 AND day < $3 GROUP BY product, day""", org_id, start, end)
            active = await conn.fetch(
                """SELECT day, count(*) AS q FROM device_active_days
                   WHERE org_id = $1 AND day >= $2 AND day < $3 GROUP BY day""", org_id, start, end)
            return summed, active

        summed, active = await self.db.run(body)
        out: dict[str, dict[dt.date, Decimal]] = defaultdict(dict)
        for r in summed:
            out[r["product"]][r["day"]] = Decimal(r["q"])
        for r in active:
            out["active_device"][r["day"]] = Decimal(r["q"])
        return dict(out)

    async def registry_fallback(self, org_id: uuid.UUID, start: dt.date, end: dt.date) -> tuple[list[dict], list[dict]]:
        """(fleets with their proxy setting, [{day, key, bytes}]) for start <= day < end."""
        async def body(conn: asyncpg.Connection):
            fleets = await conn.fetch(
                "SELECT id, name, registry_proxy, registry_proxy_mode FROM fleets WHERE org_id = $1 ORDER BY name, id",
                org_id)
            usage = await conn.fetch(
                """SELECT day, key, quantity FROM usage_daily WHERE org_id = $1 AND product = 'registry_fallback_bytes'
                   AND day >= $2 AND day < $3 ORDER BY day, key""", org_id, start, end)
            return [dict(r) for r in fleets], [dict(r) for r in usage]

        return await self.db.run(body)

    # ---- tunnel sessions ----
    async def tunnel_summary(self, org_id: uuid.UUID, since: dt.datetime, until: dt.datetime) -> dict:
        row = await self.db.fetchrow(
            """SELECT count(*) AS sessions, count(*) FILTER (WHERE state IN ('opening', 'open')) AS open_sessions,
                      COALESCE(sum(duration_seconds), 0) AS duration_seconds,
                      COALESCE(sum(bytes_in), 0)::bigint AS bytes_in, COALESCE(sum(bytes_out), 0)::bigint AS bytes_out,
                      COALESCE(sum(relayed_bytes), 0)::bigint AS relayed_bytes,
                      count(DISTINCT device_id) AS devices
               FROM tunnel_sessions WHERE org_id = $1 AND opened_at >= $2 AND opened_at <= $3""",
            org_id, since, until)
        return dict(row)

    async def tunnel_records(self, org_id: uuid.UUID, since: dt.datetime, until: dt.datetime,
                             after: tuple[dt.datetime, uuid.UUID] | None, limit: int) -> list[dict]:
        """Newest first, keyset over (opened_at, id): a page starts strictly after ``after``, so
        sessions opened meanwhile (newer) never shift or repeat what later pages return."""
        rows = await self.db.fetch(
            """SELECT id, device_id, principal_kind, principal_id, target, relay_allowed, state, opened_at,
                      expires_at, closed_at, close_reason, duration_seconds, bytes_in, bytes_out, relayed_bytes
               FROM tunnel_sessions
               WHERE org_id = $1 AND opened_at >= $2 AND opened_at <= $3
                 AND ($4::timestamptz IS NULL OR (opened_at, id) < ($4, $5::uuid))
               ORDER BY opened_at DESC, id DESC LIMIT $6""",
            org_id, since, until, after[0] if after else None, after[1] if after else None, limit)
        return [dict(r) for r in rows]
