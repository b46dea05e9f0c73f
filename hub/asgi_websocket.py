"""A WebSocket served straight on ASGI, for the device link (hub/api/link.py).

Why not Quart's: for each WebSocket, Quart-Trio starts a nursery with two tasks (one copies
hypercorn's events into its own memory channel, one runs the handler), builds a Websocket wrapper
with a copy of the headers, and pushes a websocket context (g, session). A device link lives for
days and there are tens of thousands of them: measured with bench/_bare_app.py's two echo routes
(5,000 links each, VmRSS), a Quart WebSocket costs 38.1 KiB and the same echo on plain ASGI 22.9 KiB.
The link needs none of what the difference buys: no before/after hooks run for WebSockets, and the
link authenticates, routes and reports errors itself.

So ``HubApp`` (hub/app.py) takes the link's path before Quart does and the handler gets an
``AsgiWebSocket``: hypercorn's ``receive`` and ``send`` and the few calls the link makes. It reads
the socket in the handler's own task, so there is no task but hypercorn's per connection.

What that changes, and how it is kept: Quart cancelled the handler the moment the peer went away;
here the handler hears it from ``receive()`` (``Disconnected``). The link only waits elsewhere for
bounded times (room in its actor's mailbox, the takeover hold-back, which uses ``hold`` to notice
the peer leaving).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from device_client.shared.linkcodes import Close, bounded_reason
from hub.errors import FleethubError, database_unavailable, general_body
from storage.db import DatabaseUnavailable

log = logging.getLogger("fleethub.link")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Disconnected(Exception):
    """The peer closed the WebSocket (or the connection dropped); ``code`` is the close code it sent."""

    def __init__(self, code: int | None) -> None:
        super().__init__(f"the peer closed the WebSocket ({code})")
        self.code = code


class AsgiWebSocket:
    """One ASGI WebSocket connection: read, write, accept, refuse and close it.

    Not safe for two tasks to ``receive`` at once (one reader, the handler); ``send`` may be called
    from other tasks if the caller serialises its sends (the link holds a lock)."""

    __slots__ = ("_early", "_receive", "_scope", "_send", "accepted", "closed")

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._scope = scope
        self._receive = receive
        self._send = send
        self._early: str | bytes | None = None  # a frame read by ``hold``, handed out by the next receive
        self.accepted = False
        self.closed = False  # by us (close, refuse) or by the peer (Disconnected)

    def header(self, name: str) -> str | None:
        """The first request header of that name (case-insensitive), decoded as latin-1."""
        wanted = name.lower().encode("latin-1")
        for key, value in self._scope.get("headers", ()):
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None

    @property
    def remote_addr(self) -> str | None:
        client = self._scope.get("client")
        return client[0] if client else None

    async def accept(self) -> None:
        await self._send({"type": "websocket.accept", "subprotocol": None, "headers": []})
        self.accepted = True

    async def receive(self) -> str | bytes:
        """The next frame: str for a text frame, bytes for a binary one. Raises ``Disconnected``."""
        if self._early is not None:
            message, self._early = self._early, None
            return message
        while True:  # in this frame, not a helper's: a coroutine frame per waiting link is memory per device
            event = await self._receive()
            kind = event["type"]
            if kind == "websocket.receive":
                data = event.get("bytes")
                return data if data is not None else event.get("text") or ""
            if kind == "websocket.disconnect":
                self.closed = True
                raise Disconnected(event.get("code"))
            # websocket.connect, before accept: the only other event ASGI defines

    async def hold(self, seconds: float) -> None:
        """Wait ``seconds`` but hear the peer leave meanwhile (``Disconnected``), as Quart's handler
        was cancelled. A frame that arrives meanwhile is kept for the next ``receive``."""
        with trio.move_on_after(seconds):
            if self._early is None:
                self._early = await self.receive()
            await trio.sleep(seconds)  # a frame came early: the rest of the wait without reading more

    async def send(self, data: str | bytes) -> None:
        if self.closed:
            return  # as hypercorn does once the stream is gone: the caller learns it from receive
        if isinstance(data, str):
            await self._send({"type": "websocket.send", "text": data, "bytes": None})
        else:
            await self._send({"type": "websocket.send", "bytes": data, "text": None})

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        await self._send({"type": "websocket.close", "code": code, "reason": reason})

    async def refuse(self, status: int, body: dict[str, Any]) -> None:
        """Answer the upgrade with an HTTP error and a JSON body instead of accepting it (the ASGI
        ``websocket.http.response`` extension, which hypercorn has; without it, a plain 403)."""
        self.closed = True
        if "websocket.http.response" not in (self._scope.get("extensions") or {}):
            await self._send({"type": "websocket.close", "code": 1000})
            return
        payload = json.dumps(body).encode()
        await self._send({"type": "websocket.http.response.start", "status": status,
                          "headers": [(b"content-type", b"application/json"),
                                      (b"content-length", str(len(payload)).encode())]})
        await self._send({"type": "websocket.http.response.body", "body": payload, "more_body": False})


async def serve(handler: Callable[[AsgiWebSocket], Awaitable[None]], scope: Scope, receive: Receive,
                send: Send) -> None:
    """Run ``handler`` on one connection and end it as a WebSocket should end, whatever happens: the
    peer leaving ends it quietly; a handler that returns leaves a socket it did not close closed with
    1000; an error stays in this connection. One of the hub's errors (hub/errors.py; the database
    unreachable is 503 database_unavailable) is answered with its status and body before the upgrade,
    1011 and its message after it, and logged in a line; anything else is logged with its traceback
    and answered 500 or 1011 "internal error" (what Quart did)."""
    ws = AsgiWebSocket(scope, receive, send)
    try:
        await handler(ws)
    except Disconnected:
        return
    except Exception as exc:  # noqa: BLE001 — the boundary of one connection: nothing gets past it
        error = database_unavailable() if isinstance(exc, DatabaseUnavailable) else exc
        if isinstance(error, FleethubError):
            log.warning("WebSocket %s from %s: %d %s: %s", scope.get("path"), ws.remote_addr, error.status,
                        error.code, error.message)
        else:
            log.exception("the WebSocket handler for %s failed", scope.get("path"))
            error = FleethubError("internal error")  # its text stays in the log
        with trio.move_on_after(2) as closing:
            closing.shield = True
            try:
                if not ws.accepted:
                    await ws.refuse(error.status, general_body(error))
                else:
                    # a close reason is at most 123 bytes
                    await ws.close(Close.INTERNAL_ERROR, bounded_reason(error.message))
            except Exception as exc:  # noqa: BLE001 — the connection is gone as well: nothing left to tell
                log.debug("could not end the failed WebSocket: %r", exc)
        return
    if not ws.closed:
        await ws.close(1000)
