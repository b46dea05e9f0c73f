"""The TunnelToken credential (DESIGN.md section 8): what the session endpoints accept, and only them.

A view marked ``@tunnel_token`` is authenticated here instead of by the general chain in
hub/auth/middleware.py: it takes ``Authorization: Bearer <tunnel token>`` and nothing else (a PAT,
an API JWT or a session cookie is a 401 there). The token binds the organisation; the caller's
membership (or the service account's existence) is checked again on every request, so a member
removed from the organisation loses their tunnels at once, not when the token expires.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jwt
from quart import g, request
from quart_schema import security_scheme

from hub.auth import middleware
from hub.auth.principals import OrgContext, Principal
from hub.errors import Forbidden, Unauthenticated
from hub.tunnels.tokens import TUNNEL_AUDIENCE, BadTunnelToken

SCHEME = "TunnelToken"


@dataclass(frozen=True)
class TunnelPrincipal(Principal):
    """A principal that came with a tunnel token; ``id`` is the credential the token was made from."""

    @property
    def credential_kind(self) -> str:
        return "tunnel_token"

    @property
    def name(self) -> str:
        """How grants and sessions name the principal: ``user:<id>`` or ``service:<id>``."""
        return f"user:{self.user_id}" if self.kind == "user" else f"service:{self.service_id}"


def tunnel_token(view: Callable) -> Callable:
    view._fleethub_tunnel_token = True
    return security_scheme([{SCHEME: []}])(view)


def also_tunnel_token(view: Callable) -> Callable:
    """The view also recognises a tunnel token beside the general credentials (the spec's "Bearer"
    rows: tunnel usage; and a test boot, which must refuse a CLI token as 403 operator_required
    rather than not knowing it). The view sees a ``TunnelPrincipal`` and decides what it may do."""
    view._fleethub_also_tunnel_token = True
    return view


def accepts_tunnel_token(view: Callable | None, bearer: str) -> bool:
    """Whether ``bearer`` on ``view`` is to be checked as a tunnel token: only where the view says so,
    and only for a JWT whose (unverified) audience is the tunnel one — authenticate() verifies it."""
    if view is None or not getattr(view, "_fleethub_also_tunnel_token", False):
        return False
    try:
        claims = jwt.decode(bearer, options={"verify_signature": False})
    except Exception:  # any fault of a caller's token (a header nested too deep for json) is "no"
        return False
    return claims.get("aud") == TUNNEL_AUDIENCE


def is_tunnel_view(view: Callable | None) -> bool:
    return bool(view is not None and getattr(view, "_fleethub_tunnel_token", False))


async def authenticate(services) -> None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    value = value.strip()
    addr = ("addr", middleware.client_addr())
    if scheme.lower() != "bearer" or not value or request.headers.get("X-API-Secret-Key"):
        middleware._limit(services, addr, None, None)
        raise Unauthenticated("this endpoint takes a tunnel token: Authorization: Bearer <token from "
                              "POST /v1/cli/tunnel/token>")
    try:
        claims = services.tunnels.tokens.verify(value, services.clock.now())
    except BadTunnelToken as exc:
        middleware._limit(services, addr, None, None)
        raise Unauthenticated(str(exc)) from None
    org_id = claims.org_id
    if claims.kind == "user":
        role = await services.auth_cache.get_or_load(
            ("member", org_id, claims.subject_id), lambda: _role(services, org_id, claims.subject_id),
            lambda _: (f"user:{claims.subject_id}", f"org:{org_id}"))
        principal = TunnelPrincipal(kind="user", id=claims.credential or claims.principal,
                                    user_id=claims.subject_id, via="tunnel")
    else:
        alive = await services.auth_cache.get_or_load(
            ("service", claims.subject_id), lambda: services.identity.service_account_exists(claims.subject_id),
            lambda _: (f"service:{claims.subject_id}",))
        if not alive:
            raise Unauthenticated("the service account was deleted")
        role = "service"
        principal = TunnelPrincipal(kind="service", id=str(claims.subject_id), service_id=claims.subject_id,
                                    via="tunnel")
    g.principal = principal
    org = await middleware.org_row(services, org_id)
    middleware._limit(services, ("org", org_id), org["tier"] if org else None, org["rate_limit"] if org else None)
    raw = request.headers.get(middleware.ORG_HEADER)
    if raw and raw != str(org_id):
        raise Forbidden("the tunnel token is for another organisation", code="forbidden")
    if not role:
        raise Forbidden("not a member of this organisation", code="forbidden")
    g.org = OrgContext(org_id, role)


async def _role(services, org_id, user_id) -> str:
    return await services.orgs.role_of(org_id, user_id) or ""  # "": "no role" is cached too
