"""Awaiting an asyncio coroutine from trio, when asyncio runs its own loop in another thread.

Two parts of fleethub keep an asyncio-only library on a private loop in a thread: asyncpg
(storage/db.py) and aiortc (webrtc/loop.py). Both hand that loop a coroutine and sleep in trio until
the loop's done-callback wakes them through the trio token; cancelling the trio caller cancels the
coroutine on the asyncio side (which rolls back an open asyncpg transaction).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


async def run_on(loop: asyncio.AbstractEventLoop, coro: Awaitable[T]) -> T:
    """Run ``coro`` on ``loop`` (another thread's) and return its result in the calling trio task."""
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_f: Any) -> None:
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:
            pass

    future.add_done_callback(wake)
    try:
        await done.wait()
    except trio.Cancelled:
        future.cancel()
        raise
    return future.result()
