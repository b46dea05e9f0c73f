"""Secret files (ciphertext only) and their delivery status per device.

Limits are enforced inside the transaction that writes, with the owner row locked, so two uploads
racing for the 32nd slot cannot both win. Delivery rows follow the spec's table: a device file is
pending for its device; a configuration file is pending for every device assigned the configuration,
or overridden where that device has its own file at the same path.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

import asyncpg

from storage.db import Database

MAX_FILES = 32
MAX_TOTAL_BYTES = 512 * 1024


class LimitExceeded(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class OwnerMissing(Exception):
    """The configuration or device is not in this organisation."""


@dataclass(frozen=True)
class Owner:
    kind: str          # "config" | "device"
    id: uuid.UUID

    @property
    def column(self) -> str:
        return "config_id" if self.kind == "config" else "device_id"

    @property
    def table(self) -> str:
        return "configurations" if self.kind == "config" else "devices"


_FILE_COLUMNS = "id, org_id, config_id, device_id, path, mode, uid, gid, size, sha256, created_at, updated_at"


async def _mark_config_file_deliveries(conn: asyncpg.Connection, file_id: uuid.UUID, config_id: uuid.UUID,
                                       path: str, sha: str, now: dt.datetime) -> None:
    """Pending on every device assigned the configuration; overridden where a device file has the path."""
    await conn.execute(
        """INSERT INTO secret_file_deliveries (file_id, device_id, status, sha256, updated_at)
           SELECT $1, d.id,
                  CASE WHEN EXISTS (SELECT 1 FROM secret_files f WHERE f.device_id = d.id AND f.path = $3)
                       THEN 'overridden' ELSE 'pending' END, $4, $5
           FROM devices d WHERE d.config_id = $2
           ON CONFLICT (file_id, device_id) DO UPDATE SET status = EXCLUDED.status, error = NULL,
               sha256 = EXCLUDED.sha256, updated_at = EXCLUDED.updated_at""",
        file_id, config_id, path, sha, now)


async def assign_deliveries(conn: asyncpg.Connection, device_ids: list[uuid.UUID], config_id: uuid.UUID | None,
                            now: dt.datetime) -> None:
    """Devices now run ``config_id``: its files are pending on them (overridden where a device has
    its own file at the path); deliveries of any other configuration's files on them go. Runs inside
    the caller's transaction (a rollout assigns a whole batch in one crossing)."""
    await conn.execute(
        """DELETE FROM secret_file_deliveries d USING secret_files f
           WHERE f.id = d.file_id AND d.device_id = ANY($1::uuid[]) AND f.config_id IS NOT NULL
             AND f.config_id IS DISTINCT FROM $2""", device_ids, config_id)
    if config_id is None:
        return
    await conn.execute(
        """INSERT INTO secret_file_deliveries (file_id, device_id, status, sha256, updated_at)
           SELECT f.id, dev.id,
                  CASE WHEN EXISTS (SELECT 1 FROM secret_files o WHERE o.device_id = dev.id AND o.path = f.path)
                       THEN 'overridden' ELSE 'pending' END, f.sha256, $3
           FROM secret_files f CROSS JOIN unnest($1::uuid[]) AS dev(id)
           WHERE f.config_id = $2
           ON CONFLICT (file_id, device_id) DO NOTHING""", device_ids, config_id, now)


# Every table with a ``ciphertext`` column sealed with the secret box (storage/crypto.py).
SEALED_TABLES = ("secret_files", "registry_credentials", "webhook_endpoints")


async def _reseal(conn: asyncpg.Connection, table: str, convert) -> int:
    await conn.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
    rows = await conn.fetch(f"SELECT id, ciphertext FROM {table}")
    if rows:
        await conn.execute(
            f"""UPDATE {table} t SET ciphertext = u.c FROM unnest($1::uuid[], $2::bytea[]) AS u(id, c)
                WHERE t.id = u.id""", [r["id"] for r in rows], [convert(bytes(r["ciphertext"])) for r in rows])
    return len(rows)


