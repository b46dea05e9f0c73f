"""aiortc's asyncio loop, in its own thread, and the crossing to and from trio.

aiortc is asyncio-only. As storage/db.py does for asyncpg, it runs on a private asyncio loop in a
daemon thread; trio hands it coroutines (``await loop.run(coro)``) and sleeps until the loop's
done-callback wakes it through the trio token. One loop serves every peer of the process (an agent
with several sessions): it is started on first use and lives as long as the process, because peers
come and go and a loop per peer would be a thread per peer. The ``fleethub tunnel`` CLI has no trio
at all: it runs its peer (connection.py) on its main thread's asyncio loop (cli_tunnel.py).

The bytes of a tunnel never cross: forwarding (forward.py) runs entirely on the asyncio side, TCP
socket to data channel, so a crossing (a few hundred microseconds) is paid per control message,
not per chunk.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from device_client.shared.bridge import run_on, start_loop_thread

from .closed import closed_send, exception_handler
from .ice import ICE_ADDRESSES_ENV, restrict_host_addresses

__all__ = ["AsyncioThread", "ICE_ADDRESSES_ENV", "closed_send", "restrict_host_addresses", "shared", "to_trio"]

T = TypeVar("T")

log = logging.getLogger("fleethub.webrtc")


class AsyncioThread:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, started on first use (sync: a thread start, no IO)."""
        with self._lock:
            if self._loop is None:
                self._loop, self._thread = start_loop_thread("fleethub-webrtc", exception_handler)
            return self._loop

    async def run(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the asyncio side; cancelling the trio caller cancels it there."""
        return await run_on(self.loop(), coro)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the asyncio side without waiting (sync; safe from any thread)."""
        self.loop().call_soon_threadsafe(fn, *args)


_shared = AsyncioThread()


def shared() -> AsyncioThread:
    return _shared


def to_trio(fn: Callable[..., Any]) -> Callable[..., None]:
    """Wrap a trio-side sync callback so the asyncio side can call it: it runs in the trio thread.

    An exception raised by a ``run_sync_soon`` callback ends the whole trio run (TrioInternalError),
    so one peer's failing callback would take the process down: it is logged and goes no further."""
    token = trio.lowlevel.current_trio_token()

    def guarded(*args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("a peer callback (%s) failed", getattr(fn, "__name__", "callback"))

    def call(*args: Any) -> None:
        try:
            token.run_sync_soon(guarded, *args)
        except trio.RunFinishedError:
            pass

    return call
