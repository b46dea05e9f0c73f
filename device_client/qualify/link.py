"""The kit's hub side: a WebSocket server at /v1/device/link that hands each device connection to the
scenarios, with every frame the device sends, parsed or not, and the time it arrived."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

from ..shared import protocol


@dataclass
class Received:
    at: float  # trio time
    text: str
    frame: Any = None  # the decoded frame, or None
    error: str | None = None  # why it did not decode
    taken: bool = False  # consumed by Conn.next


@dataclass
class Conn:
    """One device connection as the kit sees it."""
    ws: Any
    authorization: str | None
    opened_at: float
    device_id: str
    frames: list[Received] = field(default_factory=list)  # everything, in order
    heartbeats: list[Received] = field(default_factory=list)
    hello: Any = None  # the hello, once the handshake read it
    close_code: int | None = None
    close_reason: str = ""
    closed_at: float | None = None
    closed: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)  # the scenarios are finished with it
    _arrived: trio.Event = field(default_factory=trio.Event)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    async def read(self) -> None:
        try:
            while True:
                text = await self.ws.get_message()
                got = Received(trio.current_time(), text if isinstance(text, str) else text.decode(errors="replace"))
                try:
                    got.frame = protocol.decode(text)
                except protocol.ProtocolError as exc:
                    got.error = str(exc)
                if isinstance(got.frame, protocol.Event) and got.frame.kind == "heartbeat":
                    self.heartbeats.append(got)
                self.frames.append(got)
                self._wake()
        except ConnectionClosed as exc:
            self.close_code, self.close_reason = exc.reason.code, exc.reason.reason or ""
        finally:
            self.closed_at = trio.current_time()
            self.closed.set()
            self._wake()

    def _wake(self) -> None:
        self._arrived.set()
        self._arrived = trio.Event()

    async def next(self, match: Callable[[Received], bool], timeout: float) -> Received | None:
        """The first frame not yet taken that ``match``es, waiting up to ``timeout``; None if none came."""
        with trio.move_on_after(timeout):
            while True:
                for got in self.frames:
                    if not got.taken and match(got):
                        got.taken = True
                        return got
                if self.closed.is_set():
                    return None
                await self._arrived.wait()
        return None

    async def send_text(self, text: str) -> bool:
        try:
            await self.ws.send_message(text)
            return True
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            return False

    def new_id(self) -> str:
        return f"q{next(self._ids)}-{int(self.opened_at * 1000) % 100000}"

    async def command(self, verb: str, payload: dict[str, Any] | None = None, *, id: str | None = None,
                      timeout: float = 15.0, addressee: str | None = None) -> protocol.Reply | None:
        """Send a command and wait for its reply (None: no reply within ``timeout``)."""
        cid = id or self.new_id()
        await self.send_command(verb, payload, id=cid, addressee=addressee)
        return await self.reply(cid, timeout)

    async def send_command(self, verb: str, payload: dict[str, Any] | None, *, id: str,
                           addressee: str | None = None) -> bool:
        cmd = protocol.Command(id=id, subject=protocol.subject(addressee or self.device_id, verb), payload=payload or {})
        return await self.send_text(protocol.encode(cmd, limit=1 << 30))

    async def reply(self, cid: str, timeout: float = 15.0) -> protocol.Reply | None:
        got = await self.next(lambda r: isinstance(r.frame, protocol.Reply) and r.frame.id == cid, timeout)
        return got.frame if got else None

    async def event(self, kind: str, timeout: float) -> protocol.Event | None:
        got = await self.next(lambda r: isinstance(r.frame, protocol.Event) and r.frame.kind == kind, timeout)
        return got.frame if got else None

    async def close(self, code: int, reason: str) -> float:
        """Close the link with ``code``; returns the instant the close frame went out, from which a
        device's time away is measured. ``aclose`` then waits for the device's closing handshake, which
        can take long (in one run trio-websocket's took 30 s, until the device's next handshake): a
        time taken after it would make a device that stayed away look as if it came straight back."""
        sent_at = trio.current_time()
        with trio.move_on_after(5):
            try:
                await self.ws.aclose(code, reason)
            except Exception:  # noqa: BLE001 — already gone is as good as closed
                pass
        with trio.move_on_after(5):
            await self.closed.wait()
        return sent_at


class Listener:
    """Accepts devices at ``/v1/device/link``; ``next_conn`` gives each one with its first frame read."""

    def __init__(self, host: str, port: int, *, token: str | None, device_id: str) -> None:
        self.host, self.port = host, port
        self.token = token
        self.device_id = device_id
        self.refused: list[str] = []  # why handshakes were refused
        self._send, self._conns = trio.open_memory_channel[Conn](16)
        # the next handshakes to answer 401 whatever the token (a revoked token), and when each came
        self.refuse_next = 0
        self._refusal_sent, self._refusals = trio.open_memory_channel[float](16)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial_serve(self._handle, self.host, self.port))
            self.port = server.port
            task_status.started(self)

    async def next_conn(self, timeout: float) -> Conn | None:
        with trio.move_on_after(timeout):
            return await self._conns.receive()
        return None

    async def next_refusal(self, timeout: float) -> float | None:
        """When the next handshake ``refuse_next`` answered 401 came; None if none within ``timeout``."""
        with trio.move_on_after(timeout):
            return await self._refusals.receive()
        return None

    async def _handle(self, request: WebSocketRequest) -> None:
        if self.refuse_next > 0 and request.path == protocol.LINK_PATH:
            self.refuse_next -= 1
            at = trio.current_time()
            await request.reject(401, body=b'{"error": "unauthorized", "message": "qualification: a revoked token"}')
            await self._refusal_sent.send(at)
            return
        if request.path != protocol.LINK_PATH:
            self.refused.append(f"HTTP 404: path {request.path!r} (expected {protocol.LINK_PATH})")
            await request.reject(404)
            return
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        auth = headers.get("authorization")
        scheme, _, value = (auth or "").partition(" ")
        if scheme.lower() != "bearer" or not value.strip() or (self.token is not None and value.strip() != self.token):
            self.refused.append("HTTP 401: " + ("no Authorization: Bearer header" if not auth else "a token other than --token"))
            await request.reject(401)
            return
        ws = await request.accept()
        conn = Conn(ws, auth, trio.current_time(), self.device_id)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.read)
            await self._send.send(conn)
            await conn.done.wait()
            nursery.cancel_scope.cancel()
        try:
            await ws.aclose(1000, "qualification finished")
        except Exception:  # noqa: BLE001
            pass


def partial_serve(handler, host: str, port: int):
    async def run(task_status=trio.TASK_STATUS_IGNORED):
        await serve_websocket(handler, host, port, None, max_message_size=4 * protocol.MAX_FRAME_BYTES,
                              task_status=task_status)
    return run


def short(value: Any, limit: int = 160) -> str:
    """Evidence: the value as compact JSON, cut at ``limit`` characters."""
    try:
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
