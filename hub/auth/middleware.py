"""Authentication, organisation context, rate limits and the audit row, for every request.

Views are authenticated and organisation-scoped unless marked: ``@public`` (health, metrics, the
OpenAPI document, the device link which checks its own device token, the OAuth token endpoint) or
``@no_org`` (the caller's own tokens, login). Credentials, in order of precedence:

- ``X-API-Token-ID`` + ``X-API-Secret-Key``: a PAT;
- ``Authorization: Bearer <jwt>``: a service account's access token (EdDSA, checked locally);
- ``Authorization: Bearer <secret>``: a PAT secret;
- the ``fleethub_session`` cookie: a dashboard session; mutating requests also need ``X-CSRF-Token``.

Lookups go through the AuthCache, so a warm request costs no storage crossing for authentication.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from quart import Request, current_app, g, request
from quart_schema import security_scheme

from hub.auth.oauth import InvalidToken, looks_like_jwt
from hub.auth.pat import digest
from hub.auth.principals import Credential, OrgContext, Principal
from hub.auth.ratelimit import limit_for
from hub.ids import fast_uuid4
from storage.text import storable, storable_value
from hub.errors import BadRequest, Forbidden, NotFound, RateLimited, Unauthenticated

ORG_HEADER = "X-Organization-ID"
_ORG_KEY = ORG_HEADER.lower()  # its key in headers_of
SESSION_COOKIE = "fleethub_session"
CSRF_HEADER = "X-CSRF-Token"
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Routes quart-schema registers for the API document; they carry no credentials.
PUBLIC_PATHS = frozenset({"/v1/openapi.json", "/v1/docs"})
# Set on the scope of a request an MCP tool makes (hub/mcp/inproc.py); never a header, so no client sets it.
MCP_CHANNEL, MCP_TOOL = "fleethub.channel", "fleethub.tool"
# Query parameters whose values never reach the audit log.
_REDACT = ("token", "secret", "password", "key", "code")


def public(view: Callable) -> Callable:
    view._fleethub_public = True
    return security_scheme([])(view)


def no_org(view: Callable) -> Callable:
    view._fleethub_no_org = True
    return view


def org_of(finder: Callable[..., Awaitable[uuid.UUID | None]]) -> Callable:
    """A route whose object names its organisation: without X-Organization-ID the call acts in that
    organisation (``await finder(services, **path values)``, None when there is no such object). The
    spec lists some routes with no organisation header (GET /rollouts/{id}, its pause). A caller who is
    not a member of it hears 404, as for a missing object; a header that names another organisation
    is used as given, and the object is not found in it."""
    def decorator(view: Callable) -> Callable:
        view._fleethub_org_of = finder
        return view

    return decorator


def session_only(view: Callable) -> Callable:
    """Only a signed-in dashboard session is ever accepted here (the assistant)."""
    view._fleethub_session_only = True
    return view


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


def header_credential(headers: dict[str, str]) -> tuple[str, str | None, str] | None:
    """The credential a request's headers carry (a PAT pair, or a bearer JWT or PAT secret), with no
    cookie: what the API takes from any client, and all that /v1/mcp takes (hub/mcp/endpoint.py)."""
    secret = headers.get("x-api-secret-key")
    if secret:
        return "pat", headers.get("x-api-token-id"), secret
    scheme, _, value = headers.get("authorization", "").partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return ("jwt", None, value) if looks_like_jwt(value) else ("bearer", None, value)
    return None


def _credential(req: Request, headers: dict[str, str]) -> tuple[str, str | None, str] | None:
    found = header_credential(headers)
    if found is not None:
        return found
    cookie = req.cookies.get(SESSION_COOKIE)
    if cookie:
        return "session", None, cookie
    return None


async def authenticate(services, req: Request, ctx: Any, headers: dict[str, str]) -> None:
    """Who is calling, checked against storage through the AuthCache; sets ``ctx.principal``,
    ``ctx.org`` and ``ctx.ratelimit`` (``ctx`` is the request's ``g``; ``headers`` its
    ``headers_of``) or raises."""
    view = ctx.view = view_of(req, services.http_views)
    path = req.path
    if view is None or getattr(view, "_fleethub_public", False) or path in PUBLIC_PATHS:
        if view is None and path.startswith("/v1/"):
            # Every /v1 answer carries the X-RateLimit-* headers (spec, Limits). An unknown route
            # names no caller, so it counts against the client's address (a prober of unknown paths
            # spends its own budget); public routes keep their own limits (the token endpoint's,
            # sign-in's) and show the address budget without spending it (answer_decision).
            _limit(services, ("addr", client_addr(req)), None, None, ctx)
        return  # unknown routes fall through to their 404/405
    if getattr(view, "_fleethub_tunnel_token", False):
        from hub.tunnels import auth as tunnel_auth  # the TunnelToken credential: these routes take only it
        await tunnel_auth.authenticate(services)
        return
    needs_org = not getattr(view, "_fleethub_no_org", False)
    org_id, org_problem = None, None
    raw = headers.get(_ORG_KEY)
    finder = getattr(view, "_fleethub_org_of", None)
    if not raw and finder is not None:
        org_id = await finder(services, **(req.view_args or {}))
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

    cred = _credential(req, headers)
    if cred is None:
        _limit(services, ("addr", client_addr(req)), None, None, ctx)
        raise Unauthenticated("authentication required: send X-API-Token-ID and X-API-Secret-Key, "
                              "or Authorization: Bearer")
    kind, token_id, secret = cred
    if kind == "jwt":
        from hub.tunnels import auth as tunnel_auth
        if tunnel_auth.accepts_tunnel_token(view, secret):
            await tunnel_auth.authenticate(services)
            if needs_org and org_problem is not None:
                raise org_problem
            return
    if kind != "session" and getattr(view, "_fleethub_session_only", False):
        # Any other credential, valid or not (PAT, service-account or tunnel token), is the wrong
        # kind here: 403, without looking it up.
        _limit(services, ("addr", client_addr(req)), None, None, ctx)
        raise Forbidden("this endpoint accepts signed-in dashboard sessions only", code="session_required")
    try:
        if kind == "jwt":
            principal, role, tier, custom = await _service(services, secret, org_id)
        elif kind == "session":
            principal, role, tier, custom = await _session(services, secret, org_id)
        else:
            principal, role, tier, custom = await _pat(services, token_id, secret, org_id, kind)
    except Unauthenticated:
        _limit(services, ("addr", client_addr(req)), None, None, ctx)
        raise
    ctx.principal = principal
    ctx.credential = Credential.of(kind, token_id, secret)  # what an open stream re-checks
    # A call counts against its organisation's tier whenever it names one the caller belongs to,
    # including calls that do not need one (/v1/me); only calls without one count per principal.
    in_org = org_problem is None and role is not None
    if req.scope.get(MCP_CHANNEL) != "mcp":  # an MCP tool's request: its MCP request was counted (hub/mcp/)
        _limit(services, ("org", org_id) if in_org else ("principal", principal.id),
               tier if in_org else None, custom if in_org else None, ctx)
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
    if needs_org:
        if org_problem is not None:
            raise org_problem
        if role is None:
            if getattr(ctx, "org_from_object", False):
                raise NotFound("not found")  # another organisation's object reads as a missing one
            raise Forbidden("not a member of this organisation")
        ctx.org = OrgContext(org_id, role)


def answer_decision(services, req: Request, ctx: Any):
    """The rate-limit decision whose headers an answer carries. A /v1 request answered before any
    was made (a public route, or authentication failed on a storage outage) shows its address's
    budget as it stands, so no /v1 answer goes without the headers."""
    decision = getattr(ctx, "ratelimit", None)
    if decision is None and req.path.startswith("/v1/"):
        decision = services.rate_limiter.peek(("addr", client_addr(req)), limit_for(None, None), services.clock.now())
    return decision


def _limit(services, key: object, tier: str | None, custom: int | None, ctx: Any = None) -> None:
    decision = services.rate_limiter.hit(key, limit_for(tier, custom), services.clock.now())
    (ctx if ctx is not None else g).ratelimit = decision
    if not decision.allowed:
        exc = RateLimited("rate limit exceeded; see X-RateLimit-Reset", retry_after=decision.retry_after)
        exc.headers.update(decision.headers())
        raise exc


async def _pat(services, token_id, secret, org_id, kind):
    return await pat_principal(services, token_id, digest(secret), org_id, kind)


async def pat_principal(services, token_id, h: bytes, org_id, kind):
    """The PAT with secret digest ``h`` and its user's role in ``org_id``; also how an open stream
    re-checks it (hub/auth/streams.py), so it never reads the request."""
    if kind == "pat" and token_id is None:
        # The spec's PAT credential is the pair: a secret alone in X-API-Secret-Key is not one
        # (the secret alone is accepted only in its documented form, Authorization: Bearer).
        raise Unauthenticated("X-API-Secret-Key needs X-API-Token-ID beside it")
    row = await services.auth_cache.get_or_load(
        ("pat", h, org_id), lambda: services.tokens.find_pat_in_org(h, org_id),
        lambda r: (f"pat:{r['id']}", f"user:{r['user_id']}", f"org:{org_id}"))
    if row is None:
        raise Unauthenticated("invalid API token")
    # One message for every failure: never tell a caller which half of a credential was wrong.
    if token_id is not None and not hmac.compare_digest(row["id"].encode(), token_id.encode()):  # bytes: any header
        raise Unauthenticated("invalid API token")
    if row["expires_at"] is not None and row["expires_at"] <= services.clock.now():
        raise Unauthenticated("API token expired")
    principal = Principal(kind="user", id=row["id"], user_id=row["user_id"], is_staff=row["is_staff"],
                          via="pat" if kind == "pat" else "bearer")
    return principal, row["role"], row["tier"], row["rate_limit"]


async def _session(services, cookie, org_id):
    h = digest(cookie)
    principal, role, tier, custom, csrf_token = await session_principal(services, h, org_id)
    g.csrf_token = csrf_token
    g.session_hash = h
    return principal, role, tier, custom


async def session_principal(services, h: bytes, org_id):
    """The session with cookie digest ``h``, its user's role in ``org_id`` and its CSRF token."""
    row = await services.auth_cache.get_or_load(
        ("session", h, org_id), lambda: services.identity.find_session_in_org(h, org_id),
        lambda r: (f"session:{h.hex()}", f"user:{r['user_id']}", f"org:{org_id}"))
    if row is None:
        raise Unauthenticated("the session ended; sign in again")
    if row["expires_at"] <= services.clock.now():
        raise Unauthenticated("the session expired; sign in again")
    principal = Principal(kind="user", id="session", user_id=row["user_id"], is_staff=row["is_staff"], via="session")
    return principal, row["role"], row["tier"], row["rate_limit"], row["csrf_token"]


