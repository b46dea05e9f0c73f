"""The outbox (storage/behind.py WriteBehind) on trio's virtual clock: merging by key, when it
flushes, shutdown, failures, the cap, batch ids, draining with a backoff. The one suite for every
write that waits out an outage: presence, audit (with tests/actors/test_audit_journal.py), active
devices, metering sums and unrecorded tunnel usage (each user's own tests run it against PostgreSQL).

The flush function is an in-memory recorder standing in for the storage write (storage/devices.py's
``write_presence``, which the integration layer runs against PostgreSQL).
"""

from __future__ import annotations

import copy
import uuid

import trio
import trio.testing

from device_client.shared.backoff import Backoff
from storage.behind import WriteBehind, merge_newer, piece_id
from storage.db import DatabaseUnavailable


class Sink:
    """Records each batch with the virtual time its write finished."""

    def __init__(self, *, delay: float = 0.0, fail_calls: tuple[int, ...] = ()) -> None:
        self.delay = delay
        self.fail_calls = fail_calls
        self.calls = 0
        self.batches: list[tuple[float, list[dict]]] = []

    async def __call__(self, batch: list[dict]) -> None:
        self.calls += 1
        if self.delay:
            await trio.sleep(self.delay)
        if self.calls in self.fail_calls:
            raise ConnectionError("database went away")
        self.batches.append((trio.current_time(), copy.deepcopy(batch)))


def test_merge_newer_wins_but_none_never_erases():
    old = {"id": 1, "online": True, "firmware": "1.0", "facts": {"a": 1}}
    new = {"id": 1, "online": False, "firmware": None, "last_seen_at": None}
    assert merge_newer(old, new) == {"id": 1, "online": False, "firmware": "1.0", "facts": {"a": 1},
                                     "last_seen_at": None}
    assert old == {"id": 1, "online": True, "firmware": "1.0", "facts": {"a": 1}}  # inputs untouched


async def test_put_merges_rows_by_key_and_flush_writes_one_row_per_key():
    with trio.fail_after(5):
        sink = Sink()
        wb = WriteBehind(sink)
        wb.put("d1", {"id": "d1", "online": True, "firmware": "1.0", "seen": 1})
        wb.put("d2", {"id": "d2", "online": True})
        wb.put("d1", {"id": "d1", "online": False, "firmware": None, "seen": 2})
        wb.put("d1", {"id": "d1", "seen": 3, "boot": None})
        await wb.flush()
        assert [rows for _, rows in sink.batches] == [[
            {"id": "d1", "online": False, "firmware": "1.0", "seen": 3, "boot": None},
            {"id": "d2", "online": True}]]
        assert wb.written == 2 and wb.failures == 0
        await wb.flush()
        assert sink.calls == 1  # nothing pending: no write at all


async def test_put_without_merge_replaces_and_append_never_merges():
    with trio.fail_after(5):
        sink = Sink()
        wb = WriteBehind(sink)
        wb.put("d1", {"id": "d1", "firmware": "1.0", "online": True})
        wb.put("d1", {"id": "d1", "online": False}, merge=False)
        wb.append({"event": "login"})
        wb.append({"event": "login"})
        await wb.flush()
        assert sink.batches[0][1] == [{"id": "d1", "online": False}, {"event": "login"}, {"event": "login"}]


async def test_flushes_every_interval(autojump_clock):
    with trio.fail_after(10):
        sink = Sink()
        wb = WriteBehind(sink, interval=0.5)
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            await trio.sleep(0.2)
            wb.put("d1", {"seen": 1})
            wb.put("d1", {"seen": 2})
            await trio.sleep(0.5)
            wb.put("d1", {"seen": 3})
            await trio.sleep(2)
            nursery.cancel_scope.cancel()
        assert sink.batches == [(0.5, [{"seen": 2}]), (1.0, [{"seen": 3}])]
        assert sink.calls == 2 and wb.written == 2


async def test_flushes_as_soon_as_max_batch_rows_wait(autojump_clock):
    with trio.fail_after(10):
        sink = Sink()
        wb = WriteBehind(sink, interval=100, max_batch=3)
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            await trio.sleep(1)
            wb.put("a", {"v": 1})
            wb.put("b", {"v": 1})
            wb.put("a", {"v": 2})  # merged: still two rows waiting
            await trio.sleep(4)
            assert sink.batches == []
            wb.append({"v": "audit"})  # the third row
            await trio.testing.wait_all_tasks_blocked()
            assert sink.batches == [(5, [{"v": 2}, {"v": 1}, {"v": "audit"}])]
            nursery.cancel_scope.cancel()


