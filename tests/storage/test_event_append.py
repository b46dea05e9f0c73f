"""The event log's append (storage/events.py): one round trip for a batch of any organisations, each
organisation's events numbered in the order given, and no gap or duplicate between appends that race."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import trio

from storage.db import Database
from storage.events import EventLog, NewEvent, append_on
from storage.orgs import Orgs

NOW = dt.datetime(2026, 11, 28, tzinfo=dt.UTC)


class CountingConnection:
    """An asyncpg connection that counts the statements sent through it (each one a round trip)."""

    def __init__(self, conn) -> None:
        self.conn, self.sent = conn, 0

    def __getattr__(self, name: str):
        attr = getattr(self.conn, name)
        if name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
            self.sent += 1
        return attr


def _event(org_id: uuid.UUID, n: int) -> NewEvent:
    device = uuid.UUID(int=n + 1)
    return NewEvent(org_id=org_id, kind="device.event.probe", subject=f"devices/{device}", time=NOW,
                    data={"n": n}, device_id=device)


async def _orgs(db: Database, count: int) -> list[uuid.UUID]:
    orgs = Orgs(db)
    return [(await orgs.create_org(f"org-{i}", NOW))["id"] for i in range(count)]


async def test_a_batch_of_two_organisations_is_one_round_trip_numbered_in_the_order_given(db_url):
    db = Database(db_url)
    with trio.fail_after(30):
        await db.open()
        try:
            a, b = await _orgs(db, 2)
            counted: list[CountingConnection] = []

            async def append(conn, events):
                counted.append(CountingConnection(conn))
                return await append_on(counted[0], events)

            batch = [_event(b, 0), _event(a, 1), _event(b, 2), _event(a, 3), _event(a, 4)]
            assert await db.run(append, batch) == [1, 1, 2, 2, 3]
            assert counted[0].sent == 1
            log = EventLog(db)
            assert [e.data["n"] for e in await log.page(a, 0)] == [1, 3, 4]
            assert [e.data["n"] for e in await log.page(b, 0)] == [0, 2]
            assert await log.cursors(a) == (3, 0)
            # the next batch goes on from the counter
            assert await log.append([_event(a, 5)]) == [4]
        finally:
            await db.close()


async def test_appends_that_race_leave_no_gap_and_no_duplicate(db_url):
    db = Database(db_url, max_size=8)
    with trio.fail_after(60):
        await db.open()
        try:
            a, b = await _orgs(db, 2)
            log = EventLog(db)
            got: list[list[int]] = []

            async def one(i: int) -> None:
                got.append(await log.append([_event(a, 3 * i), _event(b, 3 * i + 1), _event(a, 3 * i + 2)]))

            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(one, i)
            for first_a, _b, second_a in got:
                assert second_a == first_a + 1  # one append's events of an organisation are consecutive
            assert sorted(s for seqs in got for s in (seqs[0], seqs[2])) == list(range(1, 41))
            assert sorted(seqs[1] for seqs in got) == list(range(1, 21))
            assert [e.org_seq for e in await log.page(a, 0)] == list(range(1, 41))
        finally:
            await db.close()


async def test_an_unknown_organisations_event_is_refused_whole_and_ids_are_given_by_postgresql(db_url):
    """events.org_id has no foreign key (migration 0027): the organisation is checked once per append,
    by the counters row the same statement moves on. A batch naming one that does not exist writes
    nothing, not even its other organisation's events; an event appended without an id gets one."""
    import asyncpg

    db = Database(db_url)
    with trio.fail_after(30):
        await db.open()
        try:
            (a,) = await _orgs(db, 1)
            log = EventLog(db)
            with pytest.raises(asyncpg.ForeignKeyViolationError):
                await log.append([_event(a, 0), _event(uuid.uuid4(), 1)])
            assert await log.page(a, 0) == [] and await log.cursors(a) == (0, 0)
            await log.append([_event(a, 2), _event(a, 3)])
            ids = [e.id for e in await log.page(a, 0)]
            assert len(set(ids)) == 2 and all(isinstance(i, uuid.UUID) for i in ids)
        finally:
            await db.close()
