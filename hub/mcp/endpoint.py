"""``/v1/mcp``: the Streamable HTTP endpoint in front of the SDK's session manager.

Served as plain ASGI by ``HubApp`` (hub/app.py), not as a Quart view: the SDK's transport is an
ASGI app that holds a POST's answer open as an SSE stream and a GET open for the session's life.
What Quart's hooks would do for it is done here, before the SDK sees the request:

- authentication with the API's bearer credentials (a service-account token, a PAT in its bearer
  form, or the X-API-Token-ID/X-API-Secret-Key pair); no cookie, so no browser page can drive it.
  Without one the answer is 401 with ``WWW-Authenticate: Bearer resource_metadata=...`` (RFC 9728);
- the organisation (X-Organization-ID, optional here: a tool may name it) and membership of it;
- the rate limit: each MCP HTTP request counts one against the organisation's budget, as any API
  request does (the REST request a tool makes inside is not counted again: hub/mcp/inproc.py);
- sessions: at most ``MAX_SESSIONS_PER_OWNER`` open per organisation (per caller without one), as
  SSE streams are bounded per owner, and a session answers only the credential that opened it.

How a POST is answered: a request that asked for progress (a ``progressToken`` in its ``_meta``)
gets an SSE stream, which carries its ``notifications/progress`` before its answer; any other request
gets a single JSON body. The SDK fixes one of the two per session manager: SSE for all costs every
call an event stream's framing and the tasks that feed it (bench/mcp_rtt.py measured both), and JSON
for all drops a request's notifications. ``AnswerMode`` makes the choice per request.

A session's ``tools/call`` that is answered as JSON runs in its own POST's task (hub/mcp/session_call.py),
not through the session's tasks, when the session would answer it the same way (``_session_message``
says when); everything else goes the SDK's way.

A request of the stateless revision (2026-07-28: no handshake, no session; the SDK's ``mcp.Client``
negotiates it by default) is told apart as the SDK tells it, by a protocol-version header that no
handshake revision has. It is authenticated and counted the same way, opens no session, and is
bounded per organisation while in flight (``_stateless``).

Sessions live in this process (the SDK keeps them in memory): in a cluster the balancer pins a
session to its node by the ``Mcp-Session-Id`` header (docs/cluster.md).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import trio
from pydantic import ValidationError
from mcp.server.streamable_http import StreamableHTTPServerTransport, check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
try:  # the SDK's single-exchange entry (private to it): without it, the manager's own routing serves
    from mcp.server._streamable_http_modern import handle_modern_request
except ImportError:  # pragma: no cover — another SDK version
    handle_modern_request = None
from mcp_types import INTERNAL_ERROR, JSONRPCRequest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.responses import Response

from hub.auth.ratelimit import spend
from hub.auth.schemes import header_credential
from hub.errors import (BadRequest, Conflict, FleethubError, Forbidden, NotFound, RateLimited, Unauthenticated,
                        general_body)
from hub.mcp import server
from hub.mcp.answers import result_body
from hub.mcp.bodies import json_answer, parsed, read_body, replaying, request_key
from hub.mcp.session_call import Calls, Handshake, handshake_of

if TYPE_CHECKING:
    from hub.mcp.server import McpHost

PATH = "/v1/mcp"
METADATA_PATH = "/.well-known/oauth-protected-resource"
MAX_SESSIONS_PER_OWNER = 64
MAX_SESSIONS = 4096
IDLE_SECONDS = 15 * 60
MAX_BODY_BYTES = 256 * 1024  # a JSON-RPC message; tool arguments are far smaller (hub/mcp/tools.py)
SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"


@dataclass(frozen=True)
class Caller:
    owner: tuple[str, Any]   # what its sessions count against: ("org", id) or ("principal", id)
    fingerprint: bytes        # its credential, hashed: a session answers only the one that opened it
    ratelimit: Any            # the rate-limit decision, whose headers the answer carries


# Set by McpEndpoint for the task that serves one POST of an open session: True when its answer is a
# JSON body. Unset (None) elsewhere: the session's own tasks (its message router) and the opening request.
_JSON_ANSWER: contextvars.ContextVar[bool | None] = contextvars.ContextVar("fleethub_mcp_json_answer", default=None)


@dataclass(frozen=True)
class SessionCall:
    """A session's ``tools/call`` that its POST's task may answer itself (hub/mcp/session_call.py), as the
    endpoint found it; ``serve(request)`` gives the answer."""
    endpoint: "McpEndpoint"
    session_id: str
    handshake: Handshake
    message: dict

    async def serve(self, request: Any) -> Any:
        manager = self.endpoint.manager
        return await self.endpoint.calls.serve(manager.app, manager._lifespan_state, self.session_id,  # noqa: SLF001
                                               self.handshake, self.message, request)


# Set by McpEndpoint for the task that serves a POST carrying such a call; None elsewhere.
_SESSION_CALL: contextvars.ContextVar[SessionCall | None] = contextvars.ContextVar("fleethub_mcp_session_call",
                                                                                   default=None)


class AnswerMode(StreamableHTTPServerTransport):
    """The SDK's transport, with its JSON-or-SSE switch read per request. Every place the SDK reads
    ``is_json_response_enabled`` for a POST runs in that POST's task, where ``_JSON_ANSWER`` holds
    this request's choice; its message router runs in the session's task and sees the SSE default,
    so it routes a request's notifications to the request's stream instead of dropping them.
    A JSON answer takes the first message routed to its request, so only a request that can have
    no notification of its own is answered so: the server's handlers (hub/mcp/server.py) send one
    only as progress, against the request's token, and ask the client nothing."""

    calls: Calls | None = None  # set by Manager._admit_session

    @property
    def is_json_response_enabled(self) -> bool:
        mode = _JSON_ANSWER.get()
        return self._json_default if mode is None else mode

    @is_json_response_enabled.setter
    def is_json_response_enabled(self, value: bool) -> None:
        self._json_default = value

    async def _handle_post_request(self, scope: dict, request: Any, receive: Any, send: Any) -> None:
        """A session's ``tools/call`` that the endpoint chose (``SessionCall``) is answered here, in the
        POST's task; anything else, or a request the SDK would refuse (its accept, content type or
        session header), goes to the SDK's handling unchanged. Its answer is a JSON body, or 500 when the
        session ended while it ran, as the SDK answers then."""
        call = _SESSION_CALL.get()
        if (call is None or self._terminated or request.headers.get(SESSION_HEADER) != self.mcp_session_id
                or not check_accept_headers(request)[0] or not self._check_content_type(request)):
            await super()._handle_post_request(scope, request, receive, send)
            return
        answer = await call.serve(request)
        if self._terminated:
            response = self._create_error_response("Session terminated before the request completed",
                                                   HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR)
        else:
            response = self._create_json_response(answer)
        await response(scope, receive, send)

    async def terminate(self) -> None:
        """The SDK's end of the session, and of its calls answered in their POSTs' tasks (``calls``, given
        by the manager), which the SDK's end cannot reach: they run outside the session's task."""
        try:
            await super().terminate()
        finally:
            if self.mcp_session_id is not None and self.calls is not None:
                self.calls.end_session(self.mcp_session_id)

    def _create_json_response(self, response_message: Any, status_code: HTTPStatus = HTTPStatus.OK,
                              headers: dict[str, str] | None = None) -> Response:
        """The SDK's JSON answer, with a result written by ``result_body`` (one pass, not the reply
        model's dump); an error, or anything with other headers or status, as the SDK writes it."""
        body = result_body(response_message) if status_code == HTTPStatus.OK and not headers else None
        if body is None:
            return super()._create_json_response(response_message, status_code, headers)
        out = {"Content-Type": "application/json"}
        if self.mcp_session_id:
            out[SESSION_HEADER] = self.mcp_session_id
        return Response(body, status_code=200, headers=out)

    def _create_event_data(self, event_message: Any) -> Any:
        """The SDK's SSE event for a message, with a result's data written by ``result_body`` (an answer
        to a call that asked for progress); a notification or an error as the SDK writes it."""
        body = result_body(event_message.message)
        if body is None:
            return super()._create_event_data(event_message)
        event = {"event": "message", "data": body.decode()}
        if event_message.event_id:
            event["id"] = event_message.event_id
        return event