async def test_flushes_the_rest_on_cancellation(autojump_clock):
    with trio.fail_after(10):
        sink = Sink(delay=1.0)
        wb = WriteBehind(sink, interval=100)
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            wb.put("d1", {"online": True})
            wb.put("d2", {"online": False})
            await trio.sleep(3)
            nursery.cancel_scope.cancel()
        # the last write runs under a shield, so even a slow one completes
        assert sink.batches == [(4, [{"online": True}, {"online": False}])]
        assert wb.written == 2


async def test_a_batch_in_flight_at_cancellation_is_written_by_the_final_flush(autojump_clock):
    with trio.fail_after(10):
        sink = Sink(delay=1.0)
        wb = WriteBehind(sink, interval=0.5)
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            wb.put("d1", {"online": False, "firmware": "1.0"})
            wb.put("d2", {"online": True})
            await trio.sleep(0.6)  # the write started at 0.5 and is still running
            wb.put("d1", {"online": True, "firmware": None})  # newer than the row in flight
            await trio.sleep(0.15)
            nursery.cancel_scope.cancel()
        # the interrupted batch went back under the newer row and the shielded final flush wrote it
        assert sink.batches == [(1.75, [{"online": True, "firmware": "1.0"}, {"online": True}])]
        assert wb.written == 2 and wb.failures == 0


async def test_failed_write_is_counted_and_the_writer_goes_on(autojump_clock, caplog):
    with trio.fail_after(10):
        sink = Sink(fail_calls=(1,))
        wb = WriteBehind(sink, interval=1.0, name="presence rows")
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            wb.put("d1", {"v": 1})
            await trio.sleep(1.5)
            assert wb.failures == 1 and wb.written == 0 and sink.batches == []
            wb.put("d1", {"v": 2})
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
        assert sink.batches == [(2.0, [{"v": 2}])]  # the refused row was set aside, not retried
        assert wb.failures == 1 and wb.written == 1 and wb.set_aside == 1
        assert "write-behind of presence rows: the database refused row - (ConnectionError); set aside" in caplog.text


class PoisonSink:
    """Refuses any batch holding a poisoned row, as PostgreSQL refuses a whole statement for one NUL;
    ``down`` makes every write fail as an unreachable database does."""

    def __init__(self) -> None:
        self.written: list[dict] = []
        self.calls = 0
        self.down = False

    async def __call__(self, batch: list[dict]) -> None:
        self.calls += 1
        if self.down:
            raise DatabaseUnavailable("connection refused")
        if any(row.get("poison") for row in batch):
            raise ValueError(f"invalid byte sequence in {batch!r}")  # the message quotes the rows
        self.written.extend(batch)


async def test_a_poisoned_batch_loses_only_the_poisoned_rows(caplog):
    with trio.fail_after(5):
        sink = PoisonSink()
        wb = WriteBehind(sink, name="audit events")
        poisoned = {uuid.UUID(int=13), uuid.UUID(int=77)}
        rows = [{"id": uuid.UUID(int=i), "text": f"row {i}", "poison": uuid.UUID(int=i) in poisoned}
                for i in range(100)]
        for row in rows:
            wb.append(row)
        await wb.flush()
        assert sink.written == [r for r in rows if not r["poison"]]  # every other row, in order
        assert wb.written == 98 and wb.set_aside == 2 and wb.pending() == 0
        assert sink.calls < 30  # halves, not one write per row
        # the log names the rows by id and never carries their contents
        assert str(uuid.UUID(int=13)) in caplog.text and str(uuid.UUID(int=77)) in caplog.text
        assert "row 13" not in caplog.text and "invalid byte sequence" not in caplog.text


async def test_an_outage_in_the_middle_of_the_halves_keeps_the_unwritten_rows():
    with trio.fail_after(5):
        sink = PoisonSink()
        wb = WriteBehind(sink)
        rows = [{"id": uuid.UUID(int=i), "poison": i == 3} for i in range(8)]
        for row in rows:
            wb.append(row)
        real = sink.__call__

        async def fails_after_two(batch):  # the whole batch, then the first half: then the database goes
            if sink.calls >= 2:
                sink.down = True
            await real(batch)
        wb._flush = fails_after_two
        await wb.flush()
        assert sink.written == [] and wb.retries == 1 and wb.pending() == 8  # nothing lost, nothing doubled
        sink.down = False
        wb._flush = sink
        await wb.flush()
        assert sink.written == [r for r in rows if not r["poison"]] and wb.set_aside == 1


