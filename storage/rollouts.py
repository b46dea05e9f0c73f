"""Rollouts and their device steps."""

from __future__ import annotations

import builtins
import datetime as dt
import uuid
from collections.abc import Sequence

import asyncpg

from storage.db import Database
from storage.events import NewEvent
from storage.events import append_on as append_events
from storage.leases import Fence, RolloutLeases
from storage.leases import check as check_lease
from storage.rowcache import RowCache
from storage.secrets import assign_deliveries

ACTIVE = ("pending", "running", "paused")


class FleetBusy(Exception):
    """A fleet already has an active rollout."""


async def _name(conn: asyncpg.Connection, rows: list[dict]) -> None:
    """Give each rollout row what a reader calls its parts by: ``config_name``, ``version_number``
    and ``fleet_names`` ({fleet id: name}); a configuration or fleet deleted since reads None."""
    if not rows:
        return
    org_id = rows[0]["org_id"]  # the rows are one organisation's
    configs = {r["config_id"] for r in rows}
    versions = {r["version_id"] for r in rows}
    fleets = {f for r in rows for f in r["fleet_ids"]}
    config_names = {c["id"]: c["name"] for c in await conn.fetch(
        "SELECT id, name FROM configurations WHERE org_id = $1 AND id = ANY($2::uuid[])", org_id, list(configs))}
    numbers = {v["id"]: v["version"] for v in await conn.fetch(
        "SELECT id, version FROM configuration_versions WHERE org_id = $1 AND id = ANY($2::uuid[])",
        org_id, list(versions))}
    fleet_names = {f["id"]: f["name"] for f in await conn.fetch(
        "SELECT id, name FROM fleets WHERE org_id = $1 AND id = ANY($2::uuid[])", org_id, list(fleets))}
    for r in rows:
        r["config_name"] = config_names.get(r["config_id"])
        r["version_number"] = numbers.get(r["version_id"])
        r["fleet_names"] = {f: fleet_names.get(f) for f in r["fleet_ids"]}


