"""The MCP server's handlers (the SDK's low-level ``Server``): tools and resources over the REST API.

Every tool call and every resource read becomes one REST request through the hub's own app
(hub/mcp/inproc.py) carrying the credential of the MCP request it came with. Nothing a handler
raises reaches the SDK: a refused argument, a REST error or a failure is a tool error (``isError``)
with the REST status and code, so a bad call never ends the session or becomes a 500.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import anyio
import mcp_types as types
import trio
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from hub.auth.access import Authenticating
from hub.errors import FleethubError
from hub.mcp import follow, inproc
from hub.mcp.listen import listen_handler
from hub.mcp.tools import BY_NAME, TOOLS, Tool

if TYPE_CHECKING:
    from hub.events import EventHub


class McpHost(Authenticating, Protocol):
    """What the MCP server uses of the process (hub/services.py ``Services`` provides it): what
    authentication reads, as the API checks credentials, then the event hub its live state comes from
    and the services' nursery its forwarding tasks run in."""

    @property
    def events(self) -> "EventHub": ...
    @property
    def nursery(self) -> trio.Nursery: ...


log = logging.getLogger("fleethub.mcp")

NAME = "fleethub"
INSTRUCTIONS = (
    "fleethub operates fleets of edge devices with your own permissions. Reads are annotated read-only. "
    "Lists are paged (page, limit). A memory test or a rollout runs on after its tool returns: poll "
    "memory_test_status or get_rollout, or send a progressToken with start_memory_test or resume_rollout to "
    "get progress notifications and the end. A device you may not view answers not_found, like a missing one.")

_DOCS = Path(__file__).resolve().parents[2] / "docs" / "device-protocol.md"
# uri -> (name, description, mime type, the REST path that serves it; None: the file above)
RESOURCES: dict[str, tuple[str, str, str, str | None]] = {
    "fleethub://device-protocol/schema.json": (
        "device-protocol-schema", "The device link's JSON Schema (GET /v1/device/protocol.json).",
        "application/json", "/v1/device/protocol.json"),
    "fleethub://docs/device-protocol.md": (
        "device-protocol-doc", "docs/device-protocol.md: the device link, for agent writers.", "text/markdown", None),
    "fleethub://openapi.json": (
        "openapi", "The hub's OpenAPI document (GET /v1/openapi.json).", "application/json", "/v1/openapi.json"),
}
DEVICE_STATE = "fleethub://devices/{device_id}/state"
# a tool argument naming an object -> (its kind, the REST read that needs viewer on it)
OBJECTS = {"device_id": ("device", "/v1/devices/{id}"), "rollout_id": ("rollout", "/v1/rollouts/{id}"),
           "config_id": ("configuration", "/v1/configurations/{id}")}


def tool_definition(tool: Tool) -> types.Tool:
    return types.Tool(
        name=tool.name, description=f"{tool.description} Needs: {tool.permission}.",
        input_schema=tool.args.model_json_schema_for_mcp(), output_schema=tool.output_schema(),
        annotations=types.ToolAnnotations(read_only_hint=tool.read_only, destructive_hint=tool.destructive,
                                          idempotent_hint=tool.idempotent, open_world_hint=False))


def tool_error(status: int, code: str, message: str) -> types.CallToolResult:
    body = {"status": status, "error": code, "message": message}
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(body))],
                                structured_content=body, is_error=True)