class SecretFiles:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def reencrypt_all(self, convert) -> int:
        """Apply ``convert(ciphertext) -> ciphertext`` to every stored sealed value (secret files,
        registry passwords, webhook signing secrets) in one transaction. Each table is locked against
        writes meanwhile, so nothing sealed with the old key lands between read and write."""
        async def body(conn: asyncpg.Connection) -> int:
            return sum([await _reseal(conn, table, convert) for table in SEALED_TABLES])

        return await self.db.run(body, transaction=True)

    async def upsert(self, org_id: uuid.UUID, owner: Owner, now: dt.datetime, *, path: str, mode: int, uid: int,
                     gid: int, ciphertext: bytes, size: int, sha256: str) -> dict:
        async def body(conn: asyncpg.Connection) -> dict:
            owner_row = await conn.fetchrow(
                f"SELECT id FROM {owner.table} WHERE org_id = $1 AND id = $2 FOR UPDATE", org_id, owner.id)
            if owner_row is None:
                raise OwnerMissing()
            others = await conn.fetchrow(
                f"SELECT count(*) AS n, COALESCE(sum(size), 0) AS total FROM secret_files "
                f"WHERE {owner.column} = $1 AND path <> $2", owner.id, path)
            if others["n"] + 1 > MAX_FILES:
                raise LimitExceeded("count")
            if others["total"] + size > MAX_TOTAL_BYTES:
                raise LimitExceeded("size")
            row = await conn.fetchrow(
                f"""INSERT INTO secret_files (id, org_id, {owner.column}, path, mode, uid, gid, size, sha256,
                                              ciphertext, created_at, updated_at)
                    VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$11)
                    ON CONFLICT ({owner.column}, path) DO UPDATE SET mode = EXCLUDED.mode, uid = EXCLUDED.uid,
                        gid = EXCLUDED.gid, size = EXCLUDED.size, sha256 = EXCLUDED.sha256,
                        ciphertext = EXCLUDED.ciphertext, updated_at = EXCLUDED.updated_at
                    RETURNING {_FILE_COLUMNS}""",
                uuid.uuid4(), org_id, owner.id, path, mode, uid, gid, size, sha256, ciphertext, now)
            if owner.kind == "device":
                await conn.execute(
                    """INSERT INTO secret_file_deliveries (file_id, device_id, status, sha256, updated_at)
                       VALUES ($1, $2, 'pending', $3, $4)
                       ON CONFLICT (file_id, device_id) DO UPDATE SET status = 'pending', error = NULL,
                           sha256 = EXCLUDED.sha256, updated_at = EXCLUDED.updated_at""",
                    row["id"], owner.id, sha256, now)
                # The device file wins over its configuration's file at the same path.
                await conn.execute(
                    """UPDATE secret_file_deliveries d SET status = 'overridden', error = NULL, updated_at = $3
                       FROM secret_files f WHERE f.id = d.file_id AND f.config_id IS NOT NULL
                         AND d.device_id = $1 AND f.path = $2""", owner.id, path, now)
            else:
                await _mark_config_file_deliveries(conn, row["id"], owner.id, path, sha256, now)
            return dict(row)

        return await self.db.run(body, transaction=True)

    async def list(self, org_id: uuid.UUID, owner: Owner) -> list[dict] | None:
        """Metadata and delivery rows of an owner's files; None when the owner is not in the org."""

        async def body(conn: asyncpg.Connection):
            if not await conn.fetchval(f"SELECT 1 FROM {owner.table} WHERE org_id = $1 AND id = $2", org_id, owner.id):
                return None
            files = await conn.fetch(f"SELECT {_FILE_COLUMNS} FROM secret_files WHERE {owner.column} = $1 "
                                     "ORDER BY path", owner.id)
            deliveries = await conn.fetch(
                "SELECT d.* FROM secret_file_deliveries d JOIN secret_files f ON f.id = d.file_id "
                f"WHERE f.{owner.column} = $1 ORDER BY d.device_id", owner.id)
            by_file: dict[uuid.UUID, list[dict]] = {}
            for d in deliveries:
                by_file.setdefault(d["file_id"], []).append(dict(d))
            return [{**dict(f), "deliveries": by_file.get(f["id"], [])} for f in files]

        return await self.db.run(body)

    async def deliveries(self, owner: Owner, file_id: uuid.UUID, status: str | None, offset: int,
                         limit: int) -> tuple[int, list[dict]] | None:
        """One page of a file's per-device deliveries (failed first, then pending, then the rest, each
        by device name), with the device name and the total; None when the file is not the owner's."""
        async def body(conn: asyncpg.Connection):
            if not await conn.fetchval(f"SELECT 1 FROM secret_files WHERE id = $1 AND {owner.column} = $2",
                                       file_id, owner.id):
                return None
            total = await conn.fetchval(
                "SELECT count(*) FROM secret_file_deliveries WHERE file_id = $1 AND ($2::text IS NULL OR status = $2)",
                file_id, status)
            rows = await conn.fetch(
                """SELECT d.device_id, dev.name, d.status, d.error, d.updated_at
                   FROM secret_file_deliveries d JOIN devices dev ON dev.id = d.device_id
                   WHERE d.file_id = $1 AND ($2::text IS NULL OR d.status = $2)
                   ORDER BY CASE d.status WHEN 'failed' THEN 0 WHEN 'pending' THEN 1 ELSE 2 END, dev.name, d.device_id
                   OFFSET $3 LIMIT $4""", file_id, status, offset, limit)
            return int(total), [dict(r) for r in rows]

        return await self.db.run(body)

    async def delete(self, org_id: uuid.UUID, owner: Owner, file_id: uuid.UUID,
                     now: dt.datetime) -> tuple[str, list[uuid.UUID]] | None:
        """Delete one file; returns its path and the devices it may be on (to remove it there)."""

        async def body(conn: asyncpg.Connection):
            row = await conn.fetchrow(
                f"SELECT id, path FROM secret_files WHERE org_id = $1 AND {owner.column} = $2 AND id = $3 FOR UPDATE",
                org_id, owner.id, file_id)
            if row is None:
                return None
            devices = [r["device_id"] for r in await conn.fetch(
                "SELECT device_id FROM secret_file_deliveries WHERE file_id = $1 AND status IN "
                "('on_device', 'pending', 'failed')", file_id)]
            await conn.execute("DELETE FROM secret_files WHERE id = $1", file_id)
            if owner.kind == "device":
                # The configuration's file at this path is no longer overridden on this device.
                await conn.execute(
                    """UPDATE secret_file_deliveries d SET status = 'pending', updated_at = $3
                       FROM secret_files f WHERE f.id = d.file_id AND f.config_id IS NOT NULL
                         AND d.device_id = $1 AND f.path = $2 AND d.status = 'overridden'""",
                    owner.id, row["path"], now)
            return row["path"], devices

        return await self.db.run(body, transaction=True)

    # -- delivery ---------------------------------------------------------------------------------
    async def device_files_to_push(self, device_id: uuid.UUID) -> list[dict]:
        """The device's own files whose delivery is not confirmed (pending or failed), with ciphertext."""
        rows = await self.db.fetch(
            f"SELECT f.{_FILE_COLUMNS.replace(', ', ', f.')}, f.ciphertext FROM secret_files f "
            "JOIN secret_file_deliveries d ON d.file_id = f.id AND d.device_id = f.device_id "
            "WHERE f.device_id = $1 AND d.status IN ('pending', 'failed') ORDER BY f.path", device_id)
        return [dict(r) for r in rows]

    async def expected_on_device(self, device_id: uuid.UUID) -> list[dict]:
        """Every file that should be on the device now: its own, and its configuration's not
        overridden — with delivery status (for reconciling the hello's digests)."""
        rows = await self.db.fetch(
            f"""SELECT f.{_FILE_COLUMNS.replace(', ', ', f.')}, d.status
                FROM secret_file_deliveries d JOIN secret_files f ON f.id = d.file_id
                WHERE d.device_id = $1 AND d.status <> 'overridden'""", device_id)
        return [dict(r) for r in rows]

    async def config_files_for(self, device_id: uuid.UUID, config_id: uuid.UUID) -> list[dict]:
        """The configuration's files this device should get with the configuration (not overridden)."""
        rows = await self.db.fetch(
            f"""SELECT f.{_FILE_COLUMNS.replace(', ', ', f.')}, f.ciphertext FROM secret_files f
                WHERE f.config_id = $2 AND NOT EXISTS (
                    SELECT 1 FROM secret_files o WHERE o.device_id = $1 AND o.path = f.path)
                ORDER BY f.path""", device_id, config_id)
        return [dict(r) for r in rows]

    async def paths_of_version(self, version_id: uuid.UUID) -> list[str]:
        """Paths of the files of the configuration a version belongs to (a device running that
        version keeps them)."""
        rows = await self.db.fetch(
            """SELECT f.path FROM secret_files f JOIN configuration_versions v ON v.config_id = f.config_id
               WHERE v.id = $1""", version_id)
        return [r["path"] for r in rows]

    async def config_files_waiting(self, device_id: uuid.UUID, config_id: uuid.UUID) -> list[dict]:
        """The configuration's files still pending on this device, with ciphertext: added or replaced
        after the device got the version it runs."""
        rows = await self.db.fetch(
            f"""SELECT f.{_FILE_COLUMNS.replace(', ', ', f.')}, f.ciphertext FROM secret_files f
                JOIN secret_file_deliveries d ON d.file_id = f.id AND d.device_id = $1
                WHERE f.config_id = $2 AND d.status = 'pending' ORDER BY f.path""", device_id, config_id)
        return [dict(r) for r in rows]

    async def devices_running_config_waiting(self, file_id: uuid.UUID) -> list[uuid.UUID]:
        """Devices that run (applied) their configuration's assigned version and wait for this
        configuration file: the ones to send it to now if linked. Any other device gets it with its next
        version or at its next hello. Not filtered on ``online``: the presence row is written behind, so
        the caller asks the live actors (hub/api/secret_files.py tell_linked)."""
        rows = await self.db.fetch(
            """SELECT dev.id FROM secret_file_deliveries d JOIN devices dev ON dev.id = d.device_id
               WHERE d.file_id = $1 AND d.status = 'pending'
                 AND dev.config_version_id IS NOT NULL AND dev.applied_version_id = dev.config_version_id
                 AND dev.config_status = 'applied'""", file_id)
        return [r["id"] for r in rows]

    async def record(self, device_id: uuid.UUID, results: list[dict], now: dt.datetime) -> None:
        """Apply a device's file results: on_device / failed (with its error) per file id."""
        rows = [(uuid.UUID(r["fileId"]), r["status"], r.get("error"), r.get("sha256"))
                for r in results if r.get("fileId") and r.get("status") in ("on_device", "failed")]
        if not rows:
            return
        await self.db.execute(
            """UPDATE secret_file_deliveries d SET status = u.status, error = u.error, updated_at = $5
               FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS u(file_id, status, error, sha256)
               WHERE d.file_id = u.file_id AND d.device_id = $6 AND d.status <> 'overridden'
                 AND (u.status = 'failed' OR u.sha256 IS NULL OR u.sha256 = d.sha256)""",
            [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], now, device_id)

    async def mark_config_files(self, device_id: uuid.UUID, config_id: uuid.UUID, status: str, error: str | None,
                                now: dt.datetime) -> None:
        """A configuration's deliveries still pending on one device, at once: used when the device
        rejected the configuration, so its new files were not applied (those already on the device
        from the version it kept stay on_device)."""
        await self.db.execute(
            """UPDATE secret_file_deliveries d SET status = $3, error = $4, updated_at = $5
               FROM secret_files f WHERE f.id = d.file_id AND f.config_id = $2 AND d.device_id = $1
                 AND d.status = 'pending'""", device_id, config_id, status, error, now)

    async def assign_config(self, device_id: uuid.UUID, config_id: uuid.UUID | None, now: dt.datetime) -> None:
        """The device now runs ``config_id`` (or none): see ``assign_deliveries``."""
        await self.db.run(assign_deliveries, [device_id], config_id, now, transaction=True)

    async def forget_device(self, device_id: uuid.UUID) -> None:
        """A factory reset: the device's own files go, and nothing is pending for it any more."""

        async def body(conn: asyncpg.Connection) -> None:
            await conn.execute("DELETE FROM secret_files WHERE device_id = $1", device_id)
            await conn.execute("DELETE FROM secret_file_deliveries WHERE device_id = $1", device_id)

        await self.db.run(body, transaction=True)
