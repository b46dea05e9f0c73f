"""Awaiting an asyncio coroutine from trio, when asyncio runs its own loop in another thread.

Three parts of fleethub keep an asyncio-only library on a private loop in a thread (``start_loop_thread``):
asyncpg (storage/db.py), nats-py (actors/natsbus.py) and aiortc (webrtc/loop.py). Each hands that loop a
coroutine and sleeps in trio until the asyncio task's done-callback wakes it through the trio token.

Cancelling the trio caller cancels the task on the asyncio side, and the caller then waits for that
side to finish — shielded, for at most ``cancel_grace`` seconds — before it goes on: an asyncpg
rollback and the connection's release happen before the caller moves on, not behind its back. If the
task finished with a result all the same (it completed at that very instant, say a COMMIT), the
caller gets the result rather than ``Cancelled``: the work is done, and a caller that saw Cancelled
would do it again. The cancellation is still delivered, at the caller's next checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")

log = logging.getLogger("fleethub.bridge")

# How long a cancelled caller waits for the asyncio side to wind down (an asyncpg cancel, a rollback).
CANCEL_GRACE = 10.0


async def run_on(loop: asyncio.AbstractEventLoop, coro: Awaitable[T], *, cancel_grace: float = CANCEL_GRACE) -> T:
    """Run ``coro`` on ``loop`` (another thread's) and return its result in the calling trio task."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    result: list[outcome.Outcome] = []
    tasks: list[asyncio.Future] = []

    def finished(task: asyncio.Future) -> None:  # on the asyncio thread
        if task.cancelled():
            result.append(outcome.Error(asyncio.CancelledError()))
        else:
            result.append(outcome.capture(task.result))
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:
            pass

    def start() -> None:  # on the asyncio thread
        try:
            task = asyncio.ensure_future(coro)
        except BaseException as exc:  # noqa: BLE001 — not awaitable: the caller hears it
            result.append(outcome.Error(exc))
            token.run_sync_soon(done.set)
            return
        tasks.append(task)
        task.add_done_callback(finished)

    # Our own task rather than run_coroutine_threadsafe's concurrent future: cancelling that future
    # reports "cancelled" at once, while the coroutine is still running (and may yet commit).
    loop.call_soon_threadsafe(start)
    try:
        await done.wait()
    except trio.Cancelled:
        # Callbacks run in order, so start() has run before this and the task exists.
        loop.call_soon_threadsafe(lambda: tasks and tasks[0].cancel())
        with trio.move_on_after(cancel_grace) as grace:
            grace.shield = True
            await done.wait()
        if grace.cancelled_caught:
            log.warning("the asyncio side did not finish within %.0fs of its caller's cancellation", cancel_grace)
            raise
        if isinstance(result[0], outcome.Value):
            return result[0].unwrap()  # done over there: say so (Cancelled comes at the next checkpoint)
        raise
    return result[0].unwrap()


def _finish_pending(loop: asyncio.AbstractEventLoop, grace: float = 2.0) -> None:
    """What ``asyncio.run`` does as it ends, for a loop stopped by ``stop_loop_thread``: cancel the tasks
    still pending and let them unwind (bounded), so that none is garbage-collected half-way through.
    Without it, nats-py's subscription readers, left pending by ``close()``, were destroyed with the
    loop ("Exception ignored in: <coroutine Subscription._wait_for_msgs>")."""
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=grace))
        for task in pending:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: an error while unwinding is not worth a second report
    loop.run_until_complete(loop.shutdown_asyncgens())


def start_loop_thread(name: str, exception_handler: Any = None) -> tuple[asyncio.AbstractEventLoop, Any]:
    """A private asyncio loop running in a daemon thread (asyncpg, nats-py and aiortc each keep one):
    ``(loop, thread)`` once the loop runs. Sync: a thread start, no IO. ``stop_loop_thread`` ends it."""
    import threading

    ready = threading.Event()
    box: list[asyncio.AbstractEventLoop] = []

    def main() -> None:
        loop = asyncio.new_event_loop()
        if exception_handler is not None:
            loop.set_exception_handler(exception_handler)
        asyncio.set_event_loop(loop)
        box.append(loop)
        ready.set()
        loop.run_forever()
        try:
            _finish_pending(loop)
        finally:
            loop.close()

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()
    ready.wait()
    return box[0], thread


async def stop_loop_thread(loop: asyncio.AbstractEventLoop, thread: Any, *, timeout: float = 10.0) -> None:
    """Stop the loop and join its thread, shielded and bounded: a stop runs while an error or a
    cancellation leaves its owner, and a Cancelled raised here would replace the error that says why."""
    loop.call_soon_threadsafe(loop.stop)
    with trio.CancelScope(shield=True), trio.move_on_after(timeout):
        await trio.to_thread.run_sync(thread.join, abandon_on_cancel=True)
