"""The answers written with orjson (hub/mcp/answers.py ``result_body``), as JSON and as SSE events, on
the stateless entry (``answer_writer``, ``event_framer``) and a session's transport (hub/mcp/endpoint.py
``AnswerMode``): a result is the answer the SDK's own writer gives, the same once parsed, with the same
status and headers; what orjson cannot write, and every error, is still written by the SDK's writer.
No hub, no IO."""

from __future__ import annotations

import json

from mcp.server.streamable_http import EventMessage, StreamableHTTPServerTransport
from mcp_types import METHOD_NOT_FOUND, ErrorData, JSONRPCError, JSONRPCNotification, JSONRPCResponse

from hub.mcp import answers, endpoint

SCOPE = {"type": "http", "method": "POST", "path": "/v1/mcp", "headers": []}


async def written(writer, msg) -> tuple[int, bytes, object]:
    """(status, content type, the body parsed); the content length is checked against the body here,
    since it differs (orjson writes UTF-8 where json escapes to ASCII)."""
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.disconnect"}
    await writer(msg, SCOPE, receive, send)
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    headers = dict(start["headers"])
    assert int(headers[b"content-length"]) == len(body)
    assert set(headers) == {b"content-length", b"content-type"}
    return start["status"], headers[b"content-type"], json.loads(body)


def page() -> dict:
    devices = [{"id": f"00000000-0000-4000-8000-{i:012d}", "name": f"pump-{i} ünï \"q\" \\ \u2028",
                "online": i % 2 == 0, "lastSeen": None, "labels": {"site": "b", "n": i}, "load": i / 3}
               for i in range(20)]
    body = {"data": devices, "pagination": {"page": 1, "limit": 20, "total": 20, "totalPages": 1}}
    return {"content": [{"type": "text", "text": json.dumps(body)}], "structuredContent": body,
            "isError": False, "resultType": "complete",
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "fleethub", "version": "1"}}}


async def test_the_entrys_writers_are_wrapped_once():
    assert answers.single_exchange is not None  # the SDK this project pins has the entry
    # installed once, on import: wrapping the wrapped would write nothing twice but cost a call
    for wrapped in (answers.single_exchange._write, answers.single_exchange._sse_event):  # noqa: SLF001
        assert not hasattr(wrapped.sdk_own, "sdk_own")


async def test_a_result_is_the_answer_the_sdks_writer_gives():
    sdk = answers.single_exchange._write.sdk_own  # noqa: SLF001
    ours = answers.answer_writer(sdk)
    for request_id in (7, "req-α"):
        msg = JSONRPCResponse(jsonrpc="2.0", id=request_id, result=page())
        assert await written(ours, msg) == await written(sdk, msg)


async def test_errors_and_what_orjson_refuses_go_to_the_sdks_writer():
    calls: list[object] = []
    sdk = answers.single_exchange._write.sdk_own  # noqa: SLF001

    async def counting(msg, scope, receive, send):
        calls.append(msg)
        await sdk(msg, scope, receive, send)
    ours = answers.answer_writer(counting)
    error = JSONRPCError(jsonrpc="2.0", id=3, error=ErrorData(code=METHOD_NOT_FOUND, message="no such method"))
    status, _, body = await written(ours, error)
    assert calls == [error] and status == (await written(sdk, error))[0] and body["error"]["code"] == METHOD_NOT_FOUND
    huge = JSONRPCResponse(jsonrpc="2.0", id=4, result={"structuredContent": {"n": 2**70}, "content": []})
    status, _, body = await written(ours, huge)
    assert calls[-1] is huge and status == 200 and body["result"]["structuredContent"]["n"] == 2**70


async def answered(response) -> tuple[int, dict[bytes, bytes], object]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.disconnect"}
    await response(SCOPE, receive, send)
    body = b"".join(m.get("body", b"") for m in sent[1:])
    headers = {k: v for k, v in sent[0]["headers"] if k != b"content-length"}
    assert int(dict(sent[0]["headers"])[b"content-length"]) == len(body)
    return sent[0]["status"], headers, json.loads(body)


async def test_a_sessions_json_answer_is_the_one_the_sdks_transport_gives(monkeypatch):
    ours = endpoint.AnswerMode("session-1", is_json_response_enabled=True)
    sdk = StreamableHTTPServerTransport("session-1", is_json_response_enabled=True)
    result = JSONRPCResponse(jsonrpc="2.0", id=9, result=page())
    error = JSONRPCError(jsonrpc="2.0", id=9, error=ErrorData(code=METHOD_NOT_FOUND, message="no such method"))
    for msg in (result, error):
        mine, theirs = ours._create_json_response(msg), sdk._create_json_response(msg)  # noqa: SLF001
        assert await answered(mine) == await answered(theirs)
    written_by_sdk: list[object] = []
    original = StreamableHTTPServerTransport._create_json_response  # noqa: SLF001

    def counting(self, msg, *args, **kwargs):
        written_by_sdk.append(msg)
        return original(self, msg, *args, **kwargs)
    monkeypatch.setattr(StreamableHTTPServerTransport, "_create_json_response", counting)
    ours._create_json_response(result)  # noqa: SLF001
    ours._create_json_response(error)  # noqa: SLF001
    assert written_by_sdk == [error]


def sse_data(frame: bytes) -> object:
    """The JSON of one SSE ``message`` event, its framing checked."""
    text = frame.decode()
    assert text.startswith("event: message\r\ndata: ") and text.endswith("\r\n\r\n")
    return json.loads(text[len("event: message\r\ndata: "):-4])


async def test_an_sse_answer_is_the_event_the_sdk_gives():
    """A call that asked for progress gets its answer as an SSE event after its notifications."""
    sdk = answers.single_exchange._sse_event.sdk_own  # noqa: SLF001
    ours = answers.single_exchange._sse_event  # noqa: SLF001
    result = JSONRPCResponse(jsonrpc="2.0", id=5, result=page())
    progress = JSONRPCNotification(jsonrpc="2.0", method="notifications/progress",
                                   params={"progressToken": 1, "progress": 0.5})
    error = JSONRPCError(jsonrpc="2.0", id=5, error=ErrorData(code=METHOD_NOT_FOUND, message="no such method"))
    for msg in (result, progress, error):
        assert sse_data(ours(msg)) == sse_data(sdk(msg))
    assert ours(progress) == sdk(progress) and ours(error) == sdk(error)  # framed by the SDK's, byte for byte

    session, plain = endpoint.AnswerMode("s", is_json_response_enabled=False), StreamableHTTPServerTransport("s")
    for msg in (result, progress, error):
        for event_id in (None, "7"):
            mine = session._create_event_data(EventMessage(msg, event_id))  # noqa: SLF001
            theirs = plain._create_event_data(EventMessage(msg, event_id))  # noqa: SLF001
            assert {**mine, "data": json.loads(mine["data"])} == {**theirs, "data": json.loads(theirs["data"])}
