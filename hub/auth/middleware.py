"""Authentication, organisation context, rate limits and the audit row, for every request.

What a route asks of its caller is its ``RouteAuth`` (hub/auth/routes.py: ``@public``, ``@no_org``,
``@org_of``, ``@session_only``, and what other parts declare); the credentials it may be called with
are the credential schemes (hub/auth/schemes.py), asked in their order of precedence: PAT, service
account's access token, PAT secret as bearer, session cookie, and those another part registers (a
tunnel token). Mutating requests made with the session cookie also need ``X-CSRF-Token``.

Lookups go through the AuthCache, so a warm request costs no storage crossing for authentication.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable
from typing import Any

import trio
from quart import Request, current_app, g, request

from hub.auth.principals import OrgContext, Principal
from hub.auth.ratelimit import Decision, limit_for, spend
from hub.auth.routes import route_auth
from hub.auth.schemes import SCHEMES, Resolved, unauthenticated
from hub.ids import fast_uuid4
from storage.text import storable, storable_value
from hub.errors import BadRequest, Forbidden, NotFound, Unauthenticated

ORG_HEADER = "X-Organization-ID"
_ORG_KEY = ORG_HEADER.lower()  # its key in headers_of
CSRF_HEADER = "X-CSRF-Token"
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Routes quart-schema registers for the API document; they carry no credentials.
PUBLIC_PATHS = frozenset({"/v1/openapi.json", "/v1/docs"})
# Set on the scope of a request an MCP tool makes (hub/mcp/inproc.py); never a header, so no client sets it.
MCP_CHANNEL, MCP_TOOL = "fleethub.channel", "fleethub.tool"
# Query parameters whose values never reach the audit log.
_REDACT = ("token", "secret", "password", "key", "code")


# Why the request path takes ``req`` and ``ctx`` as arguments: Quart's ``request`` and ``g`` are
# context-variable proxies, and each attribute read through one costs a few microseconds (werkzeug's
# LocalProxy lookup), against a tenth of that on the object itself. A GET read them some forty times
# between ``_before`` and ``_after``; hub/app.py now takes the real objects once per request
# (``_get_current_object``, werkzeug's documented way) and hands them down.


def current() -> tuple[Request, Any]:
    """This request and its ``g``, as objects rather than proxies."""
    return request._get_current_object(), g._get_current_object()


def headers_of(req: Request) -> dict[str, str]:
    """The request's headers as a plain dict by lower-case name (the first of a repeated one, as
    ``Headers.get`` gives), read once from the ASGI scope. werkzeug's ``Headers.get`` walks its list
    for every read and raises and catches an exception for every header that is absent; the request
    path asks for five, most of them absent on most requests."""
    out: dict[str, str] = {}
    for name, value in req.scope.get("headers", ()):
        key = name.decode("latin-1").lower()
        if key not in out:
            out[key] = value.decode("latin-1")
    return out


def view_of(req: Request, views: dict[str, Callable] | None = None) -> Callable | None:
    """The view function the request was routed to, or None (no route, or routing failed).
    ``views``: the app's view functions, when the caller has them (no read through ``current_app``)."""
    if req.routing_exception is not None or req.endpoint is None:
        return None
    return (current_app.view_functions if views is None else views).get(req.endpoint)


def client_addr(req: Request | None = None) -> str:
    req = req if req is not None else request
    return (req.remote_addr or "").split(",")[0].strip() or "unknown"


def cross_origin(req: Request) -> bool:
    """Whether a browser says this request came from another site's page. Browsers send Sec-Fetch-Site
    on every request and Origin on every non-GET one; a request with neither (curl, an SDK) is not a
    browser's, so nothing is refused for their absence. The console is served by the hub itself, so
    its calls are same-origin: an Origin whose host:port differs from the Host header, or an opaque
    "null" one, is another page's."""
    site = req.headers.get("Sec-Fetch-Site", "").strip().lower()
    if site in ("cross-site", "same-site"):
        return True
    origin = req.headers.get("Origin", "").strip()
    if not origin:
        return False
    if origin == "null":
        return True
    _, sep, rest = origin.partition("://")
    return not sep or rest.rstrip("/").lower() != req.headers.get("Host", "").strip().lower()