class Rollouts:
    def __init__(self, db: Database, device_cache: RowCache | None = None) -> None:
        self.db = db
        # assign() changes device rows: evict them from the device read cache shared with Devices.
        self.device_cache = device_cache

    async def create(self, row: dict, steps: list[tuple[uuid.UUID, uuid.UUID, int, str, str | None]],
                     lease: tuple[str, float] | None = None) -> dict:
        """The rollout and its device steps in one transaction; refuses a fleet that already has an
        active rollout (two rollouts fighting over one device would each undo the other). On a cluster
        node ``lease`` (owner, ttl) is the creator's lease, inserted in the same transaction; its
        fence is returned under the key ``fence``."""

        async def body(conn: asyncpg.Connection) -> dict:
            await conn.execute("SELECT id FROM fleets WHERE id = ANY($1::uuid[]) FOR UPDATE", row["fleet_ids"])
            busy = await conn.fetchval(
                "SELECT id FROM rollouts WHERE org_id = $1 AND fleet_ids && $2::uuid[] AND state = ANY($3::text[])",
                row["org_id"], row["fleet_ids"], list(ACTIVE))
            if busy is not None:
                raise FleetBusy(str(busy))
            cols = list(row)
            created = await conn.fetchrow(
                f"INSERT INTO rollouts ({', '.join(cols)}) VALUES ({', '.join(f'${i + 1}' for i in range(len(cols)))}) "
                "RETURNING *", *row.values())
            # previous_version_id: what the device runs now, which a revert of this rollout goes back to
            await conn.executemany(
                "INSERT INTO rollout_devices (rollout_id, device_id, fleet_id, batch, step, error, updated_at, "
                "previous_version_id) VALUES ($1, $2, $3, $4, $5, $6, $7, "
                "(SELECT applied_version_id FROM devices WHERE id = $2))",
                [(created["id"], d, f, b, st, err, row["created_at"]) for d, f, b, st, err in steps])
            out = dict(created)
            if lease is not None:
                out["fence"] = await RolloutLeases.born(conn, created["id"], *lease)
            return out

        return await self.db.run(body, transaction=True)

    async def org_of(self, rollout_id: uuid.UUID) -> uuid.UUID | None:
        """The organisation a rollout belongs to, without tenancy: for routes the spec lists with no
        organisation header (the caller's membership is checked after, hub/auth/middleware.py)."""
        return await self.db.fetchval("SELECT org_id FROM rollouts WHERE id = $1", rollout_id)

    async def get(self, org_id: uuid.UUID, rollout_id: uuid.UUID) -> tuple[dict, list[dict]] | None:
        async def body(conn: asyncpg.Connection):
            row = await conn.fetchrow("SELECT * FROM rollouts WHERE org_id = $1 AND id = $2", org_id, rollout_id)
            if row is None:
                return None
            # check_output: what the device's health check printed when it rejected this version
            # (devices.config_check_output, kept with its rejection only)
            steps = await conn.fetch(
                "SELECT r.*, CASE WHEN d.config_status = 'rejected' AND d.config_version_id = $2 "
                "THEN d.config_check_output END AS check_output FROM rollout_devices r "
                "LEFT JOIN devices d ON d.id = r.device_id WHERE r.rollout_id = $1 ORDER BY r.batch, r.device_id",
                rollout_id, row["version_id"])
            named = dict(row)
            await _name(conn, [named])
            return named, [dict(s) for s in steps]

        return await self.db.run(body)

    async def latest_of_fleet(self, org_id: uuid.UUID, fleet_id: uuid.UUID, *,
                              reverts: bool = True) -> dict | None:
        """The fleet's newest rollout, in any state (a fleet has at most one active); with
        ``reverts=False`` the newest that is not a revert (of the fleet or of one of its devices)."""
        row = await self.db.fetchrow(
            "SELECT * FROM rollouts WHERE org_id = $1 AND fleet_ids @> ARRAY[$2::uuid] "
            "AND ($3 OR revert_kind IS NULL) ORDER BY created_at DESC, id LIMIT 1", org_id, fleet_id, reverts)
        return dict(row) if row else None

    async def versions_before(self, rollout_id: uuid.UUID, fleet_id: uuid.UUID) -> list[dict]:
        """What the fleet's devices ran when the rollout was created, most devices first (then the
        newer version): ``{version_id, devices}`` each, leaving out devices that ran nothing and
        those that ran the rollout's own version already."""
        rows = await self.db.fetch(
            """SELECT r.previous_version_id AS version_id, count(*) AS devices
               FROM rollout_devices r JOIN rollouts o ON o.id = r.rollout_id
               JOIN configuration_versions v ON v.id = r.previous_version_id
               WHERE r.rollout_id = $1 AND r.fleet_id = $2 AND r.previous_version_id <> o.version_id
               GROUP BY r.previous_version_id, v.created_at ORDER BY count(*) DESC, v.created_at DESC""",
            rollout_id, fleet_id)
        return [dict(r) for r in rows]

    async def get_any(self, rollout_id: uuid.UUID) -> tuple[dict, list[dict]] | None:
        org_id = await self.db.fetchval("SELECT org_id FROM rollouts WHERE id = $1", rollout_id)
        return await self.get(org_id, rollout_id) if org_id else None

    async def list(self, org_id: uuid.UUID, *, offset: int, limit: int, state: str | None,
                   only_fleets: set | None = None) -> tuple[list[dict], int]:
        """``only_fleets``: only rollouts all of whose fleets are among these (a member's permitted
        fleets: reading a rollout needs viewer on each of its fleets). Each row carries its names (``_name``)
        and ``queued_by_fleet``: its devices waiting for their fleet's update window, per fleet."""
        fleets = list(only_fleets) if only_fleets is not None else None

        async def body(conn: asyncpg.Connection):
            cond = ("org_id = $1 AND ($2::text IS NULL OR state = $2) "
                    "AND ($3::uuid[] IS NULL OR fleet_ids <@ $3::uuid[])")
            total = await conn.fetchval(f"SELECT count(*) FROM rollouts WHERE {cond}", org_id, state, fleets)
            found = await conn.fetch(f"SELECT * FROM rollouts WHERE {cond} ORDER BY created_at DESC, id "
                                     "OFFSET $4 LIMIT $5", org_id, state, fleets, offset, limit)
            rows = [dict(r) for r in found]
            queued = await conn.fetch(
                "SELECT rollout_id, fleet_id, count(*) AS n FROM rollout_devices "
                "WHERE rollout_id = ANY($1::uuid[]) AND step = 'QUEUED_MAINTENANCE' GROUP BY rollout_id, fleet_id",
                [r["id"] for r in rows])
            for r in rows:
                r["queued_by_fleet"] = {q["fleet_id"]: q["n"] for q in queued if q["rollout_id"] == r["id"]}
            await _name(conn, rows)
            return rows, total

        return await self.db.run(body)

    # builtins.list from here on: in this class's body ``list`` is the method above, and a type checker
    # reads an annotation there as that method (mypy: "list?[...] is not iterable" in actors/rollout.py)
    async def active_ids(self) -> builtins.list[uuid.UUID]:
        rows = await self.db.fetch("SELECT id FROM rollouts WHERE state = ANY($1::text[])", list(ACTIVE))
        return [r["id"] for r in rows]

    async def save(self, rollout_id: uuid.UUID, now: dt.datetime, *, state: str, current_batch: int,
                   reason: str | None, accepted_failures: int, accepted_batch: int,
                   steps: builtins.list[tuple[uuid.UUID, str, str | None, dt.datetime]], fence: Fence | None = None,
                   events: Sequence[NewEvent] = ()) -> None:
        """The rollout's state, changed steps and the events announcing them (the event log) in one
        crossing and one transaction (in a cluster, only while ``fence`` is still the rollout's
        lease: else LeaseLost and nothing is written)."""

        async def body(conn: asyncpg.Connection) -> None:
            await check_lease(conn, fence)
            await append_events(conn, events)
            await conn.execute(
                "UPDATE rollouts SET state = $2, current_batch = $3, reason = $4, accepted_failures = $5, "
                "accepted_batch = $6, updated_at = $7 WHERE id = $1",
                rollout_id, state, current_batch, reason, accepted_failures, accepted_batch, now)
            if steps:
                await conn.execute(
                    """UPDATE rollout_devices r SET step = u.step, error = u.error, updated_at = u.at
                       FROM unnest($2::uuid[], $3::text[], $4::text[], $5::timestamptz[]) AS u(device_id, step, error, at)
                       WHERE r.rollout_id = $1 AND r.device_id = u.device_id""",
                    rollout_id, [s[0] for s in steps], [s[1] for s in steps], [s[2] for s in steps],
                    [s[3] for s in steps])

        await self.db.run(body, transaction=True)

    async def record(self, events: Sequence[NewEvent], fence: Fence | None = None) -> None:
        """Events with no change of their own to save, appended under the same fence."""

        async def body(conn: asyncpg.Connection) -> None:
            await check_lease(conn, fence)
            await append_events(conn, events)

        await self.db.run(body, transaction=True)

    async def device_views(self, version_id: uuid.UUID, device_ids: builtins.list[uuid.UUID]) -> builtins.list[dict]:
        """What the rollout needs of its devices each tick, in one statement: the configuration
        result, and the presence the DeviceActor wrote (online, state, and whether a memory test
        holds the workload: ``workloadHeld`` of its facts)."""
        rows = await self.db.fetch(
            "SELECT id, config_version_id, applied_version_id, config_status, config_error, online, state, "
            "COALESCE(facts->>'workloadHeld' = 'true', false) AS workload_held "
            "FROM devices WHERE id = ANY($1::uuid[])", device_ids)
        return [dict(r) for r in rows]

    async def assign(self, device_ids: builtins.list[uuid.UUID], config_id: uuid.UUID, version_id: uuid.UUID,
                     now: dt.datetime, fence: Fence | None = None) -> None:
        """Assign the rollout's version to many devices in one crossing (a tick starts a whole batch):
        their configuration files become pending there (or overridden by the device's own file at
        the path), other configurations' deliveries on them go, and the devices are told to apply.
        In a cluster only while ``fence`` is still the rollout's lease (else LeaseLost, nothing done)."""

        async def body(conn: asyncpg.Connection) -> None:
            await check_lease(conn, fence)
            await assign_deliveries(conn, device_ids, config_id, now)
            await conn.execute(
                """UPDATE devices SET config_id = $2, config_version_id = $3, config_status = 'pending',
                          config_error = NULL, updated_at = $4
                   WHERE id = ANY($1::uuid[]) AND (config_version_id IS DISTINCT FROM $3
                         OR config_status IS DISTINCT FROM 'applied')""", device_ids, config_id, version_id, now)

        await self.db.run(body, transaction=True)
        if self.device_cache is not None:
            self.device_cache.evict(device_ids)

    async def release(self, rollout_id: uuid.UUID, version_id: uuid.UUID, now: dt.datetime,
                      fence: Fence | None = None) -> builtins.list[uuid.UUID]:
        """A cancelled rollout gives its devices back what they run: each device it assigned its
        version to that does not run it and is not applying it now (pending, rejected, failed) is
        assigned the version it runs (or none), with that version's configuration and files, so
        no later link or upload sends it the cancelled version. A device applying it finishes (its
        result still counts); one assigned something else since is left alone. Their steps still in
        flight go back to pending (``RolloutMachine.released`` does the same in memory). Returns the
        devices released (idempotent: a second call finds none)."""

        async def body(conn: asyncpg.Connection) -> list[uuid.UUID]:
            await check_lease(conn, fence)
            rows = await conn.fetch(
                """SELECT d.id, d.config_id, v.config_id AS runs_config
                   FROM rollout_devices r JOIN devices d ON d.id = r.device_id
                   LEFT JOIN configuration_versions v ON v.id = d.applied_version_id
                   WHERE r.rollout_id = $1 AND d.config_version_id = $2
                     AND d.config_status IS DISTINCT FROM 'applying'
                     AND NOT (d.config_status = 'applied' AND d.applied_version_id = $2)
                   FOR UPDATE OF d""", rollout_id, version_id)
            by_config: dict[uuid.UUID | None, list[uuid.UUID]] = {}
            for r in rows:
                if r["runs_config"] != r["config_id"]:
                    by_config.setdefault(r["runs_config"], []).append(r["id"])
            for config_id, ids in by_config.items():
                await assign_deliveries(conn, ids, config_id, now)
            ids = [r["id"] for r in rows]
            if ids:
                await conn.execute(
                    """UPDATE devices d SET config_id = v.config_id, config_version_id = v.id,
                              config_status = CASE WHEN v.id IS NULL THEN NULL ELSE 'applied' END,
                              config_error = NULL, updated_at = $2
                       FROM devices o LEFT JOIN configuration_versions v ON v.id = o.applied_version_id
                       WHERE d.id = o.id AND d.id = ANY($1::uuid[])""", ids, now)
                # Their steps still in flight were never updated: pending, in the same transaction,
                # so a restarted rollout never waits on a device that no longer names its version.
                await conn.execute(
                    """UPDATE rollout_devices SET step = 'pending', error = NULL, updated_at = $3
                       WHERE rollout_id = $1 AND device_id = ANY($2::uuid[]) AND step IN ('updating', 'verifying')""",
                    rollout_id, ids, now)
            return ids

        released = await self.db.run(body, transaction=True)
        if self.device_cache is not None and released:
            self.device_cache.evict(released)
        return released
