"""The one bridge between the trio hub and asyncpg (which is asyncio-only).

asyncpg runs on an asyncio event loop in a dedicated thread. A trio task hands that loop a coroutine
with ``asyncio.run_coroutine_threadsafe`` and sleeps until the loop's done-callback wakes it through
the trio token. We chose this over trio-asyncio: it keeps trio's own loop untouched (hypercorn's trio
worker and aiortc's loop do not need to cooperate), and bench/bridge.py measures the crossing.

A crossing costs a few hundred microseconds, so the unit of work is a *repository call*: one
``run(fn, ...)`` executes all of its statements — and its transaction — on the asyncio side.
Never cross per row.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg
import trio

T = TypeVar("T")

# Buckets (seconds) for the storage crossing histogram exported on /metrics.
CROSSING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


@dataclass
class CrossingStats:
    """Time spent per crossing, trio side to trio side (includes the statements themselves)."""

    count: int = 0
    total_seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(CROSSING_BUCKETS))

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total_seconds += seconds
        for i, bound in enumerate(CROSSING_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1


class Database:
    """A pool of asyncpg connections living on a private asyncio loop.

    ``await db.open()`` from trio starts the loop thread and the pool; ``await db.close()`` ends both.
    """

    def __init__(self, dsn: str, *, min_size: int = 2, max_size: int = 10) -> None:
        self.dsn = dsn
        self.min_size = min_size
        self.max_size = max_size
        self.stats = CrossingStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: asyncpg.Pool | None = None
        self._listeners: list[asyncpg.Connection] = []

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        ready = threading.Event()

        def loop_main() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            ready.set()
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=loop_main, name="fleethub-asyncpg", daemon=True)
        self._thread.start()
        await trio.to_thread.run_sync(ready.wait)

        async def create_pool() -> asyncpg.Pool:
            # Built on the asyncio side: asyncpg binds the pool to the loop current at construction.
            return await asyncpg.create_pool(
                self.dsn, min_size=self.min_size, max_size=self.max_size,
                # Repository calls are short; a statement that hangs is a bug we want to hear about.
                command_timeout=60)

        self._pool = await self._cross(create_pool())

    async def listen(self, channel: str, callback: Callable[[str], None]) -> None:
        """Call ``callback(payload)`` in trio for every NOTIFY on ``channel`` (a dedicated connection)."""
        token = trio.lowlevel.current_trio_token()

        def on_notify(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            try:
                token.run_sync_soon(callback, payload)
            except trio.RunFinishedError:
                pass

        async def setup() -> asyncpg.Connection:
            conn = await asyncpg.connect(self.dsn)
            await conn.add_listener(channel, on_notify)
            return conn

        self._listeners.append(await self._cross(setup()))

    async def close(self) -> None:
        if self._loop is None:
            return
        for conn in self._listeners:
            with trio.CancelScope(shield=True):
                await self._cross(conn.close())
        self._listeners.clear()
        if self._pool is not None:
            with trio.CancelScope(shield=True):
                await self._cross(self._pool.close())
            self._pool = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        await trio.to_thread.run_sync(self._thread.join)
        self._loop = None

    # -- the crossing ----------------------------------------------------------------------
    async def _cross(self, coro: Awaitable[T]) -> T:
        assert self._loop is not None, "Database.open() was not awaited"
        started = time.perf_counter()
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
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
            # Cancelling the asyncio task rolls back an open transaction on that side.
            future.cancel()
            raise
        self.stats.observe(time.perf_counter() - started)
        return future.result()

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any, transaction: bool = False) -> T:
        """Run ``fn(conn, *args)`` on the asyncio side with one pooled connection: one crossing."""
        pool = self._pool

        async def body() -> T:
            async with pool.acquire() as conn:
                if transaction:
                    async with conn.transaction():
                        return await fn(conn, *args)
                return await fn(conn, *args)

        return await self._cross(body())

    # Single statements, each one crossing.
    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        return await self._cross(self._pool.fetch(sql, *args))

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        return await self._cross(self._pool.fetchrow(sql, *args))

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self._cross(self._pool.fetchval(sql, *args))

    async def execute(self, sql: str, *args: Any) -> str:
        return await self._cross(self._pool.execute(sql, *args))