class Manager(StreamableHTTPSessionManager):
    calls: Calls | None = None  # the endpoint's session calls answered in their POSTs' tasks

    def _admit_session(self, requestor: Any) -> StreamableHTTPServerTransport | None:
        """The SDK's admission, with its transport made an ``AnswerMode`` (the class is the only change)."""
        transport = super()._admit_session(requestor)
        if transport is not None:
            transport.__class__ = AnswerMode
            transport._json_default = False  # noqa: SLF001 — SSE unless the request says otherwise
            transport.calls = self.calls
        return transport


def with_headers(start: dict, extra: list[tuple[bytes, bytes]]) -> dict:
    """An answer's start with the rate-limit headers; a 413 also closes the connection: it was
    refused before its body was read, and the rest of the body is still on the connection."""
    if start["status"] == 413:
        extra = [*extra, (b"connection", b"close")]
    return {**start, "headers": [*start.get("headers", ()), *extra]}


def _headers(scope: dict) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        key = name.decode("latin-1").lower()
        if key not in out:
            out[key] = value.decode("latin-1")
    return out


def base_url(scope: dict, headers: dict[str, str]) -> str:
    return f"{scope.get('scheme', 'http')}://{headers.get('host', 'localhost')}"


class McpEndpoint:
    def __init__(self, services: "McpHost", app: Any) -> None:
        self.services = services
        self.manager = Manager(
            server.build(app, services, self.is_open), json_response=False, session_idle_timeout=IDLE_SECONDS,
            max_sessions=MAX_SESSIONS, max_request_body_size=MAX_BODY_BYTES)
        self.max_per_owner = MAX_SESSIONS_PER_OWNER
        self._running = False
        self._starting = trio.Lock()
        self._sessions: dict[str, Caller] = {}
        self._opening: dict[tuple[str, Any], int] = {}
        self._exchanges: dict[tuple[str, Any], int] = {}  # stateless requests in flight, per owner
        self._handshakes: dict[str, Handshake] = {}  # per session: what its initialize said
        self._initialized: set[str] = set()  # sessions whose notifications/initialized the SDK took
        self.calls = self.manager.calls = Calls()  # session calls answered in their POSTs' tasks
        self._in_flight: set[tuple[str, int | str]] = set()  # (session, request id) of session POSTs

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        headers = _headers(scope)
        version = headers.get(VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            await self._stateless(scope, headers, receive, send)
            return
        try:
            caller = await self._authenticate(scope, headers)
            session_id = headers.get(SESSION_HEADER)
            if session_id is not None:
                known = self._sessions.get(session_id)
                if known is not None and known.fingerprint != caller.fingerprint:
                    raise NotFound("session not found")  # as for a session that does not exist
            elif scope["method"] == "POST" and self.open_sessions(caller.owner) >= self.max_per_owner:
                raise RateLimited(f"at most {self.max_per_owner} MCP sessions per organisation; close one "
                                  "(DELETE with its Mcp-Session-Id) or let it expire", code="too_many_sessions",
                                  retry_after=60)
        except FleethubError as exc:
            await self._refuse(scope, headers, send, exc)
            return
        await self._start()
        # A session being opened counts from its request's arrival until it is open (then it is one of
        # _sessions) or refused: counted in one place at a time, never in both, or a burst of opening
        # sessions answered as SSE (whose request lasts past the session id) reads as twice as many.
        opening = session_id is None and scope["method"] == "POST"
        if opening:
            self._opening[caller.owner] = self._opening.get(caller.owner, 0) + 1
        limit_headers = [(k.lower().encode(), v.encode()) for k, v in caller.ratelimit.headers().items()]

        def opened() -> None:
            nonlocal opening
            if opening:
                opening = False
                self._opening[caller.owner] -= 1
                if not self._opening[caller.owner]:
                    del self._opening[caller.owner]

        handshake: Handshake | None = None
        initialized = False  # this POST is the session's notifications/initialized

        async def answer(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = with_headers(message, limit_headers)
                if opening and message["status"] < 400:
                    for name, value in message["headers"]:
                        if name.lower() == SESSION_HEADER.encode():
                            self._sessions[value.decode("latin-1")] = caller
                            if handshake is not None:
                                self._handshakes[value.decode("latin-1")] = handshake
                elif initialized and message["status"] == 202:  # the SDK took it: the session is initialized
                    self._initialized.add(session_id)
                opened()
            await send(message)

        in_flight = None  # (session, request id) of a request this POST carries
        if scope["method"] == "POST" and (opening or session_id is not None):
            messages, whole = await read_body(receive, MAX_BODY_BYTES)
            message = parsed(b"".join(m.get("body", b"") for m in messages)) if whole else None
            if opening:
                handshake = handshake_of(message)
            elif whole:
                in_flight = request_key(session_id, message)
                if in_flight in self._in_flight:
                    # The SDK keeps one answer stream per request id: a second request of the same id
                    # overwrote the first's and neither was answered, the POSTs held open for good.
                    await self._refuse(scope, headers, send, Conflict(
                        "a request with this id is already in flight on this MCP session",
                        code="duplicate_request_id"))
                    return
                as_json = json_answer(message)
                _JSON_ANSWER.set(as_json)
                initialized = self._session_message(session_id, headers, message, as_json)
            receive = replaying(messages, receive)
        if in_flight is not None:
            self._in_flight.add(in_flight)
        try:
            await self.manager.handle_request(scope, receive, answer)
        finally:
            opened()  # no answer began (the request failed): it opens nothing
            self._in_flight.discard(in_flight)

    async def _stateless(self, scope: dict, headers: dict[str, str], receive: Any, send: Any) -> None:
        """A request of the stateless revision (2026-07-28, what the SDK's ``mcp.Client`` negotiates by
        default): one self-contained POST, no session. The SDK routes it by its protocol-version header
        as here. It opens nothing, so it counts against no session bound: its exchanges in flight are
        bounded per organisation instead (the same number), as SSE streams are, since one that asks for
        progress holds its answer open while the work it follows runs."""
        try:
            caller = await self._authenticate(scope, headers)
            if self._exchanges.get(caller.owner, 0) >= self.max_per_owner:
                raise RateLimited(f"at most {self.max_per_owner} stateless MCP requests in flight per "
                                  "organisation", code="too_many_requests", retry_after=5)
        except FleethubError as exc:
            await self._refuse(scope, headers, send, exc)
            return
        await self._start()
        limit_headers = [(k.lower().encode(), v.encode()) for k, v in caller.ratelimit.headers().items()]

        async def answer(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = with_headers(message, limit_headers)
            await send(message)

        self._exchanges[caller.owner] = self._exchanges.get(caller.owner, 0) + 1
        try:
            if scope["method"] == "POST":
                messages, whole = await read_body(receive, MAX_BODY_BYTES)
                receive = replaying(messages, receive)
                if (whole and handle_modern_request is not None
                        and json_answer(parsed(b"".join(m.get("body", b"") for m in messages)))):
                    # A call that asked for no progress is answered as JSON, in this task: the SDK's own
                    # single-exchange path in its JSON mode, which its manager takes only when every
                    # request of the server is answered so (ours answers SSE to a call that asks for
                    # progress). Its body is whole and within the bound the manager's middleware keeps.
                    manager = self.manager
                    await handle_modern_request(manager.app, manager.security_settings, True,
                                                manager._lifespan_state, scope, receive, answer)  # noqa: SLF001
                    return
            await self.manager.handle_request(scope, receive, answer)
        finally:
            self._exchanges[caller.owner] -= 1
            if not self._exchanges[caller.owner]:
                del self._exchanges[caller.owner]

    def _session_message(self, session_id: str, headers: dict[str, str], message: dict | None,
                         as_json: bool) -> bool:
        """What a session's POST means to the endpoint, before the SDK sees it: a cancellation reaches a
        call answered in its POST's task (the SDK's dispatcher is told too, and ignores a call it does not
        hold); a ``tools/call`` the session would answer as one JSON body is marked to be answered so
        (``SessionCall``; ``as_json``: its answer is one JSON body). True for the session's
        ``notifications/initialized``."""
        if message is None:
            return False
        method = message.get("method")
        if "id" not in message:
            params = message.get("params")
            if method == "notifications/cancelled" and isinstance(params, dict):
                request_id = params.get("requestId")
                if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
                    self.calls.cancel(session_id, request_id)
            return method == "notifications/initialized"
        handshake = self._handshakes.get(session_id)
        if (method != "tools/call" or not as_json or session_id not in self._initialized
                or handshake is None or headers.get(VERSION_HEADER) != handshake.version
                or self._sessions.get(session_id) is None):
            return False
        try:
            JSONRPCRequest.model_validate(message)
        except ValidationError:
            return False  # the SDK answers what is wrong with it
        _SESSION_CALL.set(SessionCall(self, session_id, handshake, message))
        return False

    def is_open(self, session_id: str) -> bool:
        return session_id in self.manager._server_instances  # noqa: SLF001 — as in open_sessions

    def open_sessions(self, owner: tuple[str, Any]) -> int:
        """The owner's sessions still open, and those being opened now. The SDK forgets a session that
        ends (DELETE, idle timeout) in its own map, with no callback: ours is pruned against it."""
        live = self.manager._server_instances  # noqa: SLF001 — the SDK's one record of open sessions
        for gone in [sid for sid in self._sessions if sid not in live]:
            del self._sessions[gone]
            self._handshakes.pop(gone, None)
            self._initialized.discard(gone)
        return sum(1 for c in self._sessions.values() if c.owner == owner) + self._opening.get(owner, 0)

    async def _start(self) -> None:
        """The session manager runs in the services' nursery from the first MCP request on."""
        if self._running:
            return
        async with self._starting:
            if not self._running:
                await self.services.nursery.start(self._run)

    async def _run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with self.manager.run():
            self._running = True
            task_status.started()
            await trio.sleep_forever()

    async def _authenticate(self, scope: dict, headers: dict[str, str]) -> Caller:
        s = self.services
        addr = ((scope.get("client") or ("unknown",))[0]) or "unknown"
        org_id = None
        raw = headers.get("x-organization-id")
        if raw:
            try:
                org_id = uuid.UUID(raw)
            except ValueError:
                raise BadRequest("X-Organization-ID is not a valid organisation id",
                                 code="invalid_organization") from None
        found = header_credential(headers)
        try:
            if found is None:
                raise Unauthenticated("authentication required: send Authorization: Bearer (a service-account "
                                      "token or a PAT secret), or X-API-Token-ID and X-API-Secret-Key")
            scheme, cred = found
            resolved = await scheme.resolve(s, cred, org_id)
        except Unauthenticated:
            self._spend(("addr", addr), None, None)
            raise
        role = resolved.role
        in_org = org_id is not None and role is not None
        owner = ("org", org_id) if in_org else ("principal", resolved.principal.id)
        decision = self._spend(owner, resolved.tier if in_org else None, resolved.custom if in_org else None)
        if org_id is not None and role is None:
            raise Forbidden("not a member of this organisation")
        fingerprint = hashlib.sha256(f"{cred.kind}\0{cred.token_id}\0{cred.secret}".encode()).digest()
        return Caller(owner, fingerprint, decision)

    def _spend(self, key: tuple[str, Any], tier: str | None, custom: int | None):
        decision = spend(self.services.access.rate_limiter, key, tier, custom, self.services.clock.now())
        decision.raise_if_refused()
        return decision

    async def _refuse(self, scope: dict, headers: dict[str, str], send: Any, exc: FleethubError) -> None:
        out = {"content-type": "application/json", **{k.lower(): v for k, v in exc.headers.items()}}
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            out["connection"] = "close"  # answered without reading the body: the connection cannot go on
        if exc.status == 401:
            out["www-authenticate"] = f'Bearer resource_metadata="{base_url(scope, headers)}{METADATA_PATH}"'
        body = json.dumps(general_body(exc)).encode()
        await send({"type": "http.response.start", "status": exc.status,
                    "headers": [(k.encode(), str(v).encode()) for k, v in out.items()]})
        await send({"type": "http.response.body", "body": body})
