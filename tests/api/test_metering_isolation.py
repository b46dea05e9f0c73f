"""One bad metering row costs only itself, and a half written again adds nothing twice (issue 14,
section 2 for metering). Real PostgreSQL: the poisons are rows it refuses — an organisation that is
not there (foreign key), a NUL in a key (text), a key too long for the primary key's index — beside
good sums of other organisations in the same batch; and a quantity that is no count (NaN, Infinity,
beyond what the numeric encoding carries) is set aside where it is counted."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import uuid
from decimal import Decimal

import pytest
import trio

from hub.metering import Meter
from storage.behind import piece_id
from storage.db import DatabaseUnavailable
from storage.usage import Usage
from tests.hubtools import metric_value, metrics, start_hub

DAY = dt.date(2026, 11, 2)


async def stored(usage: Usage, org: uuid.UUID) -> dict:
    rows = await usage.daily(org, DAY, DAY + dt.timedelta(days=1))
    return {(r["product"], r["key"]): r["quantity"] for r in rows}


class Recording(Usage):
    """The real writer, noting each call's batch id and size; ``lose`` makes chosen calls commit and
    then report the database unreachable (the answer to a COMMIT lost: the caller cannot know)."""

    def __init__(self, db) -> None:
        super().__init__(db)
        self.calls: list[tuple[uuid.UUID, int]] = []
        self.lose: set[int] = set()  # 1-based call numbers

    async def add_many(self, rows, *, batch_id):
        self.calls.append((batch_id, len(rows)))
        fresh = await super().add_many(rows, batch_id=batch_id)
        if len(self.calls) in self.lose:
            raise DatabaseUnavailable("the database is not reachable (ConnectionResetError)")
        return fresh


async def test_poisoned_rows_cost_only_themselves(nursery, db_url, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fleethub")
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        orgs = [uuid.UUID(hub.org_id)] + [(await s.stores.orgs.create_org(f"Org {i}", s.clock.now()))["id"]
                                          for i in range(3)]
        meter = s.meter
        long_key = secrets.token_hex(8000)  # 16,000 characters that do not compress: over btree's 2,704 bytes
        for i, org in enumerate(orgs):
            meter.add(org, "tunnel_bytes", 100 + i, day=DAY)
            if i == 1:
                meter.add(org, "registry_fallback_bytes", 7, day=DAY, key="fleet\x00secret-nul")
            if i == 2:
                meter.add(org, "registry_fallback_bytes", 9, day=DAY, key=long_key)
            meter.add(org, "assistant_prompt_tokens", 10 + i, day=DAY, key="user")
            if i == 3:
                meter.add(org, "tunnel_minutes", Decimal("1e200000"), day=DAY)  # not a count: set aside
        meter.add(uuid.uuid4(), "tunnel_bytes", 5, day=DAY)  # an organisation that does not exist
        await meter.flush()

        for i, org in enumerate(orgs):
            assert await stored(s.stores.usage, org) == {("tunnel_bytes", ""): 100 + i,
                                                  ("assistant_prompt_tokens", "user"): 10 + i}, i
        assert meter.set_aside == 4 and meter.pending() == 0
        assert meter.written == 2 * len(orgs)
        text = await metrics(hub)
        assert metric_value(text, "fleethub_write_behind_set_aside_total", {"kind": "metering"}) == 4
        assert metric_value(text, "fleethub_write_behind_rows_total", {"kind": "metering"}) == 8
        assert metric_value(text, "fleethub_write_behind_pending", {"kind": "metering"}) == 0
        # logged by organisation and product, never by the key's contents
        assert str(orgs[1]) in caplog.text and "registry_fallback_bytes" in caplog.text
        assert "secret-nul" not in caplog.text and long_key[:32] not in caplog.text

        # what is counted later is written at once: nothing refused is kept in the way
        meter.add(orgs[0], "tunnel_bytes", 1, day=DAY)
        await meter.flush()
        assert (await stored(s.stores.usage, orgs[0]))[("tunnel_bytes", "")] == 101
        assert meter.set_aside == 4


async def test_a_half_whose_outcome_was_lost_is_sent_again_under_its_id_and_adds_nothing_twice(
        nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        good = [uuid.UUID(hub.org_id), (await s.stores.orgs.create_org("B", s.clock.now()))["id"],
                (await s.stores.orgs.create_org("C", s.clock.now()))["id"]]
        usage = Recording(s.db)
        meter = Meter(usage)
        # [A, poison, B, C]: the whole is refused; [A, poison] is refused, [A] stored, [poison] set
        # aside; [B, C] commits but its answer is lost (call 5).
        meter.add(good[0], "tunnel_bytes", 10, day=DAY)
        meter.add(uuid.uuid4(), "tunnel_bytes", 99, day=DAY)
        meter.add(good[1], "tunnel_bytes", 20, day=DAY)
        meter.add(good[2], "tunnel_bytes", 30, day=DAY)
        usage.lose = {5}
        await meter.flush()
        first = usage.calls[0][0]
        assert usage.calls == [(first, 4), (piece_id(first, 0), 2), (piece_id(piece_id(first, 0), 0), 1),
                               (piece_id(piece_id(first, 0), 1), 1), (piece_id(first, 1), 2)]
        assert meter.pending() == 2 and meter.set_aside == 1  # [B, C] kept with its id

        meter.add(good[1], "tunnel_bytes", 1, day=DAY)  # counted meanwhile: a batch of its own
        await meter.flush()
        assert usage.calls[5] == (piece_id(first, 1), 2)  # the same half, under the same id
        assert meter.pending() == 0
        assert [await stored(usage, o) for o in good] == [
            {("tunnel_bytes", ""): 10}, {("tunnel_bytes", ""): 21}, {("tunnel_bytes", ""): 30}]


async def test_a_half_cancelled_at_its_commit_counts_once(nursery, db_url, tmp_path):
    # A shutdown at the instant a half commits: the half stays with its id, and the final flush
    # sends it again as a no-op.
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        org = uuid.UUID(hub.org_id)
        committed = trio.Event()

        class CommitThenHang(Recording):
            async def add_many(self, rows, *, batch_id):
                fresh = await super().add_many(rows, batch_id=batch_id)
                if len(self.calls) == 2:
                    committed.set()
                    await trio.sleep_forever()
                return fresh

        usage = CommitThenHang(s.db)
        meter = Meter(usage)
        meter.add(org, "tunnel_bytes", 10, day=DAY)
        meter.add(uuid.uuid4(), "tunnel_bytes", 99, day=DAY)
        with trio.CancelScope() as shutdown:
            async with trio.open_nursery() as n:
                n.start_soon(meter.flush)
                await committed.wait()
                shutdown.cancel()
        assert await stored(usage, org) == {("tunnel_bytes", ""): 10}
        await meter.flush()
        assert await stored(usage, org) == {("tunnel_bytes", ""): 10}
        assert meter.pending() == 0 and meter.set_aside == 1


async def test_a_flush_writes_at_most_max_batch_rows_per_statement(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        org = uuid.UUID(hub.org_id)
        usage = Recording(hub.services.db)
        meter = Meter(usage, max_batch=2)
        for i in range(5):
            meter.add(org, "registry_fallback_bytes", i + 1, day=DAY, key=f"fleet-{i}")
        await meter.flush()
        assert [n for _, n in usage.calls] == [2, 2, 1] and meter.written == 5
        assert len(await stored(usage, org)) == 5


def test_piece_ids_are_derived_and_distinct():
    parent = uuid.uuid4()
    assert piece_id(parent, 0) == piece_id(parent, 0)
    ids = {parent, piece_id(parent, 0), piece_id(parent, 1), piece_id(piece_id(parent, 0), 1),
           piece_id(piece_id(parent, 1), 0)}
    assert len(ids) == 5


@pytest.mark.parametrize("quantity", [float("nan"), float("inf"), Decimal("NaN"), Decimal("-Infinity"),
                                      Decimal("1e200000")])
def test_a_quantity_that_is_not_a_count_is_set_aside_where_it_is_counted(quantity, caplog):
    # numeric would keep NaN/Infinity in every later sum of the day, and asyncpg writes 1e200000 as 0.
    meter = Meter(Usage(None))
    meter.add(uuid.uuid4(), "tunnel_bytes", quantity, day=DAY)
    assert meter.pending() == 0 and meter.set_aside == 1
    assert "set aside" in caplog.text
