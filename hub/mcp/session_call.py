"""A session's ``tools/call`` answered as JSON in its own POST's task, through the SDK's single-exchange kernel.

Why: the SDK serves a request of a 2025-era session by handing it from the POST's task to the session's
task, which starts a task for the handler, whose answer goes back through the transport's router to the
POST's task. For a call answered as one JSON body, those four hand-offs were about 0.7 ms of the hub's
CPU per call more than the same call on the stateless revision (py-spy, bench/mcp_rtt.py; docs/mcp.md).
Here the call runs in the POST's task with ``serve_one``, the SDK's kernel for one request (the same
validation, handler and result serialisation), on a connection made from the session's own handshake.

Only what the session would answer the same way comes here (hub/mcp/endpoint.py decides; anything else
goes to the SDK unchanged): a ``tools/call`` with an id and no progress token, on a session whose
``notifications/initialized`` was accepted, carrying the protocol version the session negotiated. The
session's rules are kept:

- the transport counts the POST against the session's idle timer as before (this runs inside it);
- a ``notifications/cancelled`` naming the call cancels it and the call is answered
  ``REQUEST_CANCELLED``, as the SDK answers a cancelled request of this era (``Calls.cancel``);
- a session ended (DELETE, idle timeout) while the call ran cancels it (``Calls.end_session``) and
  answers 500, as the SDK does (hub/mcp/endpoint.py ``AnswerMode``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import trio
from mcp.server.connection import Connection
from mcp.server.runner import serve_one
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp.server.streamable_http import REQUEST_CANCELLED
from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError, JSONRPCResponse
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

log = logging.getLogger("fleethub.mcp")

METHOD = "tools/call"


@dataclass(frozen=True)
class Handshake:
    """What a session's ``initialize`` said, which its calls are served with."""
    version: str              # the protocol version negotiated (the client's, which the server took)
    client_info: Any
    capabilities: Any


def handshake_of(message: dict | None) -> Handshake | None:
    """A session's handshake from its ``initialize`` request: the version it asked for, which the server
    takes when it knows it (otherwise its calls are all left to the SDK), and the client's info and
    capabilities as sent."""
    if message is None or message.get("method") != "initialize" or not isinstance(message.get("params"), dict):
        return None
    params = message["params"]
    version = params.get("protocolVersion")
    if not isinstance(version, str) or version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
    return Handshake(version, params.get("clientInfo"), params.get("capabilities"))


@dataclass
class OneCall:
    """The SDK's dispatch context for one call answered as JSON: nothing can be sent to the client during
    it (a JSON answer has no room for a request or a notification; a call that asked for progress is not
    served here)."""
    transport: TransportContext
    request_id: Any
    message_metadata: ServerMessageMetadata
    cancel_requested: anyio.Event = field(default_factory=anyio.Event)
    can_send_request: bool = False

    async def send_raw_request(self, method: str, params: Mapping[str, Any] | None, opts: Any = None) -> dict:
        raise NoBackChannelError(method)

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: Any = None) -> None:
        return None

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        return None


class Calls:
    """The calls in flight per (session, request id), so that a ``notifications/cancelled`` reaches one."""

    def __init__(self) -> None:
        self._running: dict[tuple[str, Any], tuple[trio.CancelScope, OneCall]] = {}
        self.served = 0  # calls answered here, since the start

    def __len__(self) -> int:
        return len(self._running)

    def end_session(self, session_id: str) -> None:
        """The session ended (DELETE, idle timeout): its calls are cancelled, as the SDK's end of the
        session cancels the handlers it runs in the session's task."""
        for (sid, request_id) in [key for key in self._running if key[0] == session_id]:
            self.cancel(sid, request_id)

    def cancel(self, session_id: str, request_id: Any) -> bool:
        found = self._running.get((session_id, request_id))
        if found is None:
            return False  # finished, or never here: the SDK's dispatcher is told too and ignores what it lacks
        scope, dctx = found
        dctx.cancel_requested.set()
        scope.cancel()
        return True

    async def serve(self, server: Any, lifespan_state: Any, session_id: str, handshake: Handshake,
                    message: Mapping[str, Any], request: Any) -> JSONRPCResponse | JSONRPCError:
        """The call's JSON-RPC answer: its result, its error as the session's dispatcher maps it, or
        ``REQUEST_CANCELLED`` when cancelled."""
        request_id = message["id"]
        key = (session_id, request_id)  # one at a time per id: the endpoint refuses a second in flight
        connection = Connection.from_envelope(handshake.version, handshake.client_info, handshake.capabilities)
        dctx = OneCall(transport=TransportContext(kind="streamable-http", can_send_request=False,
                                                  headers=request.headers),
                       request_id=request_id, message_metadata=ServerMessageMetadata(request_context=request))
        self.served += 1
        with trio.CancelScope() as scope:
            self._running[key] = (scope, dctx)
            try:
                result = await serve_one(server, dctx, METHOD, message.get("params"), connection=connection,
                                         lifespan_state=lifespan_state)
                return JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)
            except Exception as exc:  # noqa: BLE001 — the dispatcher's boundary: every failure is an answer
                error = handler_exception_to_error_data(exc)
                if error is None:  # the SDK's dispatcher would send the exception's text; the hub says nothing of it
                    log.exception("MCP %s failed", METHOD)
                    error = ErrorData(code=INTERNAL_ERROR, message="internal error")
                return JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
            finally:
                del self._running[key]
        return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=REQUEST_CANCELLED,
                                                                           message="Request cancelled"))

