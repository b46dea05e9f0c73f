"""Devices: registration, the device token (stored as SHA-256), presence, listing."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid

import asyncpg

from storage.db import Database
from storage.rowcache import RowCache

DEVICE_COLUMNS = (
    "id, org_id, fleet_id, name, tags, firmware, architecture, online, state, boot_reason, "
    "last_seen_at, connected_at, tunnel_public_key, facts, conditions, created_at, updated_at, "
    "config_id, config_version_id, applied_version_id, config_status, config_error, config_check_output, "
    "config_workload_log, previous_version_id, pull_settings_stale, "
    # the versions' numbers, which operators read (a version's number never changes: cacheable)
    "(SELECT version FROM configuration_versions cv WHERE cv.id = devices.config_version_id) AS config_version, "
    "(SELECT version FROM configuration_versions cv WHERE cv.id = devices.applied_version_id) AS applied_version, "
    "(SELECT version FROM configuration_versions cv WHERE cv.id = devices.previous_version_id) AS previous_version")


def _device(row: asyncpg.Record | None) -> dict | None:
    if row is None:
        return None
    d = dict(row)
    for key in ("facts", "conditions"):
        if isinstance(d.get(key), str):
            d[key] = json.loads(d[key])
    return d


#: NOTIFY channel of the devices_changed trigger (migration 0017): the id of a device deleted or moved
#: to another fleet, by any process; every hub process evicts it (``Devices.changed``).
CHANGED_CHANNEL = "fleethub_devices"


class Devices:
    """Reads by id go through ``cache`` (keyed by device id); every write here evicts what it touched.

    ``identities`` keeps, for every device read, what deciding access needs and nothing more: its
    organisation and fleet. It never expires (a device's organisation never changes; its fleet changes
    only through an UPDATE whose trigger notifies every process, ``changed``), so a command to a warm
    device (POST /v1/devices/{id}/ping) costs no storage crossing. About 200 bytes a device, bounded.
    """

    def __init__(self, db: Database, cache: RowCache | None = None) -> None:
        self.db = db
        self.cache = cache or RowCache()
        self.identities = RowCache(ttl=math.inf, max_entries=500_000)

    def changed(self, payload: str) -> None:
        """A NOTIFY on ``CHANGED_CHANNEL`` (any process's write, or a cascade): forget that device."""
        try:
            device_id = uuid.UUID(payload)
        except ValueError:
            return
        self.cache.evict([device_id])
        self.identities.evict([device_id])

    def forget_all(self) -> None:
        """Notifications may have been missed (the LISTEN connection was re-opened): start cold."""
        self.cache.clear()
        self.identities.clear()

    async def identity(self, org_id: uuid.UUID, device_id: uuid.UUID) -> tuple[uuid.UUID, uuid.UUID | None] | None:
        """(id, fleet id) of this organisation's device, else None, from ``identities`` when known."""
        known = self.identities.get(device_id)
        if known is None:
            row = await self.get_any(device_id)
            if row is None:
                return None
            known = (row["org_id"], row["fleet_id"])
        return (device_id, known[1]) if known[0] == org_id else None

    async def create(self, org_id: uuid.UUID, token_hash: bytes, now: dt.datetime, *, name: str,
                     fleet_id: uuid.UUID | None = None, tags: list[str] | None = None) -> dict:
        row = await self.db.fetchrow(
            f"INSERT INTO devices (id, org_id, fleet_id, name, tags, token_hash, created_at, updated_at) "
            f"VALUES ($1, $2, $3, $4, $5, $6, $7, $7) RETURNING {DEVICE_COLUMNS}",
            uuid.uuid4(), org_id, fleet_id, name, tags or [], token_hash, now)
        return _device(row)

    async def get(self, org_id: uuid.UUID, device_id: uuid.UUID, *, current: bool = False) -> dict | None:
        """``current``: past the cache (``current``), for a request that decides a write by the row."""
        row = await (self.current if current else self.get_any)(device_id)
        return row if row is not None and row["org_id"] == org_id else None

    async def get_any(self, device_id: uuid.UUID) -> dict | None:
        """Lookup without tenancy (actors rebuilding their state; ``get`` checks the org)."""
        row = self.cache.get(device_id)
        return row if row is not None else await self.current(device_id)

    async def current(self, device_id: uuid.UUID) -> dict | None:
        """The row as PostgreSQL holds it now, past the cache, which is then refreshed with it. For
        reads that decide a write (which configuration version a device is sent, whether its result
        still counts): in a cluster another node's write reaches this node's cache only when the
        entry expires, and a decision on the row before it sent a device the wrong version or
        dropped its result, leaving its rollout waiting for good (the fault suite, a node killed
        mid-rollout)."""
        seen, seen_identity = self.cache.generation, self.identities.generation
        row = _device(await self.db.fetchrow(f"SELECT {DEVICE_COLUMNS} FROM devices WHERE id = $1", device_id))
        if row is not None:
            self.cache.put(device_id, row, seen=seen)
            self.identities.put(device_id, (row["org_id"], row["fleet_id"]), seen=seen_identity)
        return row

    async def find_by_token(self, token_hash: bytes) -> dict | None:
        return _device(await self.db.fetchrow(
            f"SELECT {DEVICE_COLUMNS} FROM devices WHERE token_hash = $1", token_hash))

    async def list(self, org_id: uuid.UUID, *, offset: int, limit: int, fleet_id: uuid.UUID | None = None,
                   online: bool | None = None, tag: str | None = None, firmware: str | None = None,
                   architecture: str | None = None, condition: str | None = None, updating: bool | None = None,
                   config_status: str | None = None, search: str | None = None, name: str | None = None,
                   only: tuple[set, set] | None = None) -> tuple[list[dict], int]:
        """``only`` = (device ids, fleet ids): restrict to devices granted directly or through a fleet.
        ``condition`` is a condition type (MemoryFault); ``updating``, a configuration on its way
        (pending or applying); ``config_status``, one configuration status (``none``: no configuration
        assigned); ``search``, a case-insensitive substring of the name (taken literally); ``name``, the
        exact name (names are not unique: several devices may answer)."""
        where = ["org_id = $1"]
        args: list = [org_id]
        if only is not None:
            args += [list(only[0]), list(only[1])]
            where.append(f"(id = ANY(${len(args) - 1}::uuid[]) OR fleet_id = ANY(${len(args)}::uuid[]))")
        if fleet_id is not None:
            args.append(fleet_id)
            where.append(f"fleet_id = ${len(args)}")
        if online is not None:
            args.append(online)
            where.append(f"online = ${len(args)}")
        if tag is not None:
            args.append(tag)
            where.append(f"${len(args)} = ANY(tags)")
        for column, value in (("firmware", firmware), ("architecture", architecture), ("name", name)):
            if value is not None:
                args.append(value)
                where.append(f"{column} = ${len(args)}")
        if condition is not None:
            args.append(json.dumps([{"type": condition}]))
            where.append(f"conditions @> ${len(args)}::jsonb")
        if updating is not None:
            where.append(("" if updating else "NOT ") + "coalesce(config_status IN ('pending', 'applying'), false)")
        if config_status == "none":
            where.append("config_status IS NULL")
        elif config_status is not None:
            args.append(config_status)
            where.append(f"config_status = ${len(args)}")
        if search:
            # LIKE's own characters are escaped: the operator's text is matched as typed
            args.append("%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
            where.append(f"name ILIKE ${len(args)}")
        cond = " AND ".join(where)

        async def body(conn: asyncpg.Connection) -> tuple[list[dict], int]:
            total = await conn.fetchval(f"SELECT count(*) FROM devices WHERE {cond}", *args)
            rows = await conn.fetch(
                f"SELECT {DEVICE_COLUMNS} FROM devices WHERE {cond} ORDER BY created_at, id "
                f"OFFSET ${len(args) + 1} LIMIT ${len(args) + 2}", *args, offset, limit)
            return [_device(r) for r in rows], total

        return await self.db.run(body)

    async def update(self, org_id: uuid.UUID, device_id: uuid.UUID, now: dt.datetime, changes: dict) -> dict | None:
        allowed = {k: v for k, v in changes.items() if k in ("name", "tags", "fleet_id")}
        sets = ", ".join(f"{k} = ${i + 4}" for i, k in enumerate(allowed))
        if "fleet_id" in allowed:
            self.identities.evict([device_id])  # now, and again below: a read racing the write is not kept
        row = await self.db.fetchrow(
            f"UPDATE devices SET updated_at = $3{', ' + sets if sets else ''} "
            f"WHERE org_id = $1 AND id = $2 RETURNING {DEVICE_COLUMNS}",
            org_id, device_id, now, *allowed.values())
        if "fleet_id" in allowed:
            self.identities.evict([device_id])
        return self._evicted(device_id, row)

    async def delete(self, org_id: uuid.UUID, device_id: uuid.UUID) -> bool:
        status = await self.db.execute("DELETE FROM devices WHERE org_id = $1 AND id = $2", org_id, device_id)
        self.cache.evict([device_id])
        self.identities.evict([device_id])
        return status.endswith(" 1")

    async def assign_config(self, org_id: uuid.UUID, device_id: uuid.UUID, config_id: uuid.UUID,
                            version_id: uuid.UUID, now: dt.datetime) -> dict | None:
        return self._evicted(device_id, await self.db.fetchrow(
            f"UPDATE devices SET config_id = $3, config_version_id = $4, config_status = 'pending', "
            f"config_error = NULL, config_check_output = NULL, config_workload_log = NULL, updated_at = $5 WHERE org_id = $1 AND id = $2 RETURNING {DEVICE_COLUMNS}",
            org_id, device_id, config_id, version_id, now))

    async def set_config_result(self, device_id: uuid.UUID, status: str, error: str | None,
                                applied_version_id: uuid.UUID | None, now: dt.datetime, *,
                                assigned: uuid.UUID, check_output: str | None = None,
                                workload_log: str | None = None) -> bool:
        """The configuration status of the version the device is assigned; whether it was written.

        ``assigned``: written only while the device is still assigned that version, checked in the
        same statement (required: every result is about one version, so none may land unchecked).
        A result decided on a row read earlier (the reply to config.apply and the
        config.result event are recorded in separate tasks) must not land on the version a cancelled
        rollout gave back in between (``Rollouts.release``), or on one an operator assigned:
        the device would show a rejection of the version it runs. ``check_output`` and
        ``workload_log``: what a rejecting device sent (migration 0020); every other result clears
        them, so they always belong to the rejection shown."""
        done = await self.db.execute(
            "UPDATE devices SET config_status = $2, config_error = $3, applied_version_id = $4, updated_at = $5, "
            "config_check_output = $6, config_workload_log = $7 "
            "WHERE id = $1 AND config_version_id = $8",
            device_id, status, error, applied_version_id, now, check_output, workload_log, assigned)
        self.cache.evict([device_id])
        return done != "UPDATE 0"

    def _evicted(self, device_id: uuid.UUID, row: asyncpg.Record | None) -> dict | None:
        """After a write: the cached copy is stale (evicted after the write, so a read racing it
        cannot put the old row back for longer than the cache's ttl)."""
        self.cache.evict([device_id])
        return _device(row)

    async def set_pull_settings_stale(self, device_id: uuid.UUID, stale: bool) -> None:
        """Migration 0025: whether the device's registry logins or proxy mode are older than the hub's."""
        await self.db.execute("UPDATE devices SET pull_settings_stale = $2 WHERE id = $1", device_id, stale)
        self.cache.evict([device_id])

    async def mark_pull_settings_stale(self, org_id: uuid.UUID, version_ids: list[uuid.UUID],
                                       fleet_id: uuid.UUID | None = None,
                                       device_id: uuid.UUID | None = None) -> list[uuid.UUID]:
        """The organisation's devices (of ``fleet_id``, or the one ``device_id``, when given) running one
        of ``version_ids`` now hold stale pull settings; their ids."""
        if not version_ids:
            return []
        rows = await self.db.fetch(
            "UPDATE devices SET pull_settings_stale = true WHERE org_id = $1 AND applied_version_id = ANY($2::uuid[]) "
            "AND ($3::uuid IS NULL OR fleet_id = $3) AND ($4::uuid IS NULL OR id = $4) RETURNING id",
            org_id, version_ids, fleet_id, device_id)
        ids = [r["id"] for r in rows]
        self.cache.evict(ids)
        return ids

    async def clear_config(self, device_id: uuid.UUID, now: dt.datetime) -> None:
        await self.db.execute(
            "UPDATE devices SET config_id = NULL, config_version_id = NULL, applied_version_id = NULL, "
            "config_status = NULL, config_error = NULL, config_check_output = NULL, config_workload_log = NULL, "
            "updated_at = $2 WHERE id = $1", device_id, now)
        self.cache.evict([device_id])


    async def write_presence(self, rows: list[dict]) -> None:
        """Coalesced presence of many devices in one statement (heartbeats are written behind).

        Each row: id, online, state, boot_reason, last_seen_at, connected_at, and, when a hello
        arrived since the last flush, firmware, architecture, tunnel_public_key, facts. A row with an
        ``epoch`` (a cluster node's link, ``claim_link``) is written only while that epoch is still
        the device's: a node whose link was taken over writes nothing more.
        """
        if not rows:
            return
        await self.db.execute(
            """UPDATE devices d SET
                   online = u.online, state = u.state,
                   boot_reason = COALESCE(u.boot_reason, d.boot_reason),
                   last_seen_at = GREATEST(u.last_seen_at, d.last_seen_at),
                   connected_at = COALESCE(u.connected_at, d.connected_at),
                   firmware = COALESCE(u.firmware, d.firmware),
                   architecture = COALESCE(u.architecture, d.architecture),
                   tunnel_public_key = COALESCE(u.tunnel_public_key, d.tunnel_public_key),
                   facts = COALESCE(u.facts::jsonb, d.facts)
               FROM unnest($1::uuid[], $2::bool[], $3::text[], $4::text[], $5::timestamptz[],
                           $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bigint[])
                    AS u(id, online, state, boot_reason, last_seen_at, connected_at, firmware,
                         architecture, tunnel_public_key, facts, epoch)
               WHERE d.id = u.id AND (u.epoch IS NULL OR d.link_epoch = u.epoch)""",
            [r["id"] for r in rows], [r["online"] for r in rows], [r["state"] for r in rows],
            [r.get("boot_reason") for r in rows], [r.get("last_seen_at") for r in rows],
            [r.get("connected_at") for r in rows], [r.get("firmware") for r in rows],
            [r.get("architecture") for r in rows], [r.get("tunnel_public_key") for r in rows],
            [json.dumps(r["facts"]) if r.get("facts") is not None else None for r in rows],
            [r.get("epoch") for r in rows])
        self.cache.evict(r["id"] for r in rows)

    async def mark_node_offline(self, node: str) -> int:
        """A cluster node starting holds no links yet: the devices whose last link it accepted (a
        previous run of the same node id, killed) are offline, unless another node took them since."""
        self.cache.clear()
        status = await self.db.execute(
            "UPDATE devices SET online = false, state = 'offline' WHERE link_node = $1 AND (online OR state <> 'offline')",
            node)
        return int(status.split()[-1])

    async def link_node(self, device_id: uuid.UUID) -> str | None:
        """The cluster node that last accepted this device's link, while the row says online."""
        return await self.db.fetchval("SELECT link_node FROM devices WHERE id = $1 AND online", device_id)

    async def last_link_node(self, device_id: uuid.UUID) -> str | None:
        """The cluster node that accepted this device's last link, online or not: written at link time
        (``claim_link``, before the link's hello reads anything), so never behind the device, unlike the
        presence row's ``online``. hub/cluster/tells.py asks that node whether it still holds it."""
        return await self.db.fetchval("SELECT link_node FROM devices WHERE id = $1", device_id)

    async def claim_link(self, device_id: uuid.UUID, node: str) -> int:
        """A cluster node accepted this device's link: the device's next link epoch, now the only one
        whose presence writes count (``write_presence``). 0 when the device no longer exists."""
        epoch = await self.db.fetchval(
            "UPDATE devices SET link_epoch = link_epoch + 1, link_node = $2 WHERE id = $1 RETURNING link_epoch",
            device_id, node)
        return int(epoch or 0)

    async def mark_all_offline(self) -> int:
        """At hub start no device is connected to this process yet."""
        self.cache.clear()
        status = await self.db.execute(
            "UPDATE devices SET online = false, state = 'offline' WHERE online OR state <> 'offline'")
        return int(status.split()[-1])
