"""A pooled connection asyncpg can no longer use (InternalClientError, "another operation is in
progress": seen by the fault suite while PostgreSQL shut down) is dropped and reported as the database
being unreachable, so that work waiting out outages (Actor.until_stored) tries again; before, the error
went up as a bug and a device's configuration result was lost, stalling its rollout (issue 38)."""

from __future__ import annotations

import asyncpg
import pytest
import trio

from storage.db import Database, DatabaseUnavailable


async def test_a_connection_in_an_unusable_state_is_dropped_and_reported_unreachable(db_url):
    db = Database(db_url, min_size=1, max_size=1)
    with trio.fail_after(30):
        await db.open()
        try:
            first = await db.fetchval("SELECT pg_backend_pid()")  # one connection in the pool: this one

            async def stuck(conn: asyncpg.Connection) -> None:
                raise asyncpg.exceptions.InternalClientError(
                    "cannot switch to state 12; another operation (2) is in progress")

            with pytest.raises(DatabaseUnavailable):
                await db.run(stuck, transaction=True)
            assert db.unreachable
            assert await db.fetchval("SELECT pg_backend_pid()") != first  # dropped: a fresh one serves
            assert not db.unreachable
        finally:
            await db.close()