def limit(services, key: object, tier: str | None, custom: int | None, ctx: Any) -> Decision:
    """Count the request against ``key``'s budget (the tier's limit) and keep the decision on ``ctx``
    for the answer's X-RateLimit-* headers; past the budget, RateLimited."""
    decision = ctx.ratelimit = spend(services.access.rate_limiter, key, tier, custom, services.clock.now())
    decision.raise_if_refused()
    return decision


async def authenticate(services, req: Request, ctx: Any, headers: dict[str, str]) -> None:
    """Who is calling, checked against storage through the AuthCache; sets ``ctx.principal``,
    ``ctx.org`` and ``ctx.ratelimit`` (``ctx`` is the request's ``g``; ``headers`` its
    ``headers_of``) or raises."""
    view = ctx.view = view_of(req, services.http_views)
    route = route_auth(view)
    path = req.path
    if view is None or route.public or path in PUBLIC_PATHS:
        if view is None and path.startswith("/v1/"):
            # Every /v1 answer carries the X-RateLimit-* headers (spec, Limits). An unknown route
            # names no caller, so it counts against the client's address (a prober of unknown paths
            # spends its own budget); public routes keep their own limits (the token endpoint's,
            # sign-in's) and show the address budget without spending it (answer_decision).
            limit(services, ("addr", client_addr(req)), None, None, ctx)
        return  # unknown routes fall through to their 404/405
    org_id, org_problem = None, None
    raw = headers.get(_ORG_KEY)
    if route.org_in_credential:
        pass  # the credential binds the organisation (a tunnel token): its scheme compares the header
    elif not raw and route.org_of is not None:
        org_id = await route.org_of(services, **(req.view_args or {}))
        if org_id is None:
            org_problem = NotFound("not found")
        ctx.org_from_object = True
    elif not raw:
        org_problem = BadRequest(f"the {ORG_HEADER} header is required", code="missing_organization")
    else:
        try:
            org_id = uuid.UUID(raw)
        except ValueError:
            org_problem = BadRequest(f"{ORG_HEADER} is not a valid organisation id", code="invalid_organization")

    found = SCHEMES.find(req, headers, route)
    if found is None:
        limit(services, ("addr", client_addr(req)), None, None, ctx)
        raise SCHEMES.named(route.only).missing() if route.only is not None else unauthenticated()
    scheme, credential = found
    if not route.takes(scheme.kind, scheme.general):
        limit(services, ("addr", client_addr(req)), None, None, ctx)
        raise SCHEMES.named(route.only).other()  # only a route that takes one scheme alone refuses one
    try:
        resolved = await scheme.resolve(services, credential, org_id)
    except Unauthenticated:
        limit(services, ("addr", client_addr(req)), None, None, ctx)
        raise
    principal = ctx.principal = resolved.principal
    if resolved.bound_org is not None:
        _admit_bound(services, resolved, ctx)
        if route.needs_org and org_problem is not None:
            raise org_problem
        return
    ctx.credential = resolved.credential  # what an open stream re-checks
    if resolved.session_hash is not None:
        ctx.csrf_token, ctx.session_hash = resolved.csrf_token, resolved.session_hash
    role = resolved.role
    # A call counts against its organisation's tier whenever it names one the caller belongs to,
    # including calls that do not need one (/v1/me); only calls without one count per principal.
    in_org = org_problem is None and role is not None
    if req.scope.get(MCP_CHANNEL) != "mcp":  # an MCP tool's request: its MCP request was counted (hub/mcp/)
        limit(services, ("org", org_id) if in_org else ("principal", principal.id),
              resolved.tier if in_org else None, resolved.custom if in_org else None, ctx)
    if principal.via == "session" and cross_origin(req):
        # SameSite=Strict keeps the cookie off other sites' requests in today's browsers; this refuses
        # one that carries it anyway (an old browser, a same-site subdomain page), whatever the method.
        raise Forbidden("a request made with the session cookie must come from the hub's own pages",
                        code="cross_origin")
    if principal.via == "session" and req.method in MUTATING:
        expected = getattr(ctx, "csrf_token", None)
        # bytes: compare_digest refuses str with non-ASCII characters (a TypeError, a 500)
        if not expected or not hmac.compare_digest(req.headers.get(CSRF_HEADER, "").encode(), expected.encode()):
            raise Forbidden(f"a request made with the session cookie needs the {CSRF_HEADER} header",
                            code="csrf_required")
    if route.needs_org:
        if org_problem is not None:
            raise org_problem
        if role is None:
            if getattr(ctx, "org_from_object", False):
                raise NotFound("not found")  # another organisation's object reads as a missing one
            raise Forbidden("not a member of this organisation")
        ctx.org = OrgContext(org_id, role)


