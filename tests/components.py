"""A component with its real PostgreSQL and nothing else of a hub (issue 34: tests that start less).

``open_stores`` gives the hub's stores (storage/stores.py) on this test's migrated database: what a
test of a repository, the meter or another outbox needs, without the app, the actors, the device link
or the background work a whole hub starts (tests/hubtools.py ``start_hub``, for what crosses them).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from device_client.shared.clock import Clock
from storage.db import Database
from storage.stores import Stores


@contextlib.asynccontextmanager
async def open_stores(db_url: str, data_dir: Path) -> AsyncIterator[Stores]:
    db = Database(db_url, min_size=1, max_size=4)
    await db.open()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        yield Stores.open(db, data_dir)
    finally:
        await db.close()


async def new_org(stores: Stores, name: str = "Acme") -> uuid.UUID:
    return (await stores.orgs.create_org(name, Clock().now()))["id"]
