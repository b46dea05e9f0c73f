"""create_app(services): the Quart-Trio app — blueprints, authentication, errors, request ids, audit.

How a REST request travels: hypercorn (trio worker) → ``_before`` (request id, authentication,
organisation context) → the blueprint's view (validate with pydantic, authorise, then read storage or
ask an actor) → ``_after`` (X-Request-ID, metrics, audit row written behind). Any error on the way
becomes a JSON body from hub/errors.py — never an HTML page. The device link's WebSocket goes
around all of this (``HubApp``): no hook runs for a WebSocket, and the link answers for itself.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial

import trio
from quart import Request, Response, has_request_context, jsonify, request, websocket
from quart_schema import QuartSchema
from quart_schema.openapi import APIKeySecurityScheme, HttpSecurityScheme, Info
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from hub.api import (access, assistant, audit, billing, configurations, devices, diagnosis, docs_ui, fleets, health,
                     link, memtests, oauth, pagemaps, pats, registry_credentials, reverts, rollouts, secret_files, sessions,
                     tunnels, windows)
from hub.api import events, mcp_meta, validation, webhooks
from hub.registry import routes as registry_routes
from device_client.shared import protocol_schema
from device_client.shared.protocol import LINK_PATH
from hub import answers, asgi_websocket, console, proxied
from hub.asgi_websocket import AsgiWebSocket
from hub.auth import middleware
from hub.auth.schemes import SESSION_COOKIE
from hub.mcp.endpoint import PATH as MCP_PATH, McpEndpoint
from hub.ids import fast_uuid4
from hub.documents import CachedDocument
from hub.openapi import EITHER, FleethubOpenAPI
from hub.openapi import view as openapi_view
from actors.errors import AskError
from hub.errors import (Conflict, FleethubError, database_unavailable, from_actor, general_body, memtest_body,
                        tunnel_body)
from storage.db import DatabaseUnavailable, NameTaken, crossings_counted
from hub.services import Services

log = logging.getLogger("fleethub.http")

_HTTP_CODES = {400: "bad_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 413: "payload_too_large",
               415: "unsupported_media_type"}


def _where() -> tuple[str, str]:
    """The method and path being answered: an HTTP request's, or a WebSocket's (one on a path no route
    takes reaches the error handlers too, and has no request context: that was a 500 and a traceback)."""
    if has_request_context():
        return request.method, request.path
    return "WEBSOCKET", websocket.path


def _body_for(exc: FleethubError) -> dict:
    path = _where()[1]
    if "/memory-test" in path:
        return memtest_body(exc)
    if path.startswith("/v1/cli/tunnel/"):
        return tunnel_body(exc)
    return general_body(exc)


def _body_consumed(req: Request, headers: dict[str, str]) -> bool:
    if not (_declared_length(headers.get("content-length")) or headers.get("transfer-encoding")):
        return True  # no body was sent
    complete = getattr(getattr(req, "body", None), "_complete", None)
    return complete.is_set() if complete is not None and hasattr(complete, "is_set") else False


def _declared_length(value: str | None) -> int:
    """Content-Length as werkzeug reads it: a bad or negative value is no length."""
    try:
        return max(0, int(value)) if value else 0
    except ValueError:
        return 0


class HubApp(QuartTrio):
    """The hub's Quart-Trio app, with the device link's WebSocket served in front of Quart.

    A device link lives for days and there are tens of thousands: served as plain ASGI it costs about
    15 KiB less per device than as a Quart WebSocket (hub/asgi_websocket.py: what and why). Every
    other request, a plain GET of the link's path included (426), is Quart's as before. Here rather
    than as middleware on ``asgi_app``: two coroutine frames fewer per waiting link, and anything
    that serves the app (hub/server.py, bench/auth_overhead.py) serves the link with it."""

    device_link: Callable[[AsgiWebSocket], Awaitable[None]]  # set by create_app
    mcp: McpEndpoint  # /v1/mcp, plain ASGI like the link: the SDK's transport streams its answers
    proxy_hops: int = 0  # FLEETHUB_TRUSTED_PROXY_HOPS (hub/proxied.py)

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 — ASGI's own signature
        if self.proxy_hops:
            proxied.apply_forwarded(scope, self.proxy_hops)
        if scope["type"] == "websocket" and scope["path"] == LINK_PATH:
            await asgi_websocket.serve(self.device_link, scope, receive, send)
        elif scope["type"] == "http" and scope["path"] == MCP_PATH:
            await self.mcp(scope, receive, send)
        else:
            await self.asgi_app(scope, receive, send)


# CPython 3.11's ast module can raise this spuriously when other threads run while it builds a tree
# (python/cpython#106905, fixed in later releases); werkzeug compiles every URL rule with ast.parse, and
# a hub process has threads (aiortc's loop, the embedded PostgreSQL's watcher). Building the app is
# pure, so it is built again: a hub must not fail to start on an interpreter bug that a retry avoids.
_AST_FLAKE = "AST constructor recursion depth mismatch"
_BUILD_ATTEMPTS = 3


def create_app(services: Services) -> HubApp:
    for _ in range(_BUILD_ATTEMPTS - 1):
        try:
            return _build_app(services)
        except SystemError as exc:
            if _AST_FLAKE not in str(exc):
                raise
            log.warning("building the app met CPython's spurious %r (python/cpython#106905): built again",
                        _AST_FLAKE)
    return _build_app(services)


def _build_app(services: Services) -> HubApp:
    # no static_folder: Quart's default /static/<path> route served nothing of ours (the console has
    # its own, hub/console/pages.py) and answered a path the file system refused with a 500
    app = HubApp("fleethub", static_folder=None)
    app.device_link = partial(link.device_link, services)
    app.proxy_hops = services.settings.trusted_proxy_hops
    app.mcp = services.mcp = McpEndpoint(services, app)
    services.http_views = app.view_functions  # the dict itself: the routes registered below are in it
    app.config["SERVICES"] = services
    app.config["MAX_CONTENT_LENGTH"] = 1024 * 1024
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = True
    QuartSchema(
        app, openapi_path="/v1/openapi.json", redoc_ui_path=None, scalar_ui_path=None,
        swagger_ui_path=None,  # served by hub/api/docs_ui.py from vendored files, under a CSP
        info=Info(title="fleethub", version="1.0",
                  description="Organisation-scoped hub for fleets of edge devices."),
        security_schemes={
            "ApiTokenAuth": APIKeySecurityScheme(in_="header", name="X-API-Token-ID"),
            "ApiSecretAuth": APIKeySecurityScheme(in_="header", name="X-API-Secret-Key"),
            "BearerAuth": HttpSecurityScheme(scheme="bearer", bearer_format="JWT"),
            # A 15-minute JWT with scope tunnel from POST /v1/cli/tunnel/token (hub/tunnels/tokens.py).
            "TunnelToken": HttpSecurityScheme(scheme="bearer", bearer_format="JWT"),
            # The device's own token (shown once at POST /v1/devices): its link and page-map uploads.
            "DeviceToken": HttpSecurityScheme(scheme="bearer"),
            # The dashboard session (POST /v1/auth/login); mutating calls also send X-CSRF-Token.
            "SessionCookie": APIKeySecurityScheme(in_="cookie", name=SESSION_COOKIE),
        },
        security=EITHER,  # hub/openapi.py sets each operation's own
        openapi_provider_class=FleethubOpenAPI,
    )
    # built once, off the loop (hub/documents.py says why), in place of quart-schema's per-request build
    compact = partial(app.json.dumps, separators=(",", ":"))
    app.view_functions["openapi"] = openapi_view(CachedDocument(app.extensions["QUART_SCHEMA"].openapi_provider.schema,
                                                                compact))
    services.protocol_document = CachedDocument(protocol_schema.document, compact)
    answers.set_up(app)
    for module in (health, pats, sessions, oauth, access, audit, devices, fleets, configurations, secret_files,
                   rollouts, reverts, link, windows, memtests, pagemaps, diagnosis, tunnels, billing, assistant,
                   registry_credentials, events, webhooks, docs_ui, mcp_meta):
        app.register_blueprint(module.bp)
    app.register_blueprint(configurations.device_bp)
    # the operators' console (hub/console/): pages, static files and its organisation event stream
    app.register_blueprint(console.bp)
    app.register_blueprint(console.stream_bp)
    app.register_blueprint(console.usage_bp)
    app.register_blueprint(console.deliveries_bp)
    app.register_blueprint(registry_routes.bp)  # the registry proxy, /v2/ (hub/registry/)

    # Both hooks take the request and g as objects once (middleware.current: a read through Quart's
    # proxies costs several times a plain attribute read, and these run on every request).
    @app.before_request
    async def _before() -> None:
        req, ctx = middleware.current()
        ctx.started = trio.current_time()  # trio's clock: virtual under a test's autojump clock
        headers = ctx.headers = middleware.headers_of(req)
        ctx.request_id = headers.get("x-request-id") or str(fast_uuid4())
        ctx.principal = None
        ctx.org = None
        ctx.crossings = [0]  # storage crossings this request makes (storage/db.py counts them)
        crossings_counted.set(ctx.crossings)
        await middleware.authenticate(services, req, ctx, headers)
        # after authentication, so an anonymous caller still gets 401 and counts against its limit
        validation.refuse_unstorable_request_text(req)

    @app.after_request
    async def _after(response: Response) -> Response:
        req, ctx = middleware.current()
        response.headers["X-Request-ID"] = getattr(ctx, "request_id", None) or str(fast_uuid4())
        decision = middleware.answer_decision(services, req, ctx)
        if decision is not None:
            response.headers.update(decision.headers())
        headers = ctx.headers if hasattr(ctx, "headers") else middleware.headers_of(req)  # _before may not have run
        if not _body_consumed(req, headers):
            # Answered without reading the whole body (an auth error, a 405, a refusal): the
            # server stops reading a request whose body nobody consumes, so the connection cannot
            # carry another request — close it rather than leave the client's next request hanging.
            response.headers["Connection"] = "close"
        started = getattr(ctx, "started", None)
        rule = req.url_rule
        counted = getattr(ctx, "crossings", None)
        services.metrics.observe_request(req.method, response.status_code,
                                         None if started is None else trio.current_time() - started,
                                         route=rule.rule if rule is not None else None,
                                         crossings=None if counted is None else counted[0])
        await middleware.audit(services, response.status_code, req, ctx)
        return response

    @app.errorhandler(FleethubError)
    async def _fleethub_error(exc: FleethubError):
        if exc.status >= 500:
            log.warning("%s %s -> %d %s", *_where(), exc.status, exc.code)
        response = jsonify(_body_for(exc))
        response.status_code = exc.status
        response.headers.update(exc.headers)
        return response

    @app.errorhandler(AskError)
    async def _actor_error(exc: AskError):
        # An actor's refusal or failure: the hub decides its status (hub/errors.py ACTOR_STATUS).
        return await _fleethub_error(from_actor(exc))

    @app.errorhandler(NameTaken)
    async def _name_taken(exc: NameTaken):
        # Any store's uniqueness refusal, from a create or a rename alike (issue 31 item 10: a rename
        # of a configuration to a taken name was a 500).
        named = f" named {exc.name!r}" if isinstance(exc.name, str) else " with that name"
        return await _fleethub_error(Conflict(f"a {exc.kind}{named} already exists", code="name_exists"))

    @app.errorhandler(DatabaseUnavailable)
    async def _database_unavailable(exc: DatabaseUnavailable):
        # PostgreSQL is down or restarting: say so at once (the pool reconnects by itself).
        return await _fleethub_error(database_unavailable())

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException):
        status = exc.code or 500
        error = FleethubError(exc.description or exc.name, code=_HTTP_CODES.get(status, "http_error"),
                              status=status)
        response = jsonify(_body_for(error))
        response.status_code = status
        if status == 413:
            # Answered before the body was read: the rest of it is still on the connection.
            response.headers["Connection"] = "close"
        valid_methods = getattr(exc, "valid_methods", None)
        if status == 405 and valid_methods:
            response.headers["Allow"] = ", ".join(valid_methods)
        return response

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception):
        log.exception("unhandled error on %s %s", *_where())
        response = jsonify(_body_for(FleethubError("internal error")))
        response.status_code = 500
        return response

    return app