async def test_the_buffer_is_capped_while_the_database_is_away(caplog):
    with trio.fail_after(5):
        sink = PoisonSink()
        sink.down = True
        wb = WriteBehind(sink, max_pending=5, name="audit events")
        for i in range(4):
            wb.append({"n": i})
        await wb.flush()  # refused: all four kept
        assert wb.pending() == 4 and wb.dropped == 0
        for i in range(4, 12):
            wb.append({"n": i})
            await wb.flush()
        assert wb.pending() == 5 and wb.dropped == 7
        # the oldest went first; the newest five are kept, in order
        assert [r["n"] for r in wb._pending.values()] == [7, 8, 9, 10, 11]
        assert caplog.text.count("is full") == 1  # logged once per outage, counted for every row
        sink.down = False
        await wb.flush()
        assert [r["n"] for r in sink.written] == [7, 8, 9, 10, 11]
        assert "7 rows were dropped while the database was away" in caplog.text
        # a second outage is logged again
        sink.down = True
        for i in range(7):
            wb.append({"n": i})
        assert caplog.text.count("is full") == 2 and wb.dropped == 9


async def test_merged_rows_do_not_count_against_the_cap():
    with trio.fail_after(5):
        sink = PoisonSink()
        sink.down = True
        wb = WriteBehind(sink, max_pending=3)
        for beat in range(50):  # three devices heartbeating through an outage
            for dev in ("a", "b", "c"):
                wb.put(dev, {"id": dev, "seen": beat})
            await wb.flush()
        assert wb.dropped == 0 and wb.pending() == 3
        sink.down = False
        await wb.flush()
        assert sink.written == [{"id": d, "seen": 49} for d in ("a", "b", "c")]


async def test_flush_waits_for_the_batch_already_on_its_way(autojump_clock):
    """A reader that flushes (GET /v1/audit-events) must see every row put before its call, also the
    ones the periodic flush has taken and is still writing."""
    with trio.fail_after(10):
        sink = Sink(delay=1.0)
        wb = WriteBehind(sink, interval=0.5)
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            wb.append({"event": "call 1"})
            await trio.sleep(0.75)  # the periodic write of call 1 started at 0.5 and ends at 1.5
            await wb.flush()
            assert [rows for _, rows in sink.batches] == [[{"event": "call 1"}]]
            assert trio.current_time() == 1.5
            nursery.cancel_scope.cancel()


async def test_rows_kept_over_an_outage_are_written_max_batch_at_a_time():
    # Every storage call is bounded (storage/db.py): one statement carrying all that piled up during an
    # outage could outlast the bound on every try, and nothing would ever be written.
    with trio.fail_after(5):
        sink = PoisonSink()
        sink.down = True
        wb = WriteBehind(sink, max_batch=3)
        for i in range(8):
            wb.append({"n": i})
        await wb.flush()
        assert wb.pending() == 8
        sizes: list[int] = []
        real = sink.__call__

        async def measured(batch):
            sizes.append(len(batch))
            sink.down = len(sizes) == 2  # the database goes again under the second batch
            await real(batch)
        wb._flush = measured
        await wb.flush()
        assert sizes == [3, 3] and [r["n"] for r in sink.written] == [0, 1, 2]
        assert [r["n"] for r in wb._pending.values()] == [3, 4, 5, 6, 7]  # kept, oldest first
        await wb.flush()
        assert sizes == [3, 3, 3, 2] and [r["n"] for r in sink.written] == list(range(8))


class DownSink(Sink):
    """A database that is unreachable while ``down`` is set."""

    down = False

    async def __call__(self, batch: list[dict]) -> None:
        if self.down:
            self.calls += 1
            raise DatabaseUnavailable("the database is unreachable")
        await super().__call__(batch)


async def test_append_written_returns_once_its_row_is_written_in_one_batch_with_the_others(autojump_clock):
    # Issue 38 item 7: an API call is answered once its audit row is in the database. Callers waiting
    # together share a statement (a group commit), not the write-behind interval.
    with trio.fail_after(10):
        sink = Sink(delay=0.01)
        wb = WriteBehind(sink, interval=100)
        returned: list[tuple[int, bool, float]] = []

        async def call(i: int) -> None:
            written = await wb.append_written({"id": i}, within=5)
            returned.append((i, written, trio.current_time()))
            # what the caller is told was written is in a batch the sink has finished
            assert any({"id": i} in rows for _, rows in sink.batches)

        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            for i in range(5):
                nursery.start_soon(call, i)
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
        assert sorted(i for i, written, _ in returned if written) == [0, 1, 2, 3, 4]
        assert max(t for *_, t in returned) < 0.1  # one round trip or two, not the 100 s interval
        assert sum(len(rows) for _, rows in sink.batches) == 5 and sink.calls <= 2
        assert wb.unconfirmed == 0 and wb.pending() == 0