def _admit_bound(services, resolved: Resolved, ctx: Any) -> None:
    """A credential that binds its organisation: the call counts there, then the scheme's refusal
    (another organisation asked for, not a member) if it has one."""
    org_id = resolved.bound_org
    limit(services, ("org", org_id), resolved.tier, resolved.custom, ctx)
    if resolved.refusal is not None:
        raise resolved.refusal
    ctx.org = OrgContext(org_id, resolved.role)


def answer_decision(services, req: Request, ctx: Any):
    """The rate-limit decision whose headers an answer carries. A /v1 request answered before any
    was made (a public route, or authentication failed on a storage outage) shows its address's
    budget as it stands, so no /v1 answer goes without the headers."""
    decision = getattr(ctx, "ratelimit", None)
    if decision is None and req.path.startswith("/v1/"):
        decision = services.access.rate_limiter.peek(("addr", client_addr(req)), limit_for(None, None), services.clock.now())
    return decision


def _query_for_audit(req: Request) -> str | None:
    if not req.query_string:
        return None  # without parsing nothing into req.args
    args = req.args
    if not args:
        return None
    parts = []
    for k, v in args.items(multi=True):
        parts.append(f"{k}=[redacted]" if any(word in k.lower() for word in _REDACT) else f"{k}={v}")
    return storable("&".join(parts)[:1000])


async def audit(services, status: int, req: Request, ctx: Any) -> None:
    """Record the call; by default the answer waits until its row is written (hub/settings.py audit_durable)."""
    p: Principal | None = getattr(ctx, "principal", None)
    path = req.path
    if not path.startswith("/v1/") or path in PUBLIC_PATHS:
        return
    view = ctx.view if hasattr(ctx, "view") else view_of(req, services.http_views)  # set by authenticate, unless it never ran
    if view is not None and route_auth(view).public and p is None:
        return
    o = getattr(ctx, "org", None)
    started = getattr(ctx, "started", None)
    # storable/storable_value on the text a caller chose (method, path, query, request id, address,
    # details): it may hold what PostgreSQL refuses (a NUL from %00), and the row records it escaped
    # instead of failing its batch. The rest is ours (ids, kinds, times, the endpoint's name); walking
    # the whole row was most of this function's cost.
    details = getattr(ctx, "audit_details", None)
    if req.scope.get(MCP_CHANNEL) == "mcp":
        details = {**(details or {}), "channel": "mcp", "tool": req.scope.get(MCP_TOOL)}
    row = {
        "id": fast_uuid4(), "org_id": o.org_id if o else None, "at": services.clock.now(),
        "actor_type": p.kind if p else "anonymous", "actor_id": storable(p.id) if p else None,
        "actor_user_id": p.user_id if p else None, "credential_kind": p.credential_kind if p else None,
        "method": storable(req.method), "path": storable(path), "query": _query_for_audit(req), "status": status,
        "request_id": storable(ctx.request_id), "client_addr": storable(client_addr(req)),
        "duration_ms": round((trio.current_time() - started) * 1000, 3) if started is not None else None,
        "action": req.endpoint, "target": None, "details": None if details is None else storable_value(details)}
    # While the database is known to be unreachable (this very request may have found it so) the row
    # is not waited for in PostgreSQL but in the local journal (storage/journal.py): an fsync, not a
    # second storage bound after the request's own.
    if services.settings.audit_durable:
        within = 0.0 if services.db.unreachable else services.settings.audit_journal_after
        await services.audit_log.append_written(row, within=within)
    else:
        services.audit_log.append(row)