def _first_problem(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
    return f"{where}: {err.get('msg', 'invalid')}"


MAX_SUBSCRIPTIONS_PER_SESSION = 32
# How often a subscription with no events asks whether its session still exists (the SDK tells no one).
ALIVE_CHECK_SECONDS = 60.0


def build(app: Any, services: McpHost, alive: Callable[[str], bool]) -> Server:
    """The server for ``app``'s requests (``app.asgi_app`` is called in-process); ``alive(session id)``
    says whether an MCP session is still open (subscriptions end with theirs)."""
    subscriptions: dict[tuple[str, str], trio.CancelScope] = {}

    async def rest(ctx: Any, method: str, path: str, query: dict, body: dict | None, tool: str,
                   org_id=None) -> inproc.Answer:
        request = ctx.request  # the MCP HTTP request that carried this call
        if request is None:
            raise MCPError(code=types.INTERNAL_ERROR, message="no HTTP request carries this call")
        return await inproc.call(app.asgi_app, method=method, path=path, query=query, body=body,
                                 headers=inproc.headers_from(request.headers.items(), org_id),
                                 client=request.scope.get("client"), tool=tool)

    # The tools never change in a process: their definitions (JSON Schemas built from the argument
    # models) are made once. The stateless revision checks a call's Mcp-Param headers against its
    # tool's input schema before each call, from the tools/list handler unless told the schema here:
    # that was a whole listing per call with arguments (a ping took 16 ms of the hub against 7).
    definitions = [tool_definition(t) for t in TOOLS]
    input_schemas = {d.name: d.input_schema for d in definitions}

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=definitions)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult | dict:
        tool = BY_NAME.get(params.name)
        if tool is None:
            return tool_error(404, "unknown_tool", f"no tool named {params.name[:100]!r}")
        try:
            args = tool.args.model_validate(params.arguments or {})
        except ValidationError as exc:
            return tool_error(400, "invalid_field", _first_problem(exc))
        try:
            if tool.follows is not None and _progress_token(ctx) is not None:
                return await followed(ctx, tool, args)
            answer = await rest(ctx, *tool.request(args), tool.name, args.organization_id)
        except inproc.AnswerTooLarge as exc:
            return tool_error(413, "answer_too_large", f"{exc}; ask for a smaller page")
        except FleethubError as exc:  # the event stream cap of a followed call
            return tool_error(exc.status, exc.code, exc.message)
        except Exception:  # noqa: BLE001 — a tool's failure is its error, never the session's end
            log.exception("MCP tool %s failed", tool.name)
            return tool_error(500, "internal_error", "internal error")
        return await answered(ctx, tool, args, answer)

    async def answered(ctx: Any, tool: Tool, args: Any, answer: inproc.Answer) -> types.CallToolResult | dict:
        if 200 <= answer.status < 300 and isinstance(answer.body, dict):
            text = answer.text or json.dumps(answer.body, separators=(",", ":"))
            # The result in its wire form, not a CallToolResult: the SDK validates and dumps a result
            # against the protocol's model before it sends it (serialize_server_result), and a model
            # would first be built (a validation) and dumped to this same dict, two more walks of a
            # page of devices (166 -> 113 us for a page of 20 devices; docs/mcp.md, Measured).
            result = {"content": [{"type": "text", "text": text}], "structuredContent": answer.body, "isError": False}
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                # The stateless revision (2026-07-28, the SDK client's default) requires every result to
                # say it is complete; a model would say so itself, a wire-form dict must.
                result["resultType"] = "complete"
            return result
        body = answer.body if isinstance(answer.body, dict) else {}
        if answer.status == 403 and body.get("error") == "missing_relation":
            hidden = await unseen(ctx, tool, args)
            if hidden is not None:
                return hidden
        return tool_error(answer.status, str(body.get("error") or "error"), str(body.get("message") or ""))

    async def followed(ctx: Any, tool: Tool, args: Any) -> types.CallToolResult:
        """The tool's REST call, then its work followed (hub/mcp/follow.py) until it ends or
        ``follow.FOLLOW_SECONDS`` pass; a client's cancellation ends the wait (the SDK cancels this
        handler), never the work. Answers ``{"data": the work's state as its REST read gives it,
        "started": the REST call's answer, "ended": whether the work ended while followed}``."""
        org = args.organization_id or _org_header(ctx)
        if tool.follows == "memory_test":
            topic, read = ("device", args.device_id), f"/v1/devices/{args.device_id}/memory-test"
        else:
            topic, read = ("rollout", args.rollout_id), f"/v1/rollouts/{args.rollout_id}"
        subscription = await services.events.open(topic, owner=("org", org) if org is not None else None)
        with subscription:
            answer = await rest(ctx, *tool.request(args), tool.name, args.organization_id)
            if not (200 <= answer.status < 300 and isinstance(answer.body, dict)):
                return await answered(ctx, tool, args, answer)
            started = answer.body.get("data") if isinstance(answer.body.get("data"), dict) else {}
            run_id = started.get("runId")
            reported = -1.0
            state = started.get("state")

            async def report(step: follow.Step | None) -> bool:
                nonlocal reported
                if step is None:
                    return False
                # the protocol: each notification's progress is above the one before
                if step.progress is not None and step.progress > reported:
                    reported = step.progress
                    await ctx.session.report_progress(step.progress, 1.0, step.message)
                return step.ended

            async def poll() -> bool:
                now = await rest(ctx, "GET", read, {}, None, tool.name, args.organization_id)
                if now.status != 200 or not isinstance(now.body, dict):
                    return True  # the work can no longer be read: nothing more to follow
                if tool.follows == "memory_test":
                    return await report(follow.memory_test_status_step(now.body, run_id))
                data = now.body.get("data") or {}
                return await report(follow.rollout_counts_step(data.get("counts"), data.get("state")))

            def step_of(event: dict) -> follow.Step | None:
                nonlocal state
                if tool.follows == "memory_test":
                    return follow.memory_test_step(event, run_id)
                step = follow.rollout_step(event, state)
                if event.get("kind") == "rollout.state":
                    state = (event.get("payload") or {}).get("state")
                return step

            await report(follow.Step(0.0, f"{tool.name}: started {run_id or tool.follows}", False))
            ended = await poll()
            listening = True
            with trio.move_on_after(follow.FOLLOW_SECONDS):
                while not ended:
                    if not listening:
                        await trio.sleep(follow.POLL_SECONDS)
                        ended = await poll()
                        continue
                    with trio.move_on_after(follow.POLL_SECONDS) as quiet:
                        try:
                            event = await subscription.receive.receive()
                        except trio.EndOfChannel:  # dropped for a full buffer: reads from here on
                            listening = False
                            continue
                    ended = await poll() if quiet.cancelled_caught else await report(step_of(event))
        final = await rest(ctx, "GET", read, {}, None, tool.name, args.organization_id)
        body = {"data": (final.body or {}).get("data") if isinstance(final.body, dict) else None,
                "started": started, "ended": ended}
        if not isinstance(body["data"], dict):
            body["data"] = {}
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(body))],
                                    structured_content=body)

    async def unseen(ctx: Any, tool: Tool, args: Any) -> types.CallToolResult | None:
        """The answer for a missing object, when the REST refusal was for one the caller may not even
        view: REST says 403 missing_relation, and the MCP server says what it says of a missing one,
        so an agent learns nothing of a fleet it may not see. Viewer is asked for with one REST read
        of the object (in the audit log too) when the refused relation was another."""
        for arg, (kind, path) in OBJECTS.items():
            value = getattr(args, arg, None)
            if value is None:
                continue
            answer = await rest(ctx, "GET", path.format(id=value), {}, None, tool.name, args.organization_id)
            if answer.status != 200:
                return tool_error(404, "not_found", f"{kind} not found")
        return None

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=uri, name=name, description=description, mime_type=mime)
            for uri, (name, description, mime, path) in RESOURCES.items() if path is not None or _DOCS.exists()])

    async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            uri_template=DEVICE_STATE, name="device-state", mime_type="application/json",
            description="A device's state as GET /v1/devices/{id} gives it (needs viewer on the device).")])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri in RESOURCES:
            _, _, mime, path = RESOURCES[uri]
            if path is None:
                if not _DOCS.exists():
                    raise MCPError(code=types.INVALID_PARAMS, message="this install has no docs/device-protocol.md")
                text = _DOCS.read_text(encoding="utf-8")
            else:
                answer = await rest(ctx, "GET", path, {}, None, "resource")
                text = json.dumps(answer.body)
            return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type=mime, text=text)])
        device_id = _device_of(uri)
        if device_id is None:
            raise MCPError(code=types.INVALID_PARAMS, message="no such resource")
        answer = await rest(ctx, "GET", f"/v1/devices/{device_id}", {}, None, "resource")
        if answer.status != 200:
            raise MCPError(code=types.INVALID_PARAMS, message="no such device is visible to you")
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=uri, mime_type="application/json", text=json.dumps(answer.body))])

    async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        """A device's state: ``notifications/resources/updated`` for its URI on every event of the
        device's SSE stream (the same EventHub topic, counted against the organisation's stream cap).
        The notification names only the URI; reading it is a REST read with the caller's access."""
        uri, request = str(params.uri), ctx.request
        device_id = _device_of(uri)
        if device_id is None or request is None:
            raise MCPError(code=types.INVALID_PARAMS, message="only fleethub://devices/{id}/state may be subscribed to")
        session_id = request.headers.get("mcp-session-id") or ""
        if (session_id, uri) in subscriptions:
            return types.EmptyResult()
        if sum(1 for sid, _ in subscriptions if sid == session_id) >= MAX_SUBSCRIPTIONS_PER_SESSION:
            raise MCPError(code=types.INVALID_PARAMS, message=f"at most {MAX_SUBSCRIPTIONS_PER_SESSION} "
                                                              "subscriptions per session")
        answer = await rest(ctx, "GET", f"/v1/devices/{device_id}", {}, None, "resource")
        org = request.headers.get("x-organization-id")
        if answer.status != 200 or org is None:
            raise MCPError(code=types.INVALID_PARAMS, message="no such device is visible to you")
        try:
            subscription = await services.events.open(("device", uuid.UUID(device_id)), owner=("org", uuid.UUID(org)))
        except FleethubError as exc:
            raise MCPError(code=types.INVALID_REQUEST, message=exc.message) from None
        scope = subscriptions[(session_id, uri)] = trio.CancelScope()
        services.nursery.start_soon(forward, ctx.session, session_id, uri, subscription, scope)
        return types.EmptyResult()

    async def forward(session: Any, session_id: str, uri: str, subscription: Any, scope: trio.CancelScope) -> None:
        try:
            with scope, subscription:
                while alive(session_id):
                    with trio.move_on_after(ALIVE_CHECK_SECONDS):
                        try:
                            await subscription.receive.receive()
                        except trio.EndOfChannel:
                            return
                        await session.send_resource_updated(uri)
        except (trio.ClosedResourceError, trio.BrokenResourceError, anyio.ClosedResourceError,
                anyio.BrokenResourceError):
            pass  # the session ended under it
        finally:
            subscriptions.pop((session_id, uri), None)

    async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        request = ctx.request
        session_id = request.headers.get("mcp-session-id") or "" if request is not None else ""
        scope = subscriptions.get((session_id, str(params.uri)))
        if scope is not None:
            scope.cancel()
        return types.EmptyResult()

    async def visible(ctx: Any, device_id: str) -> bool:
        return (await rest(ctx, "GET", f"/v1/devices/{device_id}", {}, None, "resource")).status == 200

    # the 2026-07-28 revision's way to follow a device (hub/mcp/listen.py); a session's is subscribe above
    listen = listen_handler(services.events, frozenset(RESOURCES), _device_of, visible, _org_header)
    built = Server(NAME, version="1", instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool,
                   on_list_resources=list_resources, on_list_resource_templates=list_templates,
                   on_read_resource=read_resource, on_subscribe_resource=subscribe,
                   on_unsubscribe_resource=unsubscribe, on_subscriptions_listen=listen,
                   get_tool_input_schema=input_schemas.get)
    # The SDK wraps every message in an OpenTelemetry span by default. The hub installs no tracing SDK,
    # so each span records nothing and costs every call its setup; its calls are in the audit log.
    built.middleware = []
    return built


def _progress_token(ctx: Any) -> Any:
    meta = ctx.meta or {}
    token = meta.get("progress_token", meta.get("progressToken"))
    return token


def _org_header(ctx: Any) -> uuid.UUID | None:
    raw = ctx.request.headers.get("x-organization-id") if ctx.request is not None else None
    try:
        return uuid.UUID(raw) if raw else None
    except ValueError:
        return None


def _device_of(uri: str) -> str | None:
    """The device id of a ``fleethub://devices/{id}/state`` URI, if it is one (a UUID, nothing else)."""
    parts = urlsplit(uri)
    segments = parts.path.strip("/").split("/")
    if parts.scheme != "fleethub" or parts.netloc != "devices" or len(segments) != 2 or segments[1] != "state":
        return None
    try:
        return str(uuid.UUID(segments[0]))
    except ValueError:
        return None
