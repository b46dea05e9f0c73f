"""The agent's link to the hub, an object of its own: ``Link`` connects (a limiter bounds
simultaneous handshakes), sends the hello, feeds what arrives to device_client/shared/link/DeviceSide and
acts on its events (runs each command in its own task, sends heartbeats when due), and when the link
ends says why and how long to stay away (docs/device-protocol.md, close codes), failing over to the
next hub URL when a link never got its welcome.

Its state is its own: the socket, the welcome's facts (device id, hub keys, frame limit), the
backoff, the close code, the drain window, the counters. The agent (device_client/agent.py) holds one
and drives it: ``connect_once`` and ``pause`` in turn, ``leave`` to end a link for a reboot. What the
link needs from the agent comes in at construction, each for one reason: ``hello`` (the fields of
every hello), ``uptime`` (heartbeats), ``on_link`` (the parts' link hooks, started after each
welcome) and ``who`` (the name the logs give the device). The rules of the link are in
device_client/shared/link/, not here; this is their IO shell.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any, AsyncContextManager, Awaitable, Callable

import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, ConnectionTimeout, HandshakeError, open_websocket_url

from .shared import protocol
from .agentconfig import AgentConfig, link_url
from .shared import outbound_tls
from .shared.backoff import Backoff
from .shared.clock import Clock, rfc3339
from .commands import CommandTable
from .shared.link import CommandReceived, DeviceSide, HeartbeatDue, Ignored, LinkFailed
from .shared.linkcodes import Close, drain_window
from .linkframes import FrameGuard
from .tlsprobe import tls_refusal

log = logging.getLogger("fleethub.agent")
TLS_PROBE_EVERY = 300.0  # seconds


# trio-websocket's reason when our end closes with 1009 because the hub's frame was over
# max_message_size; the hub's own 1009 reasons say "over the limit of N bytes" (or nothing).
_OUR_TOO_BIG = "Exceeded maximum message size"


def _we_refused(reason: str | None) -> bool:
    return bool(reason) and reason.startswith(_OUR_TOO_BIG)  # type: ignore[union-attr]


# _closed_with after a handshake the hub refused with 401 or 403: the token will not start working
# by itself, so the next try waits the slowest backoff, as after 4003 (docs/device-protocol.md).
TOKEN_REFUSED = 401


class _LinkLost(Exception):
    """The hub answered, but not with a usable link (no welcome, wrong first frame)."""


# What ends one link and sends the agent into backoff. Anything else is a bug in the agent: it
# propagates, and the process supervisor (or the sim's nursery) sees it.
_LINK_ERRORS = (HandshakeError, ConnectionClosed, OSError, trio.BrokenResourceError,
                trio.ClosedResourceError, protocol.ProtocolError, _LinkLost)

@dataclass(frozen=True)
class LinkStatistics:
    device_id: str | None
    connected: bool
    links: int  # welcomes received
    link_failures: int  # connects or links that ended in an error
    heartbeats_sent: int
    last_error: str | None


class Link:
    """The device's link to the hub (see the module's docstring)."""

    def __init__(self, config: AgentConfig, clock: Clock, commands: CommandTable, *,
                 hello: Callable[[], dict[str, Any]], uptime: Callable[[], float],
                 on_link: Callable[[], Awaitable[None]], who: Callable[[], str]) -> None:
        # Several URLs (nodes of a cluster): a link that fails before its welcome moves on to the next,
        # so the devices of a node that died come back through the others (``_fail_over``).
        self.hub_urls = config.hub_urls
        self.hub_url = self.hub_urls[0]
        self.link_url = link_url(self.hub_url)
        self.clock = clock
        self.commands = commands
        commands.on_idle = self._commands_answered  # a leave waits for the last reply in flight
        self.frames = FrameGuard(config.data_dir, clock, config.max_frame_bytes)  # the link's frame limit
        self.device_id: str | None = None  # welcome.deviceId
        self.hub_keys: dict[str, str] = {}  # welcome.hubKeys: kid -> public key that signs tunnel grants
        self.connected = False
        self._hello, self._uptime, self._on_link, self._who = hello, uptime, on_link, who
        self._auth = [(protocol.TOKEN_HEADER.lower().encode(), b"Bearer " + config.token.encode())]
        self._backoff = Backoff(config.backoff_initial, config.backoff_max, config.rng)
        self._superseded_backoff = config.superseded_backoff
        self._limiter = config.connect_limiter
        self._limiter_held = False
        self._connect_timeout = config.connect_timeout
        self._handshake_timeout = config.handshake_timeout
        self._ssl_context = config.ssl_context
        self._connector = config.connector  # None: a WebSocket to the hub's URL
        self._closed_with: int | None = None  # the close code that ended the last link, if the hub sent one
        self._closed_reason: str | None = None  # and its reason (4004 states the drain window in it)
        self._reconnect_after: float | None = None  # set by link.drain: leave the link, come back then
        # what ends this link once the replies being worked on are sent: (close code, reason, what to
        # do before closing), in the order asked; a pending one also stops the next session starting
        self._leaving: list[tuple[int, str, Callable[[], Awaitable[None]] | None]] = []
        self._ws: Any = None
        self._scope: trio.CancelScope | None = None  # the session or the pause a leave cancels
        self._connected_event = trio.Event()
        self._link_welcomed = False
        self._link_error: BaseException | None = None
        self._on_first_welcome: Callable[[], None] | None = None
        self._stats = dict(links=0, link_failures=0, heartbeats_sent=0)
        self._last_error: str | None = None
        # A connect timeout to a wss:// hub may be TLS in disguise (device_client/tlsprobe.py): probed at
        # most every TLS_PROBE_EVERY s, so an overloaded hub is not sent a second handshake per timeout.
        self._tls_probe_due = -math.inf
        self._tls_refusal: str | None = None

    # ---- what the agent uses ----

    def on_first_welcome(self, callback: Callable[[], None]) -> None:
        self._on_first_welcome = callback

    def leave(self, code: int, reason: str, before_close: Callable[[], Awaitable[None]] | None = None) -> None:
        """End the link (or the pause before the next) once the replies being worked on are sent,
        closing with ``code`` after ``await before_close()``; no session starts while one is pending."""
        if all(code != pending for pending, _, _ in self._leaving):
            self._leaving.append((code, reason, before_close))
        self._commands_answered()

    def stay(self) -> None:
        """Forget a pending leave: the reboot that asked for it has happened (the agent's boot)."""
        self._leaving.clear()

    def request_reconnect(self, after: float, url: str | None = None) -> None:
        """Leave the link once the replies being worked on are sent, and reconnect at a random moment
        within ``after`` seconds — to ``url`` when given (ValueError if it is not a hub URL)."""
        if url is not None:
            self.link_url, self.hub_url = link_url(url), url
        self._reconnect_after = after
        self.leave(1001, "drained by the hub")  # 1001: going away

    def reset_backoff(self) -> None:
        self._backoff.reset()

    async def send_event(self, kind: str, payload: dict[str, Any] | None = None) -> bool:
        """Send an event now; False when there is no link (the next hello carries the state)."""
        ws = self._ws
        if ws is None:
            return False
        text = self.frames.encode_event(kind, payload or {})
        if text is None:
            return True  # too big even trimmed: dropped and recorded (linkframes.py), never to be resent
        try:
            await ws.send_message(text)
        except _LINK_ERRORS:
            return False
        return True

    def device_auth(self) -> dict[str, str]:
        """The device's credential for the hub's device HTTP endpoints (memory-test page maps)."""
        return {k.decode(): v.decode() for k, v in self._auth}

    @property
    def ssl_context(self) -> Any:
        return self._ssl_context

    async def wait_connected(self) -> None:
        await self._connected_event.wait()

    def statistics(self) -> LinkStatistics:
        return LinkStatistics(device_id=self.device_id, connected=self.connected, last_error=self._last_error,
                              **self._stats)

    # ---- one link, then a pause ----

    async def pause(self, welcomed: bool) -> None:
        """Wait before the next connect: the backoff after a failure (and the next hub URL), the
        drain window, or what the last close code asks for. ``leave`` cuts it short."""
        if welcomed:
            self._backoff.reset()
        else:
            self._fail_over()
        delay = self._backoff.next_delay()
        if self._reconnect_after is not None:
            # drained by the hub: spread the reconnects over the window it gave
            delay, self._reconnect_after = self._backoff.within(self._reconnect_after), None
        else:
            delay = self._after_close(delay)
        log.debug("%s: reconnecting in %.2fs", self._who(), delay)
        with trio.CancelScope() as self._scope:
            await trio.sleep(delay)
        self._scope = None

    def _fail_over(self) -> None:
        """After a link that never got its welcome: the next hub URL of the list, in turn (the same one
        again when there is only one; a drain's successor URL stays until it fails too)."""
        if len(self.hub_urls) < 2:
            return
        current = self.hub_urls.index(self.hub_url) if self.hub_url in self.hub_urls else -1
        self.hub_url = self.hub_urls[(current + 1) % len(self.hub_urls)]
        self.link_url = link_url(self.hub_url)
        log.info("%s: trying the next hub, %s", self._who(), self.hub_url)

    def _after_close(self, delay: float) -> float:
        """How long to stay away after the hub closed the link with ``_closed_with`` (docs/device-protocol.md,
        close codes): superseded means another holder of our token took over, and coming straight back
        would knock it off in a loop; a revoked token or an unknown version will not work sooner."""
        code, self._closed_with = self._closed_with, None
        if code == Close.SUPERSEDED:
            log.warning("%s: another connection with this device's token took over (4001); staying away "
                        "%.0f s. If this repeats, two devices share one token.", self._who(), self._superseded_backoff)
            return self._superseded_backoff + delay
        if code in (Close.CREDENTIAL_REVOKED, Close.UNKNOWN_VERSION, TOKEN_REFUSED):
            return max(delay, self._backoff.maximum)
        if code == Close.DRAINING:
            # every device of a drained hub comes back at once otherwise: spread over the stated window
            return self._backoff.within(drain_window(self._closed_reason))
        return delay

    def _commands_answered(self) -> None:
        # a requested leave waits until every reply being worked on has been sent
        if self._leaving and self.commands.inflight == 0 and self._scope is not None:
            self._scope.cancel()

    async def _link_tls(self) -> Any:
        """The TLS context of a ``wss://`` link: the configured one, else the system's, made once per
        process off the loop (outbound_tls.py); trio-websocket would make one on the loop at every
        connect (about 60 ms of CPU on a slow host; a simulator's devices reconnecting at once, each)."""
        if self._ssl_context is not None or not self.link_url.startswith("wss:"):
            return self._ssl_context
        return await outbound_tls.system_default()

    def _open(self, tls: Any) -> AsyncContextManager[Any]:
        if self._connector is not None:  # a test's in-memory hub (tests/device_client/device_fakehub.py)
            return self._connector(self._auth)
        return open_websocket_url(self.link_url, tls, extra_headers=self._auth,
                                  max_message_size=protocol.MAX_FRAME_BYTES, connect_timeout=self._connect_timeout,
                                  disconnect_timeout=5)

    async def connect_once(self) -> bool:
        """One link, from the connect to its end; True if it got its welcome."""
        self._link_welcomed = False
        self._link_error = None
        opened: Any = None
        try:
            if self._limiter is not None:
                # bounds simultaneous handshakes, so 15,000 agents (or one hub restart) do not
                # open 15,000 TCP connections in the same millisecond
                await self._limiter.acquire_on_behalf_of(self)
                self._limiter_held = True
            async with self._open(await self._link_tls()) as ws:
                opened = ws
                with trio.CancelScope() as self._scope:
                    if not self._leaving:
                        await self._session(ws)
                self._scope = None
                leaving, self._leaving = self._leaving, []
                for code, reason, before_close in leaving:
                    if before_close is not None:
                        await before_close()
                    await ws.aclose(code, reason)
        except ConnectionRejected as exc:
            self._link_failed(exc)
            if exc.status_code in (401, 403):
                self._closed_with, self._closed_reason = TOKEN_REFUSED, None
                log.warning("%s: the hub refused the device token (HTTP %d) at %s; check the "
                            "token or the device's registration. Retrying in %.0f s.",
                            self._who(), exc.status_code, self.link_url, self._backoff.maximum)
            else:
                log.warning("%s: the hub refused the link (HTTP %d)", self._who(), exc.status_code)
        except _LINK_ERRORS as exc:
            refusal = await self._tls_reason() if isinstance(exc, ConnectionTimeout) else None
            failure = self._link_failed(exc, refusal)
            log.log(logging.INFO if self._link_welcomed else logging.WARNING, "%s: link %s: %s",
                    self._who(), "lost" if self._link_welcomed else "failed", failure)
            # The close code decides the backoff (4003: stay away the slowest). Which of the link's
            # tasks noticed the close first is a race (a send's BrokenResourceError, the machine's
            # LinkFailed), so the code is read from the socket, which holds the hub's close frame
            # whatever error ended the link; CI once saw a reconnect 0.00 s after a 4003.
            closed = exc.reason if isinstance(exc, ConnectionClosed) else getattr(opened, "closed", None)
            if closed is not None:
                self._closed_with, self._closed_reason = closed.code, closed.reason
                if closed.code != protocol.CLOSE_TOO_BIG and closed.reason:
                    log.warning("%s: the hub closed the link (%d): %s", self._who(), closed.code, closed.reason)
            if isinstance(exc, ConnectionClosed) and exc.reason.code == protocol.CLOSE_TOO_BIG:
                if _we_refused(exc.reason.reason):
                    # our own end closed: the hub sent a frame over our limit. Nothing of ours was
                    # refused, so nothing is trimmed, dropped or learned.
                    log.warning("%s: the hub sent a frame over this agent's limit of %d bytes; link closed "
                                "(1009)", self._who(), protocol.MAX_FRAME_BYTES)
                else:
                    # the hub refused a frame as too big: trim or drop it before coming back, never resend it
                    self.frames.refused_by_hub(exc.reason.reason or "")
        finally:
            if self._closed_with is None and opened is not None:
                # a link that ended with no error (its session returned): the hub's close frame, if any
                closed = getattr(opened, "closed", None)
                if closed is not None:
                    self._closed_with, self._closed_reason = closed.code, closed.reason
            self._leaving.clear()  # a link that failed first: what asked to leave sees it has ended
            self._release_limiter()
            self._scope = None
            self._ws = None
            self.connected = False
            if self._connected_event.is_set():
                self._connected_event = trio.Event()
        return self._link_welcomed

    async def _session(self, ws: Any) -> None:
        await ws.send_message(self.frames.encode_hello(self._hello()))
        side = DeviceSide(trio.current_time(), handshake_timeout=self._handshake_timeout)
        try:
            [first] = await self._feed(ws, side)
            if isinstance(first, LinkFailed):
                raise _LinkLost(first.why)
            welcome = first.welcome  # type: ignore[attr-defined]
            self.device_id = welcome.deviceId
            self.hub_keys = dict(welcome.hubKeys)
            self.frames.linked(welcome.maxFrameBytes)
            self._ws = ws
            self.connected = True
            self._link_welcomed = True
            self._tls_refusal, self._tls_probe_due = None, -math.inf
            self._stats["links"] += 1
            self._connected_event.set()
            self._release_limiter()
            if self._on_first_welcome is not None:
                self._on_first_welcome, started = None, self._on_first_welcome
                started()
            refusals = self.frames.take_report()
            if refusals:  # what the hub or the agent refused as too big since the last link
                await self.send_event("link.refused", {"refusals": refusals})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._on_link)
                await self._guard(nursery.cancel_scope, self._drive, ws, side, nursery)
        finally:
            side.closed()
        if self._link_error is not None:
            raise self._link_error

    async def _feed(self, ws: Any, side: DeviceSide) -> list[object]:
        """One turn of the IO shell: read a frame (or wait out the side's deadline) and feed it."""
        deadline = side.deadline()
        message = None
        with trio.move_on_at(math.inf if deadline is None else deadline):
            message = await ws.get_message()  # trio-websocket queues messages: a cancel loses none
        now = trio.current_time()
        return side.tick(now) if message is None else side.receive(message, now)

    async def _guard(self, scope: trio.CancelScope, fn: Callable[..., Awaitable[None]],
                     *args: Any) -> None:
        # Turns the end of the link into one error instead of an ExceptionGroup of them.
        try:
            await fn(*args)
        except _LINK_ERRORS as exc:
            if self._link_error is None:
                self._link_error = exc
            scope.cancel()

    async def _drive(self, ws: Any, side: DeviceSide, nursery: trio.Nursery) -> None:
        while True:
            for event in await self._feed(ws, side):
                if isinstance(event, CommandReceived):
                    # each command in its own task: a slow handler must not delay a ping
                    nursery.start_soon(self._guard, nursery.cancel_scope, self.commands.dispatch, event.command,
                                       functools.partial(self._send_reply, ws), self.device_id, self._who())
                elif isinstance(event, HeartbeatDue):
                    payload = {"deviceClock": rfc3339(self.clock.now()), "uptime": round(self._uptime(), 3)}
                    await ws.send_message(side.heartbeat(payload, trio.current_time()))
                    self._stats["heartbeats_sent"] += 1
                elif isinstance(event, Ignored):
                    log.log(logging.WARNING if event.undecodable else logging.DEBUG, "%s: ignoring %s",
                            self._who(), event.why)

    async def _send_reply(self, ws: Any, reply: protocol.Reply) -> None:
        text, sent = self.frames.encode_reply(reply)
        if sent is not reply:  # too big: a repeated command gets the too_large answer, not the original
            self.commands.remember(reply.id, sent)
        await ws.send_message(text)

    async def _tls_reason(self) -> str | None:
        """Why TLS refuses the hub, when it does; the last probe's answer between probes."""
        if trio.current_time() >= self._tls_probe_due:
            self._tls_probe_due = trio.current_time() + TLS_PROBE_EVERY
            self._tls_refusal = await tls_refusal(self.link_url, await self._link_tls(), self._connect_timeout)
        return self._tls_refusal

    def _link_failed(self, exc: BaseException, described: str | None = None) -> str:
        # trio-websocket wraps the OSError that says what went wrong ("connection refused")
        if described is None:
            described = f"{exc!r}: {exc.__cause__}" if exc.__cause__ else repr(exc)
        self._stats["link_failures"] += 1
        self._last_error = described
        return described

    def _release_limiter(self) -> None:
        if self._limiter_held:
            self._limiter_held = False
            self._limiter.release_on_behalf_of(self)  # type: ignore[union-attr]
