"""Credential schemes: how a request carries each kind of credential and who it names.

The middleware (hub/auth/middleware.py) asks ``SCHEMES`` in order of precedence; the first scheme
that finds its credential in the request decides who is calling. The general ones are the spec's
credentials for any API route:

- ``pat``: ``X-API-Token-ID`` + ``X-API-Secret-Key``;
- ``jwt``: ``Authorization: Bearer <jwt>``, a service account's access token (EdDSA, checked locally);
- ``bearer``: ``Authorization: Bearer <secret>``, a PAT secret;
- ``session``: the ``fleethub_session`` cookie, a dashboard session.

Another part of the hub adds its own with ``SCHEMES.register`` (hub/tunnels/auth.py: the tunnel
token, taken only where a route declares it, hub/auth/routes.py); authentication imports none of them.

A scheme turns its credential into a ``Resolved``: the principal, its role in the organisation asked
for and that organisation's tier, through the AuthCache (a warm request costs no storage crossing),
or raises ``Unauthenticated``. The lookups are public functions because an open stream re-checks its
credential (hub/auth/streams.py) and /v1/mcp authenticates outside Quart (hub/mcp/endpoint.py).
"""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from quart import Request

from hub.auth.oauth import InvalidToken, looks_like_jwt
from hub.auth.pat import digest
from hub.auth.principals import Credential, Principal
from hub.auth.routes import DEFAULT, RouteAuth
from hub.errors import FleethubError, Forbidden, Unauthenticated

SESSION_COOKIE = "fleethub_session"


class Found(NamedTuple):  # a tuple: made on every request, where a frozen dataclass costs a microsecond
    """A credential as a request carries it; ``extra`` is what its scheme keeps beside it."""
    kind: str
    token_id: str | None
    secret: str
    extra: Any = None


@dataclass(slots=True)  # not frozen: made on every request, where a frozen one's __init__ costs 1.3 us
class Resolved:
    principal: Principal
    role: str | None                  # in the organisation asked for (or bound); None: not a member
    tier: str | None
    custom: int | None                # the organisation's negotiated limit (enterprise)
    credential: Credential | None = None  # what an open stream re-checks; None: streams never see it
    # A credential that binds its organisation (a tunnel token) names it here: the call is counted
    # and acts there, and ``refusal`` (the scheme's word on the organisation asked for) is raised
    # once the call has been counted.
    bound_org: uuid.UUID | None = None
    refusal: FleethubError | None = None
    csrf_token: str | None = None     # a session's
    session_hash: bytes | None = None


class CredentialScheme(Protocol):
    kind: str
    general: bool  # one of the spec's credentials for every API route (else only where a route takes it)

    def find(self, req: Request | None, headers: dict[str, str], route: RouteAuth) -> Found | None:
        """This scheme's credential in the request, or None. ``headers``: lower-case names; ``req``
        None: the headers alone (a scheme that needs more finds nothing)."""

    async def resolve(self, services: Any, found: Found, org_id: uuid.UUID | None) -> Resolved:
        """Who the credential names, or Unauthenticated."""

    def missing(self) -> FleethubError:
        """The answer of a route that takes only this scheme to a request without its credential."""

    def other(self) -> FleethubError:
        """The answer of such a route to a request with another scheme's credential."""


def unauthenticated() -> Unauthenticated:
    return Unauthenticated("authentication required: send X-API-Token-ID and X-API-Secret-Key, "
                           "or Authorization: Bearer")


def bearer_of(headers: dict[str, str]) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    value = value.strip()
    return value if value and scheme.lower() == "bearer" else None


class _General:
    """What the general schemes share: no route takes one of them alone but the session."""
    general = True

    def missing(self) -> FleethubError:
        return unauthenticated()

    def other(self) -> FleethubError:
        return unauthenticated()


class PatScheme(_General):
    kind = "pat"

    def find(self, req: Request | None, headers: dict[str, str], route: RouteAuth) -> Found | None:
        secret = headers.get("x-api-secret-key")
        return Found("pat", headers.get("x-api-token-id"), secret) if secret else None

    async def resolve(self, services: Any, found: Found, org_id: uuid.UUID | None) -> Resolved:
        principal, role, tier, custom = await pat_principal(services, found.token_id, digest(found.secret),
                                                            org_id, found.kind)
        return Resolved(principal, role, tier, custom, Credential.of(found.kind, found.token_id, found.secret))


class BearerPatScheme(PatScheme):
    """A PAT's secret alone, in its documented form ``Authorization: Bearer``."""
    kind = "bearer"

    def find(self, req: Request | None, headers: dict[str, str], route: RouteAuth) -> Found | None:
        value = bearer_of(headers)
        return Found("bearer", None, value) if value is not None and not looks_like_jwt(value) else None


class ServiceTokenScheme(_General):
    kind = "jwt"

    def find(self, req: Request | None, headers: dict[str, str], route: RouteAuth) -> Found | None:
        value = bearer_of(headers)
        return Found("jwt", None, value) if value is not None and looks_like_jwt(value) else None

    async def resolve(self, services: Any, found: Found, org_id: uuid.UUID | None) -> Resolved:
        principal, role, tier, custom = await service_principal(services, found.secret, org_id)
        return Resolved(principal, role, tier, custom, Credential.of("jwt", None, found.secret))


class SessionScheme(_General):
    kind = "session"

    def find(self, req: Request | None, headers: dict[str, str], route: RouteAuth) -> Found | None:
        cookie = req.cookies.get(SESSION_COOKIE) if req is not None else None
        return Found("session", None, cookie) if cookie else None

    async def resolve(self, services: Any, found: Found, org_id: uuid.UUID | None) -> Resolved:
        h = digest(found.secret)
        principal, role, tier, custom, csrf_token = await session_principal(services, h, org_id)
        return Resolved(principal, role, tier, custom, Credential.of("session", None, found.secret),
                        csrf_token=csrf_token, session_hash=h)

    def other(self) -> FleethubError:
        # Any other credential, valid or not (PAT, service-account or tunnel token), is the wrong
        # kind here: 403, without looking it up.
        return Forbidden("this endpoint accepts signed-in dashboard sessions only", code="session_required")


