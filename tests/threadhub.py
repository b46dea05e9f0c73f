"""A real hub on a thread of its own, for suites whose tests are synchronous (the conformance suite's
httpx client, Playwright's browser). pytest-trio gives every async test its own trio run, so a hub
shared by a module or the session lives in a thread with a trio run of its own, in a database of its
own made from the tests' template; tests reach into that run with ``trio.from_thread.run(..., trio_token=)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import trio

Setup = Callable[[trio.Nursery, str, Path], Awaitable[dict[str, Any]]]


def create_database(server_dsn: str, template: str) -> str:
    name = f"conformance_{os.getpid()}_{uuid.uuid4().hex[:6]}"

    async def create() -> None:
        conn = await asyncpg.connect(server_dsn)
        try:
            await conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
        finally:
            await conn.close()

    asyncio.run(create())
    return name


def drop_database(server_dsn: str, name: str) -> None:
    async def drop() -> None:
        conn = await asyncpg.connect(server_dsn)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await conn.close()

    asyncio.run(drop())


@contextlib.contextmanager
def hub_in_thread(server_dsn: str, template: str, name: str, setup: Setup, *,
                  start_timeout: float = 90) -> Iterator[dict[str, Any]]:
    """Run ``setup(nursery, db_url, root)`` (it starts the hub, returned under ``"hub"``, and what goes
    beside it) in a trio run on its own thread; yield what it returned plus ``token``, ``nursery`` and
    ``root``. On exit the hub stops, and its database and directory are removed."""
    db_name = create_database(server_dsn, template)
    db_url = server_dsn.rsplit("/", 1)[0] + "/" + db_name
    root = Path(tempfile.mkdtemp(prefix=f"fleethub-{name}-"))
    ready: dict[str, Any] = {}
    started, stop = threading.Event(), threading.Event()

    async def serve() -> None:
        try:
            async with trio.open_nursery() as nursery:
                with trio.fail_after(start_timeout):
                    found = await setup(nursery, db_url, root)
                ready.update(found, token=trio.lowlevel.current_trio_token(), nursery=nursery, root=root)
                started.set()
                # abandoned if the hub fails meanwhile: the nursery then ends with the hub's error and
                # the run finishes, so the next call from a test says why (conftest's _say_why_stopped)
                # instead of meeting a hub whose storage closed under a run that waits here for ever
                await trio.to_thread.run_sync(stop.wait, abandon_on_cancel=True)
                await found["hub"].client.aclose()
                nursery.cancel_scope.cancel()
        except BaseException as exc:  # noqa: BLE001 — handed to the main thread below
            ready["error"] = exc
            started.set()

    thread = threading.Thread(target=trio.run, args=(serve,), name=f"{name}-hub", daemon=True)
    thread.start()
    try:
        started.wait(start_timeout + 30)
        if "hub" not in ready:
            raise RuntimeError(f"the {name} hub did not start: {ready.get('error')!r}")
        yield ready
    finally:
        stop.set()
        thread.join(30)
        drop_database(server_dsn, db_name)
        shutil.rmtree(root, ignore_errors=True)


async def add_operator(hub: Any, password: str) -> str:
    """A person who signs in with a password (an admin of the hub's organisation); their email."""
    from hub.auth.passwords import hash_password

    s = hub.services
    email = f"operator-{uuid.uuid4().hex[:6]}@test.local"
    digest = await trio.to_thread.run_sync(hash_password, password)
    user = await s.stores.orgs.create_user(email, s.clock.now(), password_hash=digest)
    await s.stores.orgs.add_member(uuid.UUID(hub.org_id), user["id"], "admin", s.clock.now())
    return email
