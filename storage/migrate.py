"""Ordered SQL migrations (storage/migrations/NNNN_name.sql), applied at start under an advisory lock.

Every hub process calls ``migrate``; the advisory lock makes concurrent starts apply each file
exactly once, and the schema_migrations table records what was applied. Each file runs in its own
transaction, so a failing migration leaves the schema at the previous version.
"""

from __future__ import annotations

from importlib import resources

import asyncpg

from storage.db import Database

# An arbitrary constant: the advisory lock key all fleethub processes agree on.
MIGRATION_LOCK_KEY = 0x466C6565_7448  # "FleetH"


def migration_files() -> list[tuple[str, str]]:
    folder = resources.files("storage") / "migrations"
    files = sorted(p for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(p.name.removesuffix(".sql"), p.read_text()) for p in files]


async def _apply(conn: asyncpg.Connection, files: list[tuple[str, str]]) -> list[str]:
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
            version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())""")
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        applied = []
        for version, sql in files:
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
            applied.append(version)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


async def migrate(db: Database) -> list[str]:
    """Apply every migration not yet recorded; returns the versions applied now."""
    return await db.run(_apply, migration_files())
