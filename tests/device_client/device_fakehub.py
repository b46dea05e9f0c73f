"""A hub stand-in for agent tests: a real trio-websocket server on 127.0.0.1 speaking the link protocol.

It accepts a link, records the hello and the Authorization header, sends a welcome, and queues every
later frame for the test. Tests drive commands through ``Link.command`` and read events with
``Link.next_event``; frames a test is not waiting for are kept until it asks for them.
"""

from __future__ import annotations

import errno
import itertools
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket, wrap_client_stream, wrap_server_stream

from device_client.shared import protocol


class Link:
    """One accepted device connection, as the hub sees it."""

    def __init__(self, ws: Any, hello: protocol.Hello, authorization: str | None, device_id: str) -> None:
        self.ws = ws
        self.hello = hello
        self.authorization = authorization
        self.device_id = device_id
        self.closed = trio.Event()
        self._send, self._frames = trio.open_memory_channel[Any](1000)
        self._ids = itertools.count(1)
        self._backlog: list[Any] = []

    async def command(self, verb: str, payload: dict | None = None, *, id: str | None = None) -> protocol.Reply:
        cid = id or f"c{next(self._ids)}"
        await self.send_command(verb, payload, id=cid)
        return await self.next_reply(cid)

    async def send_command(self, verb: str, payload: dict | None = None, *, id: str) -> None:
        cmd = protocol.Command(id=id, subject=protocol.subject(self.device_id, verb), payload=payload or {})
        await self.ws.send_message(protocol.encode(cmd))

    async def next_reply(self, command_id: str) -> protocol.Reply:
        return await self._next(lambda f: isinstance(f, protocol.Reply) and f.id == command_id)

    async def next_event(self, kind: str) -> protocol.Event:
        return await self._next(lambda f: isinstance(f, protocol.Event) and f.kind == kind)

    async def _next(self, match) -> Any:
        # frames that do not match wait in the backlog: an event sent just before a reply is not lost
        for i, frame in enumerate(self._backlog):
            if match(frame):
                return self._backlog.pop(i)
        while True:
            frame = await self._frames.receive()
            if match(frame):
                return frame
            self._backlog.append(frame)

    def frames_nowait(self) -> list[Any]:
        out, self._backlog = self._backlog, []
        while True:
            try:
                out.append(self._frames.receive_nowait())
            except trio.WouldBlock:
                return out


class FakeHub:
    def __init__(self, *, heartbeat: float = 30.0, tokens: dict[str, str] | None = None) -> None:
        self.heartbeat = heartbeat
        self.tokens = tokens  # token -> device id; None accepts any token as "dev-1"
        self.reject_status: int | None = None
        self.hub_keys: dict[str, str] = {}  # welcome.hubKeys: kid -> base64 Ed25519 key (tunnel grants)
        self.rejections = 0
        self.port = 0
        self._links_send, self._links = trio.open_memory_channel[Link](1000)
        self.all_links: list[Link] = []
        self.attempts: list[float] = []  # trio.current_time() of each in-memory connect
        self.refuse = 0  # in-memory connects to refuse as a closed port would (OSError), then accept

    def in_memory(self, nursery: trio.Nursery):
        """The agent's ``connector``: a real trio-websocket client and this hub's handler over an
        in-memory stream pair, so a test can run the agent on trio's virtual clock. The hub's end
        lives in ``nursery`` (the test's): a link the agent left still finishes its close handshake."""

        @asynccontextmanager
        async def connect(headers: list[tuple[bytes, bytes]]):
            self.attempts.append(trio.current_time())
            if self.refuse > 0:
                self.refuse -= 1
                raise OSError(errno.ECONNREFUSED, "connection refused (in memory)")
            client, server = trio.testing.memory_stream_pair()

            async def serve() -> None:
                await self._handle(await wrap_server_stream(nursery, server))

            nursery.start_soon(serve)
            error: Exception | None = None
            try:
                async with trio.open_nursery() as ours:
                    ws = await wrap_client_stream(ours, client, "hub.test", protocol.LINK_PATH,
                                                  extra_headers=headers)
                    try:
                        yield ws
                    except Exception as exc:  # raised outside the nursery, so the agent sees it ungrouped
                        error = exc
                    finally:
                        ours.cancel_scope.cancel()
                        await client.aclose()  # the hub's end reads the end of the stream
            except BaseExceptionGroup as group:  # the handshake failed in the reader (a 401): ungrouped too
                leaves = group.exceptions
                if len(leaves) == 1 and isinstance(leaves[0], Exception):
                    raise leaves[0] from None
                raise
            if error is not None:
                raise error

        return connect

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve_websocket, self._handle, "127.0.0.1", 0, None)
            self.port = server.port
            task_status.started(self)

    async def next_link(self) -> Link:
        return await self._links.receive()

    async def _handle(self, request: WebSocketRequest) -> None:
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        auth = headers.get("authorization")
        if request.path != protocol.LINK_PATH:
            await request.reject(404)
            return
        if self.reject_status is not None:
            self.rejections += 1
            await request.reject(self.reject_status)
            return
        token = auth.removeprefix("Bearer ") if auth else ""
        device_id = "dev-1" if self.tokens is None else self.tokens.get(token)
        if device_id is None:
            await request.reject(401)
            return
        ws = await request.accept()
        hello = protocol.decode(await ws.get_message())
        assert isinstance(hello, protocol.Hello), hello
        await ws.send_message(protocol.encode(protocol.Welcome(deviceId=device_id, heartbeatInterval=self.heartbeat,
                                                          hubKeys=self.hub_keys)))
        link = Link(ws, hello, auth, device_id)
        self.all_links.append(link)
        await self._links_send.send(link)
        try:
            while True:
                await link._send.send(protocol.decode(await ws.get_message()))
        except ConnectionClosed:
            pass
        finally:
            link.closed.set()
