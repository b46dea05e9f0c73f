"""The TunnelToken credential (DESIGN.md section 8): what the session endpoints accept, and only them.

A view marked ``@tunnel_token`` takes ``Authorization: Bearer <tunnel token>`` and nothing else (a
PAT, an API JWT or a session cookie is a 401 there); ``@also_tunnel_token`` takes it beside the general
credentials. The scheme is registered with authentication's (hub/auth/schemes.py), which the
middleware asks: hub/auth imports nothing of tunnels. The token binds the organisation; the caller's
membership (or the service account's existence) is checked again on every request, so a member
removed from the organisation loses their tunnels at once, not when the token expires.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt
from quart import Request
from quart_schema import security_scheme

from hub.auth.oauth import looks_like_jwt
from hub.auth.principals import Principal
from hub.auth.routes import RouteAuth, declare
from hub.auth.schemes import SCHEMES, Found, Resolved, bearer_of, org_row
from hub.errors import FleethubError, Forbidden, Unauthenticated
from hub.tunnels.tokens import TUNNEL_AUDIENCE, BadTunnelToken

SCHEME = "TunnelToken"  # its name in /v1/openapi.json
KIND = "tunnel"         # its kind among the credential schemes


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
    return security_scheme([{SCHEME: []}])(declare(view, only=KIND, needs_org=False, org_in_credential=True))


def also_tunnel_token(view: Callable) -> Callable:
    """The view also recognises a tunnel token beside the general credentials (the spec's "Bearer"
    rows: tunnel usage; and a test boot, which must refuse a CLI token as 403 operator_required
    rather than not knowing it). The view sees a ``TunnelPrincipal`` and decides what it may do."""
    return declare(view, also=frozenset({KIND}))


class TunnelTokenScheme:
    kind = KIND
    general = False

    def find(self, req: Request | None, headers: dict[str, str], route: RouteAuth) -> Found | None:
        """Where the route takes tunnel tokens alone, any bearer (verified by ``resolve``); beside the
        general credentials, only a JWT whose (unverified) audience is the tunnel one."""
        value = bearer_of(headers)
        if value is None or (route.only != KIND and not _for_tunnels(value)):
            return None
        return Found(KIND, None, value, headers.get("x-organization-id"))

    async def resolve(self, services: Any, found: Found, org_id: uuid.UUID | None) -> Resolved:
        try:
            claims = services.tunnels.tokens.verify(found.secret, services.clock.now())
        except BadTunnelToken as exc:
            raise Unauthenticated(str(exc)) from None
        bound = claims.org_id
        if claims.kind == "user":
            role = await services.access.auth_cache.get_or_load(
                ("member", bound, claims.subject_id), lambda: _role(services, bound, claims.subject_id),
                lambda _: (f"user:{claims.subject_id}", f"org:{bound}"))
            principal = TunnelPrincipal(kind="user", id=claims.credential or claims.principal,
                                        user_id=claims.subject_id, via="tunnel")
        else:
            alive = await services.access.auth_cache.get_or_load(
                ("service", claims.subject_id), lambda: services.stores.identity.service_account_exists(claims.subject_id),
                lambda _: (f"service:{claims.subject_id}",))
            if not alive:
                raise Unauthenticated("the service account was deleted")
            role = "service"
            principal = TunnelPrincipal(kind="service", id=str(claims.subject_id), service_id=claims.subject_id,
                                        via="tunnel")
        org = await org_row(services, bound)
        refusal = None
        asked = found.extra  # the X-Organization-ID header as sent
        if asked and asked != str(bound):
            refusal = Forbidden("the tunnel token is for another organisation", code="forbidden")
        elif not role:
            refusal = Forbidden("not a member of this organisation", code="forbidden")
        return Resolved(principal, role or None, org["tier"] if org else None, org["rate_limit"] if org else None,
                        bound_org=bound, refusal=refusal)

    def missing(self) -> FleethubError:
        return Unauthenticated("this endpoint takes a tunnel token: Authorization: Bearer <token from "
                               "POST /v1/cli/tunnel/token>")

    def other(self) -> FleethubError:
        return self.missing()


def _for_tunnels(bearer: str) -> bool:
    """Whether ``bearer`` is a JWT whose (unverified) audience is the tunnel one; resolve verifies it."""
    if not looks_like_jwt(bearer):
        return False  # a PAT secret: not decoded at all
    try:
        claims = jwt.decode(bearer, options={"verify_signature": False})
    except Exception:  # any fault of a caller's token (a header nested too deep for json) is "no"
        return False
    return claims.get("aud") == TUNNEL_AUDIENCE


# Ahead of the service account's token: both are bearer JWTs, and where a route takes tunnel tokens
# one of theirs is read as such.
SCHEMES.register(TunnelTokenScheme(), before="jwt")


async def _role(services, org_id, user_id) -> str:
    return await services.stores.orgs.role_of(org_id, user_id) or ""  # "": "no role" is cached too
