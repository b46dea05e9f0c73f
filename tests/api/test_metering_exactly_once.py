"""Metering counts once even when a flush's outcome is unknown (issue 14, item 7): a batch is stored
with its id in the same transaction, and one sent again under that id adds nothing. Real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import uuid

import trio

from hub.metering import Meter
from storage.usage import Usage
from tests.hubtools import start_hub

DAY = dt.date(2026, 11, 2)


async def stored(usage: Usage, org: uuid.UUID) -> dict:
    rows = await usage.daily(org, DAY, DAY + dt.timedelta(days=1))
    return {(r["product"], r["key"]): int(r["quantity"]) for r in rows}


async def test_a_batch_sent_twice_counts_once(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        org, usage = uuid.UUID(hub.org_id), hub.services.stores.usage
        rows = [{"org_id": org, "day": DAY, "product": "tunnel_bytes", "key": "", "quantity": 500}]
        batch = uuid.uuid4()
        assert await usage.add_many(rows, batch_id=batch) is True
        assert await usage.add_many(rows, batch_id=batch) is False  # the replay adds nothing
        assert await usage.add_many(rows, batch_id=uuid.uuid4()) is True  # another batch does
        assert await stored(usage, org) == {("tunnel_bytes", ""): 1000}


class CommitThenHang(Usage):
    """Commits the batch, then never answers: the flush is cancelled (a shutdown) not knowing."""

    def __init__(self, db) -> None:
        super().__init__(db)
        self.hang = True
        self.committed = trio.Event()

    async def add_many(self, rows, *, batch_id=None):
        # (a meter that sends no id gets a fresh one per call: what a meter without batch ids does)
        done = await super().add_many(rows, batch_id=batch_id or uuid.uuid4())
        if self.hang:
            self.committed.set()
            await trio.sleep_forever()
        return done


async def test_a_flush_cancelled_after_its_commit_is_not_counted_twice(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        org = uuid.UUID(hub.org_id)
        usage = CommitThenHang(hub.services.db)
        meter = Meter(usage)
        meter.add(org, "tunnel_minutes", 3, day=DAY)
        with trio.CancelScope() as shutdown:
            async with trio.open_nursery() as n:
                n.start_soon(meter.flush)
                await usage.committed.wait()
                shutdown.cancel()
        assert await stored(usage, org) == {("tunnel_minutes", ""): 3}
        # counted meanwhile: goes in a batch of its own after the unknown one
        meter.add(org, "tunnel_minutes", 4, day=DAY)
        usage.hang = False
        await meter.flush()  # what the shielded final flush does: the kept batch again, then the new
        assert await stored(usage, org) == {("tunnel_minutes", ""): 7}
        assert meter.pending() == 0


async def test_an_audit_batch_written_again_adds_each_event_once(nursery, db_url, tmp_path):
    # The write-behind puts a batch back when its write was cancelled without a known outcome
    # (storage/behind.py); written again, it must neither double the rows nor be refused whole.
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        s, org = hub.services, uuid.UUID(hub.org_id)
        at = s.clock.now()
        events = [{"id": uuid.uuid4(), "org_id": org, "at": at, "actor_type": "system", "method": "EVENT",
                   "path": f"/replayed/{i}", "status": 200, "request_id": f"replay-{i}", "details": {}}
                  for i in range(3)]
        await s.stores.audit.write_many(events)
        await s.stores.audit.write_many(events)
        count = await s.db.fetchval("SELECT count(*) FROM audit_events WHERE path LIKE '/replayed/%'")
        assert count == 3