async def _service(services, token, org_id):
    try:
        claims = services.token_signer.verify(token, services.clock.now())
    except InvalidToken as exc:
        raise Unauthenticated(str(exc)) from None
    if "api" not in claims.scope.split():
        raise Unauthenticated("the access token's scope does not cover the API")
    home = await services.auth_cache.get_or_load(
        ("service-org", claims.service_id), lambda: services.identity.service_account_org(claims.service_id),
        lambda _: (f"service:{claims.service_id}",))
    if home is None:
        raise Unauthenticated("the service account was deleted")
    if home != claims.org_id:
        raise Unauthenticated("the service account no longer belongs to the token's organisation")
    org = await org_row(services, claims.org_id)
    principal = Principal(kind="service", id=str(claims.service_id), service_id=claims.service_id, via="oauth")
    role = "service" if org_id == claims.org_id else None
    return principal, role, org["tier"] if org else None, org["rate_limit"] if org else None


async def org_row(services, org_id: uuid.UUID) -> dict | None:
    async def load() -> dict:
        return await services.orgs.get_org(org_id) or {}  # {}: "no such org" is cached too

    row = await services.auth_cache.get_or_load(("orgrow", org_id), load, lambda _: (f"org:{org_id}",))
    return row or None


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
    if view is not None and getattr(view, "_fleethub_public", False) and p is None:
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
