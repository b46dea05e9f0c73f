"""The one bridge between the trio hub and asyncpg (which is asyncio-only).

asyncpg runs on an asyncio event loop in a dedicated thread. A trio task hands that loop a coroutine
with ``asyncio.run_coroutine_threadsafe`` and sleeps until the loop's done-callback wakes it through
the trio token. We chose this over trio-asyncio: it keeps trio's own loop untouched (hypercorn's trio
worker and aiortc's loop do not need to cooperate), and bench/bridge.py measures the crossing.

A crossing costs a few hundred microseconds, so the unit of work is a *repository call*: one
``run(fn, ...)`` executes all of its statements — and its transaction — on the asyncio side.
Never cross per row.

When PostgreSQL is down, restarting or frozen, a crossing fails with ``DatabaseUnavailable`` (the app
answers 503) instead of waiting: connecting has a timeout, every statement has a server-side
``statement_timeout``, and the whole crossing (the wait for a pooled connection, the statements, the
commit) is bounded by ``call_timeout``. A frozen server (SIGSTOP, a VM paused, a dead route) answers
nothing, not even a cancel request, so that last bound does not cancel: it aborts the connection's
socket, which ends every await on it at once (a rollback included) and leaves the server to roll back
when it notices; a trio caller cancelled meanwhile is freed by the same bound. The pool reconnects by
itself on the next call; ``keep_listening`` re-opens LISTEN connections that died and tells the
caller, who must assume it missed notifications.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg
import trio

from device_client.shared.bridge import run_on, start_loop_thread, stop_loop_thread

T = TypeVar("T")
log = logging.getLogger("fleethub.storage")

# Defaults of the settings FLEETHUB_DB_CONNECT_TIMEOUT, _STATEMENT_TIMEOUT and _CALL_TIMEOUT
# (hub/settings.py): a repository call takes milliseconds, so seconds mean the database is not there.
CONNECT_TIMEOUT = 3.0  # seconds to open a connection to PostgreSQL
STATEMENT_TIMEOUT = 4.0  # seconds a statement may run, enforced by the server (a slow, live server)
CALL_TIMEOUT = 4.5  # seconds a whole crossing may take, enforced here (a frozen server)
LISTEN_CHECK = 1.0  # seconds between checks of the LISTEN connections

#: Crossings made by the current task (and tasks it starts), for a caller that asked to count them:
#: the hub's request middleware sets a fresh one-element list per request and exports the count by
#: route (``fleethub_http_request_storage_crossings``). A list, so increments made deeper in the call
#: reach the owner without another ``set``.
crossings_counted: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "fleethub_crossings_counted", default=None)


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """The pool's reset on release. asyncpg's default sends ``pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL`` on every release: one more round trip per crossing, for session state our
    statements never create (no SET, no cursors, no LISTEN, only transaction-scoped advisory locks,
    on pooled connections). An open transaction is still rolled back by asyncpg before this runs; work
    that does change session state says so (``Database.run(..., session=True)``) and is reset in full."""


class NameTaken(Exception):
    """A unique name is taken within its organisation (a configuration, a fleet, a service account).
    The app answers 409 name_exists for every kind (hub/app.py): a store raising it from any write,
    create or rename, can never surface as a 500."""

    kind = "object"

    def __init__(self, name: object = None) -> None:
        super().__init__(name)
        self.name = name


class DatabaseUnavailable(Exception):
    """PostgreSQL could not be reached (down, restarting, refusing connections). An expected condition,
    not a bug: the app answers 503 database_unavailable, actors wait and retry (actors/_runtime/actor.py)."""

    status = 503
    code = "database_unavailable"


# What "the database is not there" looks like from asyncpg: refused or reset sockets, timeouts,
# a server shutting down or starting up, a connection that died under a statement.
_UNREACHABLE = (OSError, asyncio.TimeoutError, asyncpg.exceptions.PostgresConnectionError,
                asyncpg.exceptions.CannotConnectNowError, asyncpg.exceptions.AdminShutdownError,
                asyncpg.exceptions.CrashShutdownError,
                # statement_timeout: the server is too slow to be of use, the same answer as away
                asyncpg.exceptions.QueryCanceledError)

# Buckets (seconds) for the storage crossing histogram exported on /metrics.
CROSSING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
# Buckets (seconds) for the wait for a pooled connection: none at all while the pool has a free one,
# up to the call timeout when every connection is busy or PostgreSQL is away.
POOL_WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0)


@dataclass
class CrossingStats:
    """A histogram of seconds with cumulative buckets (hub/metrics.py exports it): ``stats`` is each
    crossing, trio side to trio side (the statements included) less its wait for a pooled connection,
    which ``pool_wait_stats`` counts apart: a full pool must not look like slow statements."""

    bounds: tuple[float, ...] = CROSSING_BUCKETS
    count: int = 0
    total_seconds: float = 0.0
    buckets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.buckets = self.buckets or [0] * len(self.bounds)

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total_seconds += seconds
        for i, bound in enumerate(self.bounds):
            if seconds <= bound:
                self.buckets[i] += 1


class Database:
    """A pool of asyncpg connections living on a private asyncio loop.

    ``await db.open()`` from trio starts the loop thread and the pool; ``await db.close()`` ends both.
    """

    def __init__(self, dsn: str, *, min_size: int = 2, max_size: int = 10,
                 connect_timeout: float = CONNECT_TIMEOUT, statement_timeout: float = STATEMENT_TIMEOUT,
                 call_timeout: float = CALL_TIMEOUT, application_name: str = "fleethub") -> None:
        self.dsn = dsn
        self.application_name = application_name  # pg_stat_activity names the node (and the fault suite)
        self.min_size = min_size
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self.statement_timeout = statement_timeout
        self.call_timeout = call_timeout
        self.stats = CrossingStats()
        self.pool_wait_stats = CrossingStats(POOL_WAIT_BUCKETS)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: asyncpg.Pool | None = None
        self._listeners: list[asyncpg.Connection] = []
        self._listen_specs: list[tuple[str, Any]] = []  # (channel, asyncpg callback) to re-listen
        self.reconnects = 0  # LISTEN connections re-opened after PostgreSQL came back
        self._closing = False  # set by close(): notifications still in flight are dropped
        # The last crossing found the server unreachable (none has succeeded since): what a caller that
        # would wait for the database without needing to (an answer's audit row, hub/auth/middleware.py)
        # reads to not wait out a second bound after its request's own.
        self.unreachable = False

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        self._closing = False
        self._loop, self._thread = start_loop_thread("fleethub-asyncpg")

        async def create_pool() -> asyncpg.Pool:
            # Built on the asyncio side: asyncpg binds the pool to the loop current at construction.
            # statement_timeout as a startup parameter: it is the session's default, so the full reset
            # after a session=True call (RESET ALL) brings it back. Migrations lift it for themselves.
            return await asyncpg.create_pool(
                self.dsn, min_size=self.min_size, max_size=self.max_size, timeout=self.connect_timeout,
                server_settings={"statement_timeout": str(int(self.statement_timeout * 1000)),
                                 "application_name": self.application_name},
                reset=_keep_session)

        self._pool = await self._cross(create_pool())

    async def listen(self, channel: str, callback: Callable[[str], None]) -> None:
        """Call ``callback(payload)`` in trio for every NOTIFY on ``channel`` (a dedicated connection).

        A notification may come at any moment, shutdown included, and the callback runs straight from
        trio's scheduler (``run_sync_soon``), where an exception would end the whole trio run. So it
        must not start tasks in a nursery that may be closed (hub/services.py ``Services.spawn``), and
        whatever it raises anyway is logged here and goes no further: not into trio, not back into
        asyncpg's reader. Nothing is delivered once ``close`` has begun."""
        token = trio.lowlevel.current_trio_token()

        def deliver(payload: str) -> None:  # in trio
            if self._closing:
                return
            try:
                callback(payload)
            except Exception:  # noqa: BLE001 — see the docstring; the payload may name a user: left out
                log.exception("LISTEN %s: the handler of a notification failed; the notification is dropped",
                              channel)

        def on_notify(_conn: Any, _pid: int, _channel: str, payload: str) -> None:  # in asyncio
            try:
                token.run_sync_soon(deliver, payload)
            except trio.RunFinishedError:
                pass  # the hub has stopped: nobody is left to tell

        self._listen_specs.append((channel, on_notify))
        self._listeners.append(await self._cross(self._listen_connection([(channel, on_notify)])))

    async def _listen_connection(self, specs: list[tuple[str, Any]]) -> asyncpg.Connection:
        conn = await asyncpg.connect(self.dsn, timeout=self.connect_timeout)
        for channel, callback in specs:
            await conn.add_listener(channel, callback)
        return conn

    def listening(self) -> bool:
        return bool(self._listeners) and all(not c.is_closed() for c in self._listeners)

    async def keep_listening(self, on_reconnect: Callable[[], None], *,
                             task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Re-open LISTEN connections that died (PostgreSQL restarted) and call ``on_reconnect``:
        notifications sent meanwhile are lost, so cached state they would have evicted must go."""
        task_status.started()
        while True:
            await trio.sleep(LISTEN_CHECK)
            for i, conn in enumerate(list(self._listeners)):
                if not conn.is_closed():
                    continue
                try:
                    self._listeners[i] = await self._cross(self._listen_connection([self._listen_specs[i]]))
                except DatabaseUnavailable:
                    continue  # still down; try again on the next check
                self.reconnects += 1
                on_reconnect()

    async def close(self) -> None:
        if self._loop is None:
            return
        self._closing = True
        for conn in self._listeners:
            with trio.CancelScope(shield=True):
                await self._cross(conn.close())
        self._listeners.clear()
        if self._pool is not None:
            with trio.CancelScope(shield=True):
                await self._cross(self._pool.close())
            self._pool = None
        await stop_loop_thread(self._loop, self._thread)
        self._loop = None

    # -- the crossing ----------------------------------------------------------------------
    async def _cross(self, coro: Awaitable[T], waited: list[float] | None = None) -> T:
        """One crossing; ``waited`` receives, from the asyncio side, the seconds it spent waiting for a
        pooled connection (read here only after the coroutine finished, so no lock is needed)."""
        assert self._loop is not None, "Database.open() was not awaited"
        counted = crossings_counted.get()
        if counted is not None:
            counted[0] += 1
        started = time.perf_counter()
        try:
            result = await run_on(self._loop, coro)
        except DatabaseUnavailable:
            self.unreachable = True
            raise
        except _UNREACHABLE as exc:
            self.unreachable = True
            raise DatabaseUnavailable(f"the database is not reachable ({type(exc).__name__})") from exc
        else:
            self.unreachable = False
            return result
        finally:
            seconds = time.perf_counter() - started
            if waited:
                self.pool_wait_stats.observe(waited[0])
                seconds = max(0.0, seconds - waited[0])
            self.stats.observe(seconds)

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any, transaction: bool = False,
                  session: bool = False, timeout: float | None = None, bounded: bool = True) -> T:
        """Run ``fn(conn, *args)`` on the asyncio side with one pooled connection: one crossing.
        ``session``: ``fn`` may leave session state behind (a session advisory lock, a SET), so the
        connection is reset in full before it goes back to the pool (see ``_keep_session``).
        ``timeout``: the bound on the whole crossing, ``call_timeout`` unless given; past it,
        ``DatabaseUnavailable``. ``bounded=False`` for none at all (migrations, which may run long and
        wait for another process's)."""
        pool = self._pool
        waited: list[float] = []
        bound = None if not bounded else self.call_timeout if timeout is None else timeout

        async def body() -> T:
            loop = asyncio.get_running_loop()
            deadline = None if bound is None else loop.time() + bound
            # Acquired by hand (not pool.fetch & co.) to time the wait for a connection on its own.
            asked = time.perf_counter()
            try:
                conn = await pool.acquire(timeout=None if deadline is None else max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise DatabaseUnavailable(f"no database connection within {bound:.1f}s") from None
            finally:
                waited.append(time.perf_counter() - asked)
            expired: list[bool] = []

            def expire() -> None:
                expired.append(True)
                conn.terminate()  # see the module's docstring: a frozen server answers no cancel

            timer = None if deadline is None else loop.call_at(deadline, expire)
            try:
                if transaction:
                    async with conn.transaction():
                        return await fn(conn, *args)
                return await fn(conn, *args)
            except asyncpg.exceptions.InternalClientError as exc:
                # The connection is in a state asyncpg cannot go on from ("another operation is in
                # progress": an operation cut short while PostgreSQL shut down, found by the fault
                # suite): as good as broken. It is dropped, and the caller hears "unreachable", so
                # work that must not be lost (Actor.until_stored) is tried again on a fresh one.
                conn.terminate()
                raise DatabaseUnavailable(f"a database connection broke ({type(exc).__name__})") from exc
            except Exception as exc:
                if expired:
                    raise DatabaseUnavailable(f"the database did not answer within {bound:.1f}s") from exc
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                try:
                    if session and not conn.is_closed():
                        await conn.reset()
                finally:
                    await pool.release(conn)

        return await self._cross(body(), waited)

    # Single statements, each one crossing.
    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        return await self.run(lambda conn: conn.fetch(sql, *args))

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        return await self.run(lambda conn: conn.fetchrow(sql, *args))

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self.run(lambda conn: conn.fetchval(sql, *args))

    async def execute(self, sql: str, *args: Any) -> str:
        return await self.run(lambda conn: conn.execute(sql, *args))
