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
from collections.abc import Callable

import trio
from quart import current_app, g, request
from quart_schema import security_scheme

from hub.auth.oauth import InvalidToken, looks_like_jwt
from hub.auth.pat import digest
from hub.auth.principals import Credential, OrgContext, Principal
from hub.auth.ratelimit import limit_for
from hub.ids import fast_uuid4
from storage.text import storable_value
from hub.errors import BadRequest, Forbidden, RateLimited, Unauthenticated

ORG_HEADER = "X-Organization-ID"
SESSION_COOKIE = "fleethub_session"
CSRF_HEADER = "X-CSRF-Token"
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Routes quart-schema registers for the API document; they carry no credentials.
PUBLIC_PATHS = frozenset({"/v1/openapi.json", "/v1/docs"})
# Query parameters whose values never reach the audit log.
_REDACT = ("token", "secret", "password", "key", "code")


def public(view: Callable) -> Callable:
    view._fleethub_public = True
    return security_scheme([])(view)


def no_org(view: Callable) -> Callable:
    view._fleethub_no_org = True
    return view


def session_only(view: Callable) -> Callable:
    """Only a signed-in dashboard session is ever accepted here (the assistant)."""
    view._fleethub_session_only = True
    return view


def _view() -> Callable | None:
    if request.routing_exception is not None or request.endpoint is None:
        return None
    return current_app.view_functions.get(request.endpoint)


def client_addr() -> str:
    return (request.remote_addr or "").split(",")[0].strip() or "unknown"


def _credential() -> tuple[str, str | None, str] | None:
    secret = request.headers.get("X-API-Secret-Key")
    if secret:
        return "pat", request.headers.get("X-API-Token-ID"), secret
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return ("jwt", None, value) if looks_like_jwt(value) else ("bearer", None, value)
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        return "session", None, cookie
    return None


async def authenticate(services) -> None:
    g.started = trio.current_time()
    view = _view()
    if view is None or getattr(view, "_fleethub_public", False) or request.path in PUBLIC_PATHS:
        if view is None and request.path.startswith("/v1/"):
            # Every /v1 answer carries the X-RateLimit-* headers (spec, Limits). An unknown route
            # names no caller, so it counts against the client's address (a prober of unknown paths
            # spends its own budget); public routes keep their own limits (the token endpoint's,
            # sign-in's) and show the address budget without spending it (answer_decision).
            _limit(services, ("addr", client_addr()), None, None)
        return  # unknown routes fall through to their 404/405
    if getattr(view, "_fleethub_tunnel_token", False):
        from hub.tunnels import auth as tunnel_auth  # the TunnelToken credential: these routes take only it
        await tunnel_auth.authenticate(services)
        return
    needs_org = not getattr(view, "_fleethub_no_org", False)
    org_id, org_problem = None, None
    raw = request.headers.get(ORG_HEADER)
    if not raw:
        org_problem = BadRequest(f"the {ORG_HEADER} header is required", code="missing_organization")
    else:
        try:
            org_id = uuid.UUID(raw)
        except ValueError:
            org_problem = BadRequest(f"{ORG_HEADER} is not a valid organisation id", code="invalid_organization")

    cred = _credential()
    if cred is None:
        _limit(services, ("addr", client_addr()), None, None)
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
        _limit(services, ("addr", client_addr()), None, None)
        raise Forbidden("this endpoint accepts signed-in dashboard sessions only", code="session_required")
    try:
        if kind == "jwt":
            principal, role, tier, custom = await _service(services, secret, org_id)
        elif kind == "session":
            principal, role, tier, custom = await _session(services, secret, org_id)
        else:
            principal, role, tier, custom = await _pat(services, token_id, secret, org_id, kind)
    except Unauthenticated:
        _limit(services, ("addr", client_addr()), None, None)
        raise
    g.principal = principal
    g.credential = Credential.of(kind, token_id, secret)  # what an open stream re-checks
    # A call counts against its organisation's tier whenever it names one the caller belongs to,
    # including calls that do not need one (/v1/me); only calls without one count per principal.
    in_org = org_problem is None and role is not None
    _limit(services, ("org", org_id) if in_org else ("principal", principal.id),
           tier if in_org else None, custom if in_org else None)
    if principal.via == "session" and request.method in MUTATING:
        expected = getattr(g, "csrf_token", None)
        # bytes: compare_digest refuses str with non-ASCII characters (a TypeError, a 500)
        if not expected or not hmac.compare_digest(request.headers.get(CSRF_HEADER, "").encode(), expected.encode()):
            raise Forbidden(f"a request made with the session cookie needs the {CSRF_HEADER} header",
                            code="csrf_required")
    if needs_org:
        if org_problem is not None:
            raise org_problem
        if role is None:
            raise Forbidden("not a member of this organisation")
        g.org = OrgContext(org_id, role)


def answer_decision(services):
    """The rate-limit decision whose headers an answer carries. A /v1 request answered before any
    was made (a public route, or authentication failed on a storage outage) shows its address's
    budget as it stands, so no /v1 answer goes without the headers."""
    decision = getattr(g, "ratelimit", None)
    if decision is None and request.path.startswith("/v1/"):
        decision = services.rate_limiter.peek(("addr", client_addr()), limit_for(None, None), services.clock.now())
    return decision


def _limit(services, key: object, tier: str | None, custom: int | None) -> None:
    decision = services.rate_limiter.hit(key, limit_for(tier, custom), services.clock.now())
    g.ratelimit = decision
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


def _query_for_audit() -> str | None:
    if not request.args:
        return None
    parts = []
    for k, v in request.args.items(multi=True):
        parts.append(f"{k}=[redacted]" if any(word in k.lower() for word in _REDACT) else f"{k}={v}")
    return "&".join(parts)[:1000]


def audit(services, status: int) -> None:
    p: Principal | None = getattr(g, "principal", None)
    if not request.path.startswith("/v1/") or request.path in PUBLIC_PATHS:
        return
    view = _view()
    if view is not None and getattr(view, "_fleethub_public", False) and p is None:
        return
    o = getattr(g, "org", None)
    started = getattr(g, "started", None)
    # storable_value: the request's own text (path, query, details) may hold what PostgreSQL refuses (a
    # NUL from %00); the row records it escaped instead of failing its batch.
    services.audit_log.append(storable_value({
        "id": fast_uuid4(), "org_id": o.org_id if o else None, "at": services.clock.now(),
        "actor_type": p.kind if p else "anonymous", "actor_id": p.id if p else None,
        "actor_user_id": p.user_id if p else None, "credential_kind": p.credential_kind if p else None,
        "method": request.method, "path": request.path, "query": _query_for_audit(), "status": status,
        "request_id": g.request_id, "client_addr": client_addr(),
        "duration_ms": round((trio.current_time() - started) * 1000, 3) if started is not None else None,
        "action": request.endpoint, "target": None, "details": getattr(g, "audit_details", None)}))
