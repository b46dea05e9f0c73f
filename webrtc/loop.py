"""aiortc's asyncio loop, in its own thread, and the crossing to and from trio.

aiortc is asyncio-only. As storage/db.py does for asyncpg, it runs on a private asyncio loop in a
daemon thread; trio hands it coroutines (``await loop.run(coro)``) and sleeps until the loop's
done-callback wakes it through the trio token. One loop serves every peer of the process (an agent
with several sessions, a CLI with several connections): it is started on first use and lives as
long as the process, because peers come and go and a loop per peer would be a thread per peer.

The bytes of a tunnel never cross: forwarding (forward.py) runs entirely on the asyncio side, TCP
socket to data channel, so a crossing (a few hundred microseconds) is paid per control message,
not per chunk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from device_client.shared.bridge import run_on, start_loop_thread

T = TypeVar("T")

# ICE gathers host candidates on every interface but loopback. Tests, benchmarks and a hub and
# devices on one machine set this ("127.0.0.1") so the peers meet on loopback only.
ICE_ADDRESSES_ENV = "FLEETHUB_ICE_ADDRESSES"

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
                self._loop, self._thread = start_loop_thread("fleethub-webrtc", _exception_handler)
            return self._loop

    async def run(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the asyncio side; cancelling the trio caller cancels it there."""
        return await run_on(self.loop(), coro)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the asyncio side without waiting (sync; safe from any thread)."""
        self.loop().call_soon_threadsafe(fn, *args)


def closed_send(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a send that met a closed peer connection: aiortc's DTLS transport raises
    ConnectionError once it is no longer connected and OpenSSL's error ("protocol is shutdown") when
    the TLS state is shut down under it. Both happen when a session ends while SCTP still had a SACK,
    a retransmission or a flush scheduled; nothing is lost that anyone still wanted."""
    if isinstance(exc, ConnectionError):
        return True
    try:
        from OpenSSL import SSL
    except ImportError:  # pragma: no cover — aiortc depends on pyOpenSSL
        return False
    return isinstance(exc, SSL.Error)


def _exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """aiortc starts many tasks nobody awaits (ensure_future of SCTP sends, flushes, timers); when a
    session ends, those still queued fail with a closed-send error and asyncio would log each as
    "Task exception was never retrieved" with a traceback. Those go to DEBUG; anything else is
    reported as asyncio would."""
    if closed_send(context.get("exception")):
        log.debug("after a peer connection closed: %s", context.get("exception"))
        return
    loop.default_exception_handler(context)


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


def restrict_host_addresses(addresses: list[str] | None = None) -> None:
    """Gather ICE host candidates only on ``addresses`` (default: $FLEETHUB_ICE_ADDRESSES, comma
    separated; unset leaves aioice's own choice). aioice has no option for it, so this replaces its
    module-level address lookup for the whole process: one process, one network."""
    if addresses is None:
        value = os.environ.get(ICE_ADDRESSES_ENV, "").strip()
        if not value:
            return
        addresses = [a.strip() for a in value.split(",") if a.strip()]
    import aioice.ice

    chosen = list(addresses)
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: [
        a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]
