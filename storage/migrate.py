"""Ordered SQL migrations (storage/migrations/NNNN_name.sql), applied at start under an advisory lock.

Every hub process calls ``migrate``; the advisory lock makes concurrent starts apply each file
exactly once, and the schema_migrations table records what was applied, with the SHA-256 of the file
as it was applied. Each file runs in its own transaction, so a failing migration leaves the schema at
the previous version.

A migration already applied is never run again, so editing its file changes nothing in a database
that has it — and makes that database differ from a fresh one built from the same files. A file whose
checksum no longer matches the one recorded stops the hub (``MigrationChanged``): restore the file and
put the change in a new migration. Rows recorded before checksums existed take the file's checksum
the first time they are seen (nothing to compare them with).
"""

from __future__ import annotations

import hashlib
import logging
from importlib import resources

import asyncpg

from storage.db import Database

log = logging.getLogger("fleethub.storage")

# An arbitrary constant: the advisory lock key all fleethub processes agree on.
MIGRATION_LOCK_KEY = 0x466C6565_7448  # "FleetH"


class MigrationChanged(Exception):
    """An applied migration's file was edited afterwards: the hub must not start on it."""

    def __init__(self, version: str, recorded: str, current: str) -> None:
        super().__init__(
            f"migration {version} was edited after it was applied to this database (applied as sha256 "
            f"{recorded[:12]}…, the file is now {current[:12]}…); the hub will not start: restore "
            f"storage/migrations/{version}.sql as it was and put the change in a new migration")
        self.version, self.recorded, self.current = version, recorded, current


def checksum(sql: str) -> str:
    return hashlib.sha256(sql.encode()).hexdigest()


def migration_files() -> list[tuple[str, str]]:
    folder = resources.files("storage") / "migrations"
    files = sorted(p for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(p.name.removesuffix(".sql"), p.read_text()) for p in files]


async def _apply(conn: asyncpg.Connection, files: list[tuple[str, str]]) -> list[str]:
    # A migration may rewrite a large table, and the lock may be held by another process migrating:
    # neither is the hung database the pool's statement_timeout is there for (reset after: session).
    await conn.execute("SET statement_timeout = 0")
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
            version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())""")
        await conn.execute("ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS checksum text")
        done = {r["version"]: r["checksum"] for r in await conn.fetch("SELECT version, checksum FROM schema_migrations")}
        # Every applied file is checked before anything new runs: an edited one stops the start as it is.
        for version, sql in files:
            recorded, current = done.get(version, ""), checksum(sql)
            if version in done and recorded is not None and recorded != current:
                raise MigrationChanged(version, recorded, current)
        adopted = [(v, checksum(sql)) for v, sql in files if v in done and done[v] is None]
        if adopted:
            await conn.executemany("UPDATE schema_migrations SET checksum = $2 WHERE version = $1", adopted)
            log.info("recorded checksums of %d migrations applied before checksums were kept", len(adopted))
        applied = []
        for version, sql in files:
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (version, checksum) VALUES ($1, $2)",
                                   version, checksum(sql))
            applied.append(version)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


async def migrate(db: Database) -> list[str]:
    """Apply every migration not yet recorded; returns the versions applied now. Raises
    ``MigrationChanged`` (and applies nothing) when an applied migration's file was edited."""
    # session: a session advisory lock is taken (and released) on the connection; unbounded: see _apply
    return await db.run(_apply, migration_files(), session=True, bounded=False)