class Schemes:
    """The credential schemes in order of precedence."""

    def __init__(self, schemes: list[CredentialScheme]) -> None:
        self._schemes = list(schemes)
        # by the declaration's id (hashing a RouteAuth on every request costs more than finding the
        # credential), with the declaration itself, so an id reused by a new object is not taken for it
        self._asked: dict[int, tuple[RouteAuth, tuple[CredentialScheme, ...]]] = {}

    def register(self, scheme: CredentialScheme, before: str) -> None:
        """Add ``scheme`` just ahead of the one of kind ``before`` (again: replaces it)."""
        schemes = [s for s in self._schemes if s.kind != scheme.kind]
        at = next(i for i, s in enumerate(schemes) if s.kind == before)
        self._schemes = schemes[:at] + [scheme] + schemes[at:]
        self._asked.clear()

    def named(self, kind: str) -> CredentialScheme:
        return next(s for s in self._schemes if s.kind == kind)

    def asked(self, route: RouteAuth) -> tuple[CredentialScheme, ...]:
        """The schemes looked for on ``route``, in order (worked out once per declaration)."""
        known = self._asked.get(id(route))
        if known is None or known[0] is not route:
            known = self._asked[id(route)] = (route, tuple(s for s in self._schemes if route.asks(s.kind, s.general)))
        return known[1]

    def find(self, req: Request | None, headers: dict[str, str],
             route: RouteAuth) -> tuple[CredentialScheme, Found] | None:
        for scheme in self.asked(route):
            found = scheme.find(req, headers, route)
            if found is not None:
                return scheme, found
        return None


_HEADER_SCHEMES: tuple[CredentialScheme, ...] = (PatScheme(), ServiceTokenScheme(), BearerPatScheme())
SCHEMES = Schemes([*_HEADER_SCHEMES, SessionScheme()])


def header_credential(headers: dict[str, str]) -> tuple[CredentialScheme, Found] | None:
    """The credential a request's headers carry (a PAT pair, or a bearer JWT or PAT secret), with no
    cookie: what the API takes from any client, and all that /v1/mcp takes (hub/mcp/endpoint.py)."""
    for scheme in _HEADER_SCHEMES:
        found = scheme.find(None, headers, DEFAULT)
        if found is not None:
            return scheme, found
    return None


async def pat_principal(services: Any, token_id: str | None, h: bytes, org_id: uuid.UUID | None, kind: str):
    """The PAT with secret digest ``h`` and its user's role in ``org_id``; also how an open stream
    re-checks it (hub/auth/streams.py), so it never reads the request."""
    if kind == "pat" and token_id is None:
        # The spec's PAT credential is the pair: a secret alone in X-API-Secret-Key is not one
        # (the secret alone is accepted only in its documented form, Authorization: Bearer).
        raise Unauthenticated("X-API-Secret-Key needs X-API-Token-ID beside it")
    row = await services.access.auth_cache.get_or_load(
        ("pat", h, org_id), lambda: services.stores.tokens.find_pat_in_org(h, org_id),
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


async def session_principal(services: Any, h: bytes, org_id: uuid.UUID | None):
    """The session with cookie digest ``h``, its user's role in ``org_id`` and its CSRF token."""
    row = await services.access.auth_cache.get_or_load(
        ("session", h, org_id), lambda: services.stores.identity.find_session_in_org(h, org_id),
        lambda r: (f"session:{h.hex()}", f"user:{r['user_id']}", f"org:{org_id}"))
    if row is None:
        raise Unauthenticated("the session ended; sign in again")
    if row["expires_at"] <= services.clock.now():
        raise Unauthenticated("the session expired; sign in again")
    principal = Principal(kind="user", id="session", user_id=row["user_id"], is_staff=row["is_staff"], via="session")
    return principal, row["role"], row["tier"], row["rate_limit"], row["csrf_token"]


async def service_principal(services: Any, token: str, org_id: uuid.UUID | None):
    """The service account a (verified) access token names, its role in ``org_id`` ("service" in its
    own organisation, else None) and the tier of its organisation."""
    try:
        claims = services.access.token_signer.verify(token, services.clock.now())
    except InvalidToken as exc:
        raise Unauthenticated(str(exc)) from None
    if "api" not in claims.scope.split():
        raise Unauthenticated("the access token's scope does not cover the API")
    home = await services.access.auth_cache.get_or_load(
        ("service-org", claims.service_id), lambda: services.stores.identity.service_account_org(claims.service_id),
        lambda _: (f"service:{claims.service_id}",))
    if home is None:
        raise Unauthenticated("the service account was deleted")
    if home != claims.org_id:
        raise Unauthenticated("the service account no longer belongs to the token's organisation")
    org = await org_row(services, claims.org_id)
    principal = Principal(kind="service", id=str(claims.service_id), service_id=claims.service_id, via="oauth")
    role = "service" if org_id == claims.org_id else None
    return principal, role, org["tier"] if org else None, org["rate_limit"] if org else None


async def org_row(services: Any, org_id: uuid.UUID) -> dict | None:
    async def load() -> dict:
        return await services.stores.orgs.get_org(org_id) or {}  # {}: "no such org" is cached too

    row = await services.access.auth_cache.get_or_load(("orgrow", org_id), load, lambda _: (f"org:{org_id}",))
    return row or None
