"""A successful MCP answer written by orjson in one pass, where the SDK's writers walk it twice.

The SDK writes a JSON-RPC answer by dumping its reply model (a walk of the whole result) and, on the
stateless entry, then that dump with the json module (a second walk). A result is in its wire form when
it gets to a writer (the SDK's runner serialised it), and for a page of devices, whose text content is
the page's JSON once more, those walks cost a stateless list 0.45 ms of the hub's 8.5 (py-spy, the list
of bench/mcp_rtt.py; docs/mcp.md, Measured). ``result_body`` writes the same JSON in one pass.

Used by a session's transport (hub/mcp/endpoint.py ``AnswerMode``) and, wrapped around the SDK's own on
import, by the stateless entry's two writers (``answer_writer``, ``event_framer``): module-level
functions that the entry looks up at each call. What ``result_body`` does not write (an error, whose
status and body the SDK's tables give; a notification; a result orjson refuses) the SDK's writers write.
"""

from __future__ import annotations

from typing import Any

import orjson
from mcp_types import JSONRPCResponse

try:  # the SDK's single-exchange entry (private to it), whose writers are wrapped below
    from mcp.server import _streamable_http_modern as single_exchange
except ImportError:  # pragma: no cover — another SDK version: its own writers stay
    single_exchange = None


def result_body(msg: Any) -> bytes | None:
    """A successful JSON-RPC answer's body written by orjson, or None for anything else: an error, a
    notification, or a result orjson refuses (a key that is not a string, an integer past 64 bits)."""
    if not isinstance(msg, JSONRPCResponse):
        return None
    try:
        return orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "result": msg.result})
    except TypeError:
        return None


def answer_writer(sdk_write: Any) -> Any:
    """The single-exchange entry's writer of a JSON answer, with a result written by ``result_body`` and
    the status (200) and headers the SDK's writer gives; the rest written by the SDK's."""
    async def write(msg: Any, scope: dict, receive: Any, send: Any) -> None:
        body = result_body(msg)
        if body is None:
            await sdk_write(msg, scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
    write.sdk_own = sdk_write
    return write


def event_framer(sdk_event: Any) -> Any:
    """The single-exchange entry's SSE frame of a message (an answer to a call that asked for progress,
    after its notifications), with a result written by ``result_body`` in the SDK's framing; a
    notification or an error framed by the SDK's."""
    def frame(msg: Any) -> bytes:
        body = result_body(msg)
        if body is None:
            return sdk_event(msg)
        return b"event: message\r\ndata: " + body + b"\r\n\r\n"
    frame.sdk_own = sdk_event
    return frame


# Installed once, on import, where the entry calls them (module-level functions it looks up at each
# call); an SDK without them keeps its own.
if hasattr(single_exchange, "_write") and hasattr(single_exchange, "_sse_event"):
    if not hasattr(single_exchange._write, "sdk_own"):  # noqa: SLF001
        single_exchange._write = answer_writer(single_exchange._write)  # noqa: SLF001
    if not hasattr(single_exchange._sse_event, "sdk_own"):  # noqa: SLF001
        single_exchange._sse_event = event_framer(single_exchange._sse_event)  # noqa: SLF001
