"""hub/asgi_websocket.py on the ASGI messages themselves: what the device link's socket does at each
edge (the peer leaving, a refusal, an error in the handler, a frame during a hold-back). The link
over real hypercorn and real agents is tests/api/test_link*.py; here the server's side of ASGI is a
pair of lists, so each edge is exact and fast (virtual clock)."""

from __future__ import annotations

import json

import pytest
import trio

from hub import asgi_websocket
from hub.asgi_websocket import AsgiWebSocket, Disconnected
from hub.errors import Unavailable
from storage.db import DatabaseUnavailable

HTTP_RESPONSE = {"websocket.http.response": {}}


class Server:
    """What hypercorn gives an ASGI app: a receive callable fed from a channel, a send callable that
    records what the app sent."""

    def __init__(self, extensions: dict | None = None) -> None:
        self.to_app, self._from_server = trio.open_memory_channel(10)
        self.sent: list[dict] = []
        self.scope = {"type": "websocket", "path": "/v1/device/link", "client": ("10.0.0.7", 5000),
                      "headers": [(b"host", b"hub"), (b"authorization", b"Bearer dev_abc")],
                      "extensions": extensions if extensions is not None else dict(HTTP_RESPONSE)}

    async def receive(self) -> dict:
        return await self._from_server.receive()

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def ws(self) -> AsgiWebSocket:
        return AsgiWebSocket(self.scope, self.receive, self.send)

    def types(self) -> list[str]:
        return [m["type"] for m in self.sent]


async def test_headers_address_frames_and_the_peer_leaving():
    server = Server()
    ws = server.ws()
    assert ws.header("AUTHORIZATION") == "Bearer dev_abc" and ws.header("x-missing") is None
    assert ws.remote_addr == "10.0.0.7"
    await server.to_app.send({"type": "websocket.connect"})
    await ws.accept()
    await server.to_app.send({"type": "websocket.receive", "text": "hello"})
    await server.to_app.send({"type": "websocket.receive", "bytes": b"\x00\x01"})
    await server.to_app.send({"type": "websocket.receive", "bytes": b""})  # an empty binary frame stays bytes
    assert await ws.receive() == "hello"  # the connect event before it is skipped
    assert await ws.receive() == b"\x00\x01"
    assert await ws.receive() == b""
    await server.to_app.send({"type": "websocket.disconnect", "code": 1006})
    with pytest.raises(Disconnected) as gone:
        await ws.receive()
    assert gone.value.code == 1006 and ws.closed
    await ws.send("too late")  # a send after the peer left is dropped, as hypercorn drops it
    await ws.close(4002, "late")  # and so is a close
    assert server.types() == ["websocket.accept"]


async def test_a_refusal_is_an_http_answer_with_a_json_body():
    server = Server()
    ws = server.ws()
    await ws.refuse(401, {"error": "unauthenticated", "message": "no"})
    start, body = server.sent
    assert start["type"] == "websocket.http.response.start" and start["status"] == 401
    assert dict(start["headers"])[b"content-type"] == b"application/json"
    assert int(dict(start["headers"])[b"content-length"]) == len(body["body"])
    assert json.loads(body["body"]) == {"error": "unauthenticated", "message": "no"} and not body["more_body"]


async def test_a_server_without_the_http_response_extension_gets_a_close():
    server = Server(extensions={})
    await server.ws().refuse(401, {"error": "unauthenticated", "message": "no"})
    assert server.sent == [{"type": "websocket.close", "code": 1000}]  # hypercorn answers that 403


async def test_hold_hears_the_peer_leave(autojump_clock):
    server = Server()
    ws = server.ws()
    async with trio.open_nursery() as nursery:
        async def leave_soon():
            await trio.sleep(1)
            await server.to_app.send({"type": "websocket.disconnect", "code": 1001})
        nursery.start_soon(leave_soon)
        started = trio.current_time()
        with pytest.raises(Disconnected):
            await ws.hold(30)
        assert trio.current_time() - started == pytest.approx(1)


async def test_hold_keeps_a_frame_that_came_early_and_waits_the_whole_time(autojump_clock):
    server = Server()
    ws = server.ws()
    await server.to_app.send({"type": "websocket.receive", "text": "early"})
    await server.to_app.send({"type": "websocket.receive", "text": "later"})
    started = trio.current_time()
    await ws.hold(5)
    assert trio.current_time() - started == pytest.approx(5)
    assert await ws.receive() == "early"
    assert await ws.receive() == "later"


async def test_serve_closes_what_the_handler_left_open():
    server = Server()

    async def handler(ws):
        await ws.accept()

    await asgi_websocket.serve(handler, server.scope, server.receive, server.send)
    assert server.sent[-1] == {"type": "websocket.close", "code": 1000, "reason": ""}


async def test_serve_ends_quietly_when_the_peer_left():
    server = Server()

    async def handler(ws):
        await ws.accept()
        await ws.receive()

    await server.to_app.send({"type": "websocket.disconnect", "code": 1000})
    await asgi_websocket.serve(handler, server.scope, server.receive, server.send)
    assert server.types() == ["websocket.accept"]


@pytest.mark.parametrize("error, status, code", [
    (DatabaseUnavailable("the database is not reachable (TimeoutError)"), 503, "database_unavailable"),
    (Unavailable("busy", code="busy"), 503, "busy"),
    (RuntimeError("a bug, with a secret: hunter2"), 500, "internal"),
])
async def test_serve_answers_an_error_before_the_upgrade_with_its_status(error, status, code, caplog):
    server = Server()

    async def handler(ws):
        raise error

    await asgi_websocket.serve(handler, server.scope, server.receive, server.send)
    start, body = server.sent
    assert start["status"] == status and json.loads(body["body"])["error"] == code
    assert "hunter2" not in body["body"].decode()  # an unexpected error's text stays in the log
    # the hub's own errors are a line in the log; anything else, with its traceback
    assert ("Traceback" in caplog.text) == (status == 500), caplog.text


async def test_serve_closes_1011_after_the_upgrade_and_the_error_stays_in_this_connection():
    server = Server()

    async def handler(ws):
        await ws.accept()
        raise DatabaseUnavailable("pool exhausted")

    await asgi_websocket.serve(handler, server.scope, server.receive, server.send)
    assert server.sent[-1]["type"] == "websocket.close" and server.sent[-1]["code"] == 1011
    assert "database" in server.sent[-1]["reason"]
    assert len(server.sent[-1]["reason"].encode()) <= 123
