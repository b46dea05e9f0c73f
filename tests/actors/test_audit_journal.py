"""storage/journal.py and WriteBehind's use of it: an audit row PostgreSQL has not confirmed is fsync'd
to a local file before the answer, emptied once PostgreSQL has it, and replayed by the next process
when the one that wrote it was killed. Real files; the database is an in-memory stand-in (the
integration test is tests/cluster/test_audit_durability.py)."""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import uuid

import trio

from storage.behind import WriteBehind
from storage.journal import DiskJournal, dumps, loads
from tests.actors.test_write_behind import DownSink, Sink


def _row(i: int) -> dict:
    return {"id": uuid.uuid4(), "at": dt.datetime(2026, 11, 27, 22, 0, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i),
            "path": f"/v1/fleets/{i}", "details": {"n": i, "ids": ["x"]}, "org_id": None}


def _file_rows(journal: DiskJournal) -> list[dict]:
    return loads(journal.path.read_bytes())[0] if journal.path.exists() else []


def test_a_row_comes_back_with_its_types_and_a_torn_line_is_skipped():
    row = _row(1)
    data = dumps(row) + dumps(_row(2))[:20]  # the second line torn by a crash mid-write
    rows, torn = loads(data)
    assert rows == [row] and torn == 1
    assert isinstance(rows[0]["id"], uuid.UUID) and rows[0]["at"].tzinfo is not None


async def test_a_row_the_database_cannot_take_now_is_journaled_before_the_answer_and_emptied_after(tmp_path):
    with trio.fail_after(20):
        sink = DownSink()
        sink.down = True
        journal = DiskJournal(tmp_path / "journal", "audit")
        wb = WriteBehind(sink, interval=0.2, journal=journal)
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            first, second = _row(1), _row(2)
            # the first finds the database down at its flush; the second finds it known down: no wait
            assert await wb.append_written(first, within=5) is True
            assert await wb.append_written(second, within=5) is True
            assert _file_rows(journal) == [first, second]  # on disk when the caller was told
            assert (journal.path.stat().st_mode & 0o777) == 0o600
            assert wb.journaled == 2 and wb.unconfirmed == 0 and wb.pending() == 2
            sink.down = False

            async def written() -> bool:
                return sum(len(rows) for _, rows in sink.batches) == 2 and not _file_rows(journal)
            while not await written():
                await trio.sleep(0.05)
            assert [r["id"] for _, rows in sink.batches for r in rows] == [first["id"], second["id"]]
            nursery.cancel_scope.cancel()
        assert not journal.path.exists()  # an empty journal goes with its process


async def test_a_frozen_database_costs_the_wait_then_the_row_is_journaled(tmp_path):
    with trio.fail_after(30):
        sink = Sink(delay=3)  # a statement that takes longer than the caller waits
        journal = DiskJournal(tmp_path / "journal", "audit")
        wb = WriteBehind(sink, interval=100, journal=journal)
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            row = _row(1)
            started = trio.current_time()
            assert await wb.append_written(row, within=0.3) is True
            assert 0.3 <= trio.current_time() - started < 2.5
            assert _file_rows(journal) == [row] and wb.journaled == 1
            while journal.has_rows:  # the slow statement ends, and the journal is emptied
                await trio.sleep(0.05)
            assert [rows for _, rows in sink.batches] == [[row]]
            assert _file_rows(journal) == []
            nursery.cancel_scope.cancel()


async def test_a_killed_process_s_journal_is_replayed_by_the_next_and_a_live_one_s_is_left_alone(tmp_path):
    with trio.fail_after(20):
        directory = tmp_path / "journal"
        directory.mkdir()
        dead, live = [_row(1), _row(2)], [_row(3)]
        (directory / "audit-111-dead.jsonl").write_bytes(b"".join(dumps(r) for r in dead) + b'{"torn')
        held = directory / "audit-222-live.jsonl"
        held.write_bytes(dumps(live[0]))
        fd = os.open(held, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a process still running holds its journal
        try:
            sink = Sink()
            journal = DiskJournal(directory, "audit")
            wb = WriteBehind(sink, interval=0.1, journal=journal)
            async with trio.open_nursery() as nursery:
                await nursery.start(wb.run)
                assert not (directory / "audit-111-dead.jsonl").exists()
                assert _file_rows(journal) == dead  # moved into this process's journal first
                while not sink.batches or journal.has_rows:
                    await trio.sleep(0.05)
                assert [r["id"] for _, rows in sink.batches for r in rows] == [r["id"] for r in dead]
                nursery.cancel_scope.cancel()
            assert held.exists() and loads(held.read_bytes())[0] == live
        finally:
            os.close(fd)


async def test_many_callers_in_an_outage_share_fsyncs(tmp_path):
    with trio.fail_after(20):
        sink = DownSink()
        sink.down = True
        journal = DiskJournal(tmp_path / "journal", "audit")
        writes = []
        real = journal._write_sync
        journal._write_sync = lambda data: (writes.append(data), real(data))[1]
        wb = WriteBehind(sink, interval=0.5, journal=journal)
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            await wb.append_written(_row(0), within=5)  # the database is known down from here on
            results = []

            async def call(i: int) -> None:
                results.append(await wb.append_written(_row(i), within=5))
            async with trio.open_nursery() as callers:
                for i in range(1, 101):
                    callers.start_soon(call, i)
            nursery.cancel_scope.cancel()
        assert results == [True] * 100 and len(_file_rows(journal)) == 101
        assert len(writes) < 20, len(writes)  # group commits, not one fsync per call
