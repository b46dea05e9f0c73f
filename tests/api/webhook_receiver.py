"""A webhook receiver for tests and benches: HTTP/1.1 (h11) on 127.0.0.1, in the caller's trio run.

Every request is kept (method, path, headers, body, trio time); ``answer(request)`` decides the
status (200 unless told), so a test can fail deliveries, redirect, or answer slowly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import trio


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    port: int = 0
    requests: list[Request] = field(default_factory=list)
    answer: Callable[[Request], Awaitable[int] | int] = lambda _r: 200
    extra_headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            with trio.move_on_after(30):
                while True:
                    request, body = None, bytearray()
                    while True:
                        event = conn.next_event()
                        if event is h11.NEED_DATA:
                            data = await stream.receive_some(65536)
                            conn.receive_data(data)
                            if not data:
                                return
                            continue
                        if isinstance(event, h11.Request):
                            request = event
                        elif isinstance(event, h11.Data):
                            body += event.data
                        elif isinstance(event, h11.EndOfMessage):
                            break
                        elif isinstance(event, h11.ConnectionClosed):
                            return
                    req = Request(request.method.decode(), request.target.decode(),
                                  {k.decode().lower(): v.decode() for k, v in request.headers}, bytes(body),
                                  trio.current_time())
                    self.requests.append(req)
                    status = self.answer(req)
                    if not isinstance(status, int):
                        status = await status
                    payload = b"ok" if status < 300 else b"no"
                    headers = [("content-length", str(len(payload))), *self.extra_headers]
                    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
                    await stream.send_all(conn.send(h11.Data(data=payload)))
                    await stream.send_all(conn.send(h11.EndOfMessage()))
                    if conn.our_state is h11.MUST_CLOSE:
                        return
                    conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            return
        finally:
            await stream.aclose()
