"""device_client/bridge.run_on, the trio-to-asyncio wait asyncpg and aiortc share (issue 14, item 7):
a cancelled caller waits (shielded, bounded) for the asyncio side to finish, and gets a result that
completed at that instant instead of losing it. Real asyncio loop in a thread, real time (short)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from device_client.shared.bridge import run_on


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


async def test_results_and_errors_cross(loop):
    async def answer():
        await asyncio.sleep(0.01)
        return 42

    async def fail():
        raise ValueError("from asyncio")

    with trio.fail_after(5):
        assert await run_on(loop, answer()) == 42
        with pytest.raises(ValueError, match="from asyncio"):
            await run_on(loop, fail())


async def test_a_cancelled_caller_goes_on_only_after_the_asyncio_side_cleaned_up(loop):
    events: list[str] = []

    async def transaction():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # a rollback, a connection released to the pool
            events.append("rolled back")
            raise

    with trio.fail_after(5):
        with trio.move_on_after(0.05) as scope:
            await run_on(loop, transaction())
        events.append("caller moved on")
        assert scope.cancelled_caught
        assert events == ["rolled back", "caller moved on"]


async def test_a_result_completed_at_the_cancellation_reaches_the_caller(loop):
    async def commit():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "committed"  # the COMMIT had gone through: the work is done

    with trio.fail_after(5):
        got = []
        with trio.move_on_after(0.05) as scope:
            got.append(await run_on(loop, commit()))
            await trio.sleep(0)  # the cancellation is still delivered, at the next checkpoint
            got.append("not reached")
        assert got == ["committed"] and scope.cancelled_caught


async def test_the_wait_after_a_cancellation_is_bounded(loop):
    stop = threading.Event()

    async def stubborn():
        while not stop.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                pass  # ignores cancellation

    with trio.fail_after(5):
        started = trio.current_time()
        with trio.move_on_after(0.05) as scope:
            await run_on(loop, stubborn(), cancel_grace=0.3)
        assert scope.cancelled_caught
        assert 0.3 <= trio.current_time() - started < 1.5
        stop.set()  # let it end before the loop does
        await trio.sleep(0.1)


async def test_stopping_the_loop_thread_unwinds_the_tasks_still_pending():
    """As ``asyncio.run`` ends: a task left pending (nats-py's subscription readers after ``close()``)
    is cancelled and runs its cleanup, instead of being garbage-collected half-way with the loop."""
    from device_client.shared.bridge import start_loop_thread, stop_loop_thread

    unwound = threading.Event()

    async def reader():
        try:
            await asyncio.sleep(3600)
        finally:
            unwound.set()

    loop, thread = start_loop_thread("test-bridge")
    loop.call_soon_threadsafe(lambda: loop.create_task(reader()))
    await trio.sleep(0.1)
    with trio.fail_after(10):
        await stop_loop_thread(loop, thread, timeout=5)
    assert unwound.is_set() and not thread.is_alive() and loop.is_closed()
