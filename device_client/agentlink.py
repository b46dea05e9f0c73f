"""The agent's link, the IO shell around device_client/link/DeviceSide: connect (a limiter bounds
simultaneous handshakes), send the hello, feed what arrives to the side and act on its events (run
each command in its own task, send heartbeats when due), and when the link ends say why and how long
to stay away (docs/device-protocol.md, close codes).

``LinkShell`` is a base of ``Agent`` (device_client/agent.py): these are its methods for the link;
the state they use (the socket, the backoff, the limiter, the close code) is the agent's, set up in
its ``__init__``. The split keeps the agent's module to what the device holds; the link's rules are
in device_client/link/, not here.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Awaitable, Callable

import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError

from . import protocol
from .clock import rfc3339
from .link import CommandReceived, DeviceSide, HeartbeatDue, Ignored, LinkFailed
from .linkcodes import Close, drain_window

log = logging.getLogger("fleethub.agent")


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

class LinkShell:
    """The link's half of the agent (see the module's docstring)."""

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

    async def _connect_once(self) -> bool:
        self._link_welcomed = False
        self._link_error = None
        try:
            if self._limiter is not None:
                # bounds simultaneous handshakes, so 15,000 agents (or one hub restart) do not
                # open 15,000 TCP connections in the same millisecond
                await self._limiter.acquire_on_behalf_of(self)
                self._limiter_held = True
            async with self._open_link() as ws:
                with trio.CancelScope() as self._scope:
                    if self._reboot_reason is None:
                        await self._session(ws)
                self._scope = None
                if self._reconnect_after is not None:
                    await ws.aclose(1001, "drained by the hub")  # 1001: going away
                if self._reboot_reason is not None:
                    await self._persist_reboot()
                    await ws.aclose(1012, "rebooting")  # 1012: service restart
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
            log.log(logging.INFO if self._link_welcomed else logging.WARNING, "%s: link %s: %s",
                    self._who(), "lost" if self._link_welcomed else "failed", self._link_failed(exc))
            if isinstance(exc, ConnectionClosed):
                self._closed_with, self._closed_reason = exc.reason.code, exc.reason.reason
                if exc.reason.code != protocol.CLOSE_TOO_BIG and exc.reason.reason:
                    log.warning("%s: the hub closed the link (%d): %s", self._who(), exc.reason.code, exc.reason.reason)
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
            self._stats["links"] += 1
            self._connected_event.set()
            self._release_limiter()
            if self._on_first_welcome is not None:
                self._on_first_welcome, started = None, self._on_first_welcome
                started()
            log.info("%s: linked to %s (boot reason %s)", self._who(), self.link_url, self.boot_reason)
            refusals = self.frames.take_report()
            if refusals:  # what the hub or the agent refused as too big since the last link
                await self.send_event("link.refused", {"refusals": refusals})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.hooks.run, self.hooks.link, self._who())
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
                    payload = {"deviceClock": rfc3339(self.clock.now()), "uptime": round(self.uptime(), 3)}
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

    def _link_failed(self, exc: BaseException) -> str:
        # trio-websocket wraps the OSError that says what went wrong ("connection refused")
        described = f"{exc!r}: {exc.__cause__}" if exc.__cause__ else repr(exc)
        self._stats["link_failures"] += 1
        self._last_error = described
        return described

    def _release_limiter(self) -> None:
        if self._limiter_held:
            self._limiter_held = False
            self._limiter.release_on_behalf_of(self)  # type: ignore[union-attr]