async def test_append_written_waits_through_no_outage_and_the_row_is_written_behind(autojump_clock):
    with trio.fail_after(10):
        sink = DownSink()
        sink.down = True
        wb = WriteBehind(sink, interval=1.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            started = trio.current_time()
            assert await wb.append_written({"id": 1}, within=5) is False  # the flush found it down
            assert trio.current_time() - started < 0.01
            assert wb.unreachable and wb.pending() == 1
            # known down: the next caller does not wait, and does not make the writer try again at once
            calls = sink.calls
            assert await wb.append_written({"id": 2}, within=5) is False
            assert sink.calls == calls and trio.current_time() - started < 0.01
            sink.down = False
            await trio.sleep(1.5)  # the writer's next round writes both
            assert [rows for _, rows in sink.batches] == [[{"id": 1}, {"id": 2}]] and not wb.unreachable
            assert await wb.append_written({"id": 3}, within=5) is True  # back to waiting for the write
            nursery.cancel_scope.cancel()
        assert wb.unconfirmed == 2


async def test_append_written_gives_up_after_its_bound_and_the_row_stays_pending(autojump_clock):
    with trio.fail_after(30):
        sink = Sink(delay=10)  # a database slower than the caller's bound
        wb = WriteBehind(sink, interval=100)
        async with trio.open_nursery() as nursery:
            await nursery.start(wb.run)
            assert await wb.append_written({"id": 1}, within=2) is False
            assert trio.current_time() == 2 and wb.unconfirmed == 1
            await trio.sleep(10)
            assert [rows for _, rows in sink.batches] == [[{"id": 1}]]  # written all the same
            nursery.cancel_scope.cancel()


# -- batch ids: sums, which merge by adding, so a batch of unknown outcome may not meet newer counts --

def add(old: dict, new: dict) -> dict:
    return {**old, "n": old["n"] + new["n"]}


class Ledger:
    """Adds each batch's counts once per batch id, as storage/usage.py add_many does in one transaction;
    ``lose`` makes chosen calls (1-based) commit and then report the database unreachable, ``refuse``
    refuses any batch holding one of those keys, ``down`` refuses every call as unreachable."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.seen: set[uuid.UUID] = set()
        self.calls: list[tuple[uuid.UUID, list[str]]] = []
        self.lose: set[int] = set()
        self.refuse: set[str] = set()
        self.down = False

    async def __call__(self, rows: list[dict], *, batch_id: uuid.UUID) -> None:
        self.calls.append((batch_id, [r["k"] for r in rows]))
        if self.down:
            raise DatabaseUnavailable("the database is unreachable")
        if any(r["k"] in self.refuse for r in rows):
            raise ValueError("refused")
        if batch_id not in self.seen:
            self.seen.add(batch_id)
            for r in rows:
                self.totals[r["k"]] = self.totals.get(r["k"], 0) + r["n"]
        if len(self.calls) in self.lose:
            raise DatabaseUnavailable("the answer to the COMMIT was lost")


def counts(wb: WriteBehind, **totals: int) -> None:
    for k, n in totals.items():
        wb.put(k, {"k": k, "n": n})


async def test_a_batch_of_unknown_outcome_is_sent_again_as_it_was_under_its_id():
    with trio.fail_after(5):
        ledger = Ledger()
        wb = WriteBehind(ledger, merge=add, batch_ids=True)
        counts(wb, a=1, b=2)
        counts(wb, a=10)  # merged before it is taken: one row
        ledger.lose = {1}
        await wb.flush()
        assert ledger.totals == {"a": 11, "b": 2} and wb.pending() == 2 and wb.retries == 1
        counts(wb, a=100)  # counted meanwhile: not merged into the kept batch
        await wb.flush()
        (first, rows1), (again, rows2), (third, rows3) = ledger.calls
        assert again == first and rows2 == rows1 == ["a", "b"] and third != first and rows3 == ["a"]
        assert ledger.totals == {"a": 111, "b": 2}  # the replay added nothing
        assert wb.pending() == 0 and wb.written == 3


async def test_halves_of_a_refused_batch_carry_ids_derived_from_its_id():
    with trio.fail_after(5):
        ledger = Ledger()
        ledger.refuse = {"b"}
        wb = WriteBehind(ledger, merge=add, batch_ids=True)
        counts(wb, a=1, b=2, c=3, d=4)
        ledger.lose = {5}  # [c, d] commits, its answer lost
        await wb.flush()
        first = ledger.calls[0][0]
        assert ledger.calls == [(first, ["a", "b", "c", "d"]), (piece_id(first, 0), ["a", "b"]),
                                (piece_id(piece_id(first, 0), 0), ["a"]), (piece_id(piece_id(first, 0), 1), ["b"]),
                                (piece_id(first, 1), ["c", "d"])]
        assert wb.set_aside == 1 and wb.pending() == 2
        await wb.flush()
        assert ledger.calls[5] == (piece_id(first, 1), ["c", "d"])
        assert ledger.totals == {"a": 1, "c": 3, "d": 4} and wb.pending() == 0


async def test_a_batch_cancelled_at_its_commit_is_kept_with_its_id():
    with trio.fail_after(5):
        ledger = Ledger()
        committed = trio.Event()
        real = ledger.__call__

        async def hangs(rows, *, batch_id):
            await real(rows, batch_id=batch_id)
            committed.set()
            await trio.sleep_forever()

        wb = WriteBehind(hangs, merge=add, batch_ids=True)
        counts(wb, a=1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wb.flush)
            await committed.wait()
            nursery.cancel_scope.cancel()
        counts(wb, a=5)
        wb._flush = ledger
        await wb.flush()
        assert [rows for _, rows in ledger.calls] == [["a"], ["a"], ["a"]] and ledger.calls[1][0] == ledger.calls[0][0]
        assert ledger.totals == {"a": 6}


async def test_without_batch_ids_a_cancelled_batch_is_put_back_under_newer_rows():
    with trio.fail_after(5):
        sink = Sink(delay=1.0)
        wb = WriteBehind(sink)
        wb.put("d", {"id": "d", "seen": 1, "firmware": "1.0"})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wb.flush)
            await trio.sleep(0.5)
            wb.put("d", {"id": "d", "seen": 2, "firmware": None})
            nursery.cancel_scope.cancel()
        assert wb.pending() == 1 and list(wb._pending.values()) == [{"id": "d", "seen": 2, "firmware": "1.0"}]


# -- when full, keep what waits (unrecorded tunnel usage: a device naming made-up sessions) ----------

async def test_refuse_new_keeps_the_rows_already_waiting_and_still_merges_them(caplog):
    with trio.fail_after(5):
        sink = PoisonSink()
        sink.down = True
        wb = WriteBehind(sink, max_pending=2, max_batch=1, when_full="refuse_new", name="tunnel usage")
        wb.put("s1", {"id": "s1", "bytes": 1})
        wb.put("s2", {"id": "s2", "bytes": 1})
        for i in range(5):
            wb.put(f"made-up-{i}", {"id": f"made-up-{i}", "bytes": 1})
        wb.put("s1", {"id": "s1", "bytes": 9})
        assert wb.dropped == 5 and wb.pending() == 2
        assert caplog.text.count("is full") == 1 and "dropping the newest" in caplog.text
        await wb.flush()
        sink.down = False
        await wb.flush()
        assert sink.written == [{"id": "s1", "bytes": 9}, {"id": "s2", "bytes": 1}]


async def test_refuse_new_keeps_a_row_whose_write_failed_over_the_rows_put_meanwhile():
    with trio.fail_after(5):
        sink = PoisonSink()
        sink.down = True
        wb = WriteBehind(sink, max_pending=2, max_batch=1, when_full="refuse_new")
        wb.put("s1", {"id": "s1"})
        wb.put("s2", {"id": "s2"})
        real = sink.__call__

        async def flooded(batch):  # a device names made-up sessions while s1's write is on its way
            wb.put("made-up", {"id": "made-up"})
            await real(batch)
        wb._flush = flooded
        await wb.flush()
        assert list(wb._pending) == ["s1", "s2"] and wb.dropped == 1


# -- drain: a writer fed only during outages, its task alive while rows wait ---------------------------

async def test_drain_backs_off_while_unreachable_and_ends_when_nothing_waits(autojump_clock):
    with trio.fail_after(60):
        sink = DownSink()
        sink.down = True
        wb = WriteBehind(sink, max_batch=1)
        wb.put("s1", {"id": "s1"})
        tries: list[float] = []
        real = sink.__call__

        async def timed(batch):
            tries.append(trio.current_time())
            if len(tries) == 6:
                sink.down = False
            await real(batch)
        wb._flush = timed
        await wb.drain(Backoff(0.1, 1.0, jitter=False))
        assert [round(t, 3) for t in tries] == [0.1, 0.3, 0.7, 1.5, 2.5, 3.5]  # doubling up to 1 s
        assert [rows for _, rows in sink.batches] == [[{"id": "s1"}]] and wb.pending() == 0
        await wb.drain(Backoff(0.1, 1.0, jitter=False))  # nothing waits: returns at once
        assert trio.current_time() == 3.5
