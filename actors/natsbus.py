"""The command bus over a NATS server, for a hub that runs as several processes (issue 17).

Same interface as ``actors.bus.Bus`` (``subscribe``, ``request``, ``has_responder``, ``statistics``)
plus ``publish`` (fire and forget, for broadcasts: takeovers, events, invalidations). A request that
nobody holds raises ``NoResponders`` at once (the server says so: NATS 2.2+ "no responders"), one
that nobody answers in time raises ``RequestTimeout``; the API turns these into 503 device_offline and
504 device_timeout as it does for the in-process bus. A request the bus cannot carry (the server
unreachable or stalled) raises ``Unavailable``: 503 bus_unavailable, not device_offline, since who
holds the subject is then unknown.

A subject held in this process is answered in process, never through the server: a command to a
device whose link this node holds, like everything on a single hub, goes on while NATS is down
(issue 38). The newest subscription of a pattern in this process is the one the server would route to
here anyway; a stale one, whose device has just moved to another node, belongs to a link that is
closing (hub/cluster/presence.py) and answers as that link does.

nats-py is asyncio-only, so the client lives on a private asyncio loop in its own thread, as asyncpg
does (storage/db.py), and trio awaits it through ``device_client.shared.bridge.run_on``. Messages the server
delivers are handed to trio through the trio token and run as tasks in the bus's nursery.

Within one process the newest subscription of a pattern wins, as in the in-process bus: the bus keeps
one NATS subscription per pattern and dispatches to whichever local handler holds it now. Across
processes, two holders of ``cmd.<device>.>`` would both answer; hub/cluster/presence.py makes the
older one let go (a takeover broadcast), so that lasts a moment at most.

A connection that dies without closing (a network that drops packets, a half-open TCP link) is not
noticed by nats-py in time: its PING comes every two minutes by default and, when the server does not
answer, the connection is not always torn down (nats.py issues #522 and #671). So the bus probes the
server itself: a round trip (``flush``: PING, wait for PONG) every ``PROBE_EVERY`` seconds. One still
unanswered after ``STALL_AFTER`` marks the connection stalled (counted in ``stalls``): ``connected`` is
false, the requests in flight end at once with ``Unavailable`` rather than wait out their timeouts, and
new ones fail at once, until a round trip comes back. One unanswered after ``PROBE_TIMEOUT`` means the
connection is dead: it is forced to reconnect (``force_reconnect``), counted in ``stale``. A request
sent while the server is stopped thus fails within about ``PROBE_EVERY + STALL_AFTER`` seconds.

A handler's ``actors.errors`` failure (the device refused, the link is closing) crosses the wire as
its class name, code and message and is raised again on the asking side; anything else is a bug on
the answering node and arrives as ``BusError``. Secrets never ride in these errors: handlers' messages
are the API's own error messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from actors import errors as actor_errors
from actors.bus import BusError, Handler, NoResponders, RequestTimeout, Unavailable, match, request_in_process
from device_client.shared.bridge import run_on, start_loop_thread, stop_loop_thread

log = logging.getLogger("fleethub.natsbus")

PROBE_EVERY = 0.5  # seconds between round trips to the server (a PING of a few bytes)
STALL_AFTER = 1.0  # a round trip slower than this: requests fail at once until one comes back
PROBE_TIMEOUT = 2.0  # a round trip slower than this: the connection is dead, reconnect
MAX_OUTBOX = 10_000  # publishes waiting for the asyncio side; past it they are dropped and counted


class NatsSubscription:
    __slots__ = ("bus", "pattern", "handler")

    def __init__(self, bus: "NatsBus", pattern: str, handler: Handler) -> None:
        self.bus, self.pattern, self.handler = bus, pattern, handler

    def close(self) -> None:
        """Unsubscribe, unless a newer subscription of this process already replaced this one."""
        if self.bus._subs.get(self.pattern) is self:
            del self.bus._subs[self.pattern]
            self.bus._drop_remote(self.pattern)

    def __enter__(self) -> "NatsSubscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), default=str).encode()


def _error_reply(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, actor_errors.AskError):
        # By the nearest class of the actors' tree: the link raises the hub's subclasses (hub/errors.py
        # DeviceError is a DeviceRefused), whose names the asking side's actors.errors does not hold.
        cls = next(c for c in type(exc).__mro__ if getattr(actor_errors, c.__name__, None) is c)
        return {"__error__": {"class": cls.__name__, "code": exc.code, "message": exc.message}}
    # a bug on the answering node: its log has the traceback; the asker hears only that it failed
    return {"__error__": {"class": "BusError", "code": "internal", "message": "the answering hub node failed"}}


def _raise_remote(err: dict[str, Any]) -> None:
    cls = getattr(actor_errors, str(err.get("class")), None)
    if isinstance(cls, type) and issubclass(cls, actor_errors.AskError):
        raise cls(str(err.get("message", "")), code=str(err.get("code") or cls.code))
    raise BusError(str(err.get("message", "the answering hub node failed")))


class NatsBus:
    """Open with ``open_nats_bus``; ``connected`` says whether the client holds a server connection now."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self._subs: dict[str, NatsSubscription] = {}
        self._remote: dict[str, Any] = {}  # pattern -> nats-py subscription (asyncio side only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nc: Any = None
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self.requests = self.no_responders = self.timeouts = self.received = 0
        self.unavailable = 0  # requests failed because the bus could not carry them
        self.reconnects = 0
        self.stale = 0  # connections found dead by the probe and forced to reconnect
        self.stalls = 0  # round trips slower than STALL_AFTER: requests failed fast meanwhile
        self.local = 0  # requests answered in process (a subject this process holds)
        self._stalled = False
        self._in_flight: set[trio.CancelScope] = set()  # NATS requests, ended at once when the bus is cut off
        # Publishes cross to the asyncio side in batches: one wake-up and one task per batch, not per
        # message (nats-py's per-operation task cost); trio appends, the asyncio side drains.
        self._outbox: deque[tuple[str, bytes]] = deque()
        self._out_lock = threading.Lock()
        self._draining = False
        self.published = self.publish_batches = 0
        self.publish_dropped = 0  # trio side: NATS down or the outbox full
        self.publish_failed = 0  # asyncio side: the client refused the message
        self.probe_every, self.stall_after, self.probe_timeout = PROBE_EVERY, STALL_AFTER, PROBE_TIMEOUT
        self.dropped_in_flight = 0  # requests ended by ``_cut_off``
        self.restored = 0  # times the bus came back after a disconnect or a stall
        self._on_restored: list[Callable[[], None]] = []

    # -- lifecycle -------------------------------------------------------------------------------

    async def _start(self, nursery: trio.Nursery) -> None:
        import nats  # imported here: a hub without FLEETHUB_NATS_URL never needs it

        self._nursery, self._token = nursery, trio.lowlevel.current_trio_token()
        self._loop, self._thread = start_loop_thread("fleethub-nats")

        async def reconnected() -> None:
            self.reconnects += 1
            log.info("NATS: reconnected to %s", self.url)
            self._to_trio(self._came_back)  # nats-py has resubscribed by now: what follows is heard

        async def disconnected() -> None:
            log.warning("NATS: disconnected from %s", self.url)
            self._to_trio(self._cut_off)  # what is in flight will not be answered on this connection

        async def error(exc: Exception) -> None:
            log.info("NATS: %s", type(exc).__name__)

        # Reconnect for ever: a NATS restart must not end the hub; nats-py resubscribes on its own.
        self._nc = await run_on(self._loop, nats.connect(
            self.url, name=self.name, allow_reconnect=True, max_reconnect_attempts=-1,
            reconnect_time_wait=0.5, connect_timeout=5, reconnected_cb=reconnected,
            disconnected_cb=disconnected, error_cb=error))
        nursery.start_soon(self._probe)  # ends with the bus's nursery

    async def _probe(self) -> None:
        """Round trips to the server: a slow one means a stall, a slower one a dead connection (see the
        docstring)."""
        while True:
            await trio.sleep(self.probe_every)
            if self._nc is None or not self._nc.is_connected or self._loop is None:
                continue  # nats-py is reconnecting already
            answered = await self._round_trip()
            if answered and self._stalled:
                self._stalled = False
                self._came_back()
            if answered is not False or not self._nc.is_connected:
                continue
            self.stale += 1
            log.warning("NATS: no answer from the server within %.1f s: the connection is dead; reconnecting",
                        self.probe_timeout)
            try:
                await run_on(self._loop, self._nc.force_reconnect())
            except Exception as exc:  # noqa: BLE001 — the next probe tries again
                log.info("NATS: forcing a reconnect failed: %s", type(exc).__name__)

    async def _round_trip(self) -> bool | None:
        """One PING/PONG: True when answered, False when not within ``probe_timeout``, None when it
        failed otherwise (closed or reconnecting meanwhile: the next round sees it). The bus is marked
        stalled as soon as it has taken ``stall_after``."""
        came_back = trio.Event()
        answered: bool | None = True
        loop = self._loop
        assert loop is not None, "open the bus with open_nats_bus"

        async def flush() -> None:
            nonlocal answered
            try:
                with trio.fail_after(self.probe_timeout + 1):
                    await run_on(loop, self._nc.flush(timeout=self.probe_timeout))
            except (asyncio.TimeoutError, trio.TooSlowError):  # nats.errors.TimeoutError & FlushTimeoutError too
                answered = False
            except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 — see the docstring
                # asyncio.CancelledError (a BaseException): nats-py cancels a pending flush when it closes
                # or reconnects the connection under it. A cancel of ours arrives as trio.Cancelled instead.
                answered = None
                log.debug("NATS probe: %s", type(exc).__name__)
            finally:
                came_back.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flush)
            with trio.move_on_after(self.stall_after):
                await came_back.wait()
            if not came_back.is_set() and not self._stalled:
                self.stalls += 1
                log.warning("NATS: no answer from the server within %.1f s: failing requests until it answers",
                            self.stall_after)
                self._stalled = True
                self._cut_off()
        return answered

    def _cut_off(self) -> None:
        """End every NATS request in flight now (each raises ``Unavailable``): no answer is coming soon.
        nats-py would keep them waiting their whole timeout (a configuration apply's is 120 s), after
        which a device that may never have seen the command would be judged by a timeout (issue 38)."""
        self.dropped_in_flight += len(self._in_flight)
        for scope in self._in_flight:
            scope.cancel()

    def on_restored(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (on the trio side) each time the bus carries messages again after a disconnect or
        a stall: whatever was published meanwhile, on any node, may never arrive."""
        self._on_restored.append(fn)

    def _came_back(self) -> None:
        self.restored += 1
        for fn in list(self._on_restored):
            fn()

    def _to_trio(self, fn: Any) -> None:  # from the asyncio side
        if self._token is not None:
            try:
                self._token.run_sync_soon(fn)
            except trio.RunFinishedError:
                pass

    async def _stop(self) -> None:
        if self._loop is None:
            return
        # Shielded whole: this runs while an exception leaves the process's services, and a Cancelled
        # raised here would replace that exception, which the nursery's cancelled scope then swallows
        # (a hub that failed to start would end quietly instead of saying why).
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                if self._nc is not None:
                    await run_on(self._loop, self._nc.close())
            except Exception as exc:  # noqa: BLE001 — closing anyway
                log.info("NATS close: %s", type(exc).__name__)
        await stop_loop_thread(self._loop, self._thread, timeout=5)
        self._loop = None

    @property
    def connected(self) -> bool:
        """The client holds a server connection now, and the server answers it (not stalled)."""
        return self._nc is not None and self._nc.is_connected and not self._stalled

    # -- the Bus interface -----------------------------------------------------------------------

    def subscribe(self, pattern: str, handler: Handler) -> NatsSubscription:
        sub = NatsSubscription(self, pattern, handler)
        fresh = pattern not in self._subs
        self._subs[pattern] = sub
        if fresh:
            self._add_remote(pattern)
        return sub

    def has_responder(self, subject: str) -> bool:
        """Only this process's subscriptions: a remote holder is found by asking (``request``)."""
        from actors.bus import _matches
        tokens = subject.split(".")
        return any(p == subject or _matches(p, tokens) for p in self._subs)

    def may_reach(self, subject: str) -> bool:
        """Any node may hold the subject: only a request finds out."""
        return True

    async def request(self, subject: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        import nats.errors

        self.requests += 1
        sub = match(self._subs, subject)
        if sub is not None:
            self.local += 1
            return await request_in_process(sub.handler, subject, payload, timeout)
        if not self.connected:
            # NATS is down, restarting or stalled: fail at once rather than queue the command for later
            self.unavailable += 1
            raise Unavailable(subject)
        assert self._loop is not None
        msg = None
        with trio.CancelScope() as scope:
            self._in_flight.add(scope)
            try:
                with trio.fail_after(timeout + 1):  # the client's own timeout should fire first
                    msg = await run_on(self._loop, self._nc.request(subject, _encode(payload), timeout=timeout))
            except nats.errors.NoRespondersError:
                self.no_responders += 1
                raise NoResponders(subject) from None
            except (nats.errors.TimeoutError, trio.TooSlowError):
                self.timeouts += 1
                raise RequestTimeout(subject) from None
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
                    nats.errors.OutboundBufferLimitError, asyncio.CancelledError):
                # asyncio.CancelledError: nats-py cancelled the request's future as it closed or
                # reconnected the connection (a cancel of ours arrives as trio.Cancelled)
                self.unavailable += 1
                raise Unavailable(subject) from None
            finally:
                self._in_flight.discard(scope)
        if msg is None:  # cut off while waiting (``_cut_off``)
            self.unavailable += 1
            raise Unavailable(subject)
        answer = json.loads(msg.data or b"{}")
        if isinstance(answer, dict) and "__error__" in answer:
            _raise_remote(answer["__error__"])
        return answer

    def publish(self, subject: str, payload: dict[str, Any]) -> None:
        """Fire and forget (at most once): dropped, and counted, when NATS is down or too far behind.
        A stalled connection still takes them (the client buffers them for the server's return)."""
        if self._loop is None or self._nc is None or not self._nc.is_connected:
            self.publish_dropped += 1
            return
        data = _encode(payload)
        with self._out_lock:
            if len(self._outbox) >= MAX_OUTBOX:
                self.publish_dropped += 1
                return
            self._outbox.append((subject, data))
            self.published += 1
            if self._draining:
                return  # the batch under way takes this one too
            self._draining = True
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:  # asyncio side: one task per batch
        while True:
            with self._out_lock:
                if not self._outbox:
                    self._draining = False
                    return
                batch = list(self._outbox)
                self._outbox.clear()
            self.publish_batches += 1
            for subject, data in batch:
                try:
                    await self._nc.publish(subject, data)
                except Exception as exc:  # noqa: BLE001 — at most once, by contract; counted
                    self.publish_failed += 1
                    log.info("NATS publish on %s dropped: %s", subject, type(exc).__name__)

    def statistics(self) -> dict[str, int]:
        return {"subscriptions": len(self._subs), "requests": self.requests,
                "no_responders": self.no_responders, "timeouts": self.timeouts,
                "received": self.received, "reconnects": self.reconnects, "stale": self.stale,
                "restored": self.restored,
                "stalls": self.stalls, "unavailable": self.unavailable, "local": self.local,
                "published": self.published, "publish_batches": self.publish_batches,
                "publish_dropped": self.publish_dropped + self.publish_failed, "connected": int(self.connected)}

    # -- the asyncio side ------------------------------------------------------------------------
    # Subscribing is scheduled on the client's loop, not awaited: subscribe() is synchronous, as the
    # in-process bus's is. The loop runs callbacks in order, so this process's own later requests
    # come after it; another node may see no responder for the few milliseconds it takes to reach
    # the server.

    def _add_remote(self, pattern: str) -> None:
        assert self._loop is not None, "open the bus with open_nats_bus"
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._subscribe_remote(pattern)))

    def _drop_remote(self, pattern: str) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._unsubscribe_remote(pattern)))

    async def _subscribe_remote(self, pattern: str) -> None:
        if pattern in self._remote or pattern not in self._subs:
            return
        token = self._token
        assert token is not None, "open the bus with open_nats_bus"

        async def deliver(msg: Any) -> None:
            try:
                token.run_sync_soon(self._dispatch, pattern, msg)
            except trio.RunFinishedError:
                pass

        self._remote[pattern] = await self._nc.subscribe(pattern, cb=deliver)

    async def _unsubscribe_remote(self, pattern: str) -> None:
        if pattern in self._subs:
            return  # subscribed again meanwhile: keep it
        remote = self._remote.pop(pattern, None)
        if remote is not None:
            with contextlib.suppress(Exception):
                await remote.unsubscribe()

    # -- the trio side ---------------------------------------------------------------------------

    def _dispatch(self, pattern: str, msg: Any) -> None:
        self.received += 1
        assert self._nursery is not None  # messages arrive only once _start has run
        try:
            self._nursery.start_soon(self._handle, pattern, msg)
        except RuntimeError:
            pass  # shutting down

    async def _handle(self, pattern: str, msg: Any) -> None:
        sub = self._subs.get(pattern)
        try:
            if sub is None:
                raise actor_errors.DeviceOffline("the link closed before the request arrived")
            payload = json.loads(msg.data or b"{}")
            result = await sub.handler(msg.subject, payload)
            answer = result if isinstance(result, dict) else {}
        except Exception as exc:  # noqa: BLE001 — the asker hears it; a bug is logged here
            if not isinstance(exc, actor_errors.AskError):
                log.exception("bus handler for %s failed", msg.subject)
            answer = _error_reply(exc)
        if msg.reply and self._loop is not None:
            try:
                await run_on(self._loop, msg.respond(_encode(answer)))
            except Exception as exc:  # noqa: BLE001 — the asker times out
                log.info("NATS reply on %s lost: %s", msg.subject, type(exc).__name__)


@contextlib.asynccontextmanager
async def open_nats_bus(url: str, name: str) -> AsyncIterator[NatsBus]:
    bus = NatsBus(url, name)
    async with trio.open_nursery() as nursery:
        try:
            await bus._start(nursery)
            yield bus
        finally:
            await bus._stop()
            nursery.cancel_scope.cancel()
