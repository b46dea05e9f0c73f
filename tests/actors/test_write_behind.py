"""WriteBehind on trio's virtual clock: merging by key, when it flushes, shutdown, failures.

The flush function is an in-memory recorder standing in for the storage write (storage/devices.py's
``write_presence``, which the integration layer runs against PostgreSQL).
"""

from __future__ import annotations

import copy

import trio
import trio.testing

from storage.behind import WriteBehind, merge_newer


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
        assert sink.batches == [(2.0, [{"v": 2}])]  # the failed row was dropped, not retried
        assert wb.failures == 1 and wb.written == 1
        assert "write-behind of 1 presence rows failed" in caplog.text
