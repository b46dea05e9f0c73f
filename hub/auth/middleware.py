"""Authentication and organisation context for every request, and the audit row after it.

Views are authenticated and organisation-scoped unless marked: ``@public`` (health, metrics, the
OpenAPI document, the device link which checks its own device token) or ``@no_org`` (the caller's
own tokens). A PAT and its user's role in the organisation are found in one storage crossing.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable

from quart import current_app, g, request
from quart_schema import security_scheme

from hub.auth.pat import digest
from hub.auth.principals import OrgContext, Principal
from hub.errors import BadRequest, Forbidden, Unauthenticated

ORG_HEADER = "X-Organization-ID"
# Routes quart-schema registers for the API document; they carry no credentials.
PUBLIC_PATHS = frozenset({"/v1/openapi.json", "/v1/docs"})


def public(view: Callable) -> Callable:
    view._fleethub_public = True
    return security_scheme([])(view)


def no_org(view: Callable) -> Callable:
    view._fleethub_no_org = True
    return view


def _view() -> Callable | None:
    if request.routing_exception is not None or request.endpoint is None:
        return None
    return current_app.view_functions.get(request.endpoint)


def _credentials() -> tuple[str | None, str] | None:
    token_id = request.headers.get("X-API-Token-ID")
    secret = request.headers.get("X-API-Secret-Key")
    if secret:
        return token_id, secret
    auth = request.headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return None, value.strip()
    return None


async def authenticate(services) -> None:
    view = _view()
    if view is None or getattr(view, "_fleethub_public", False) or request.path in PUBLIC_PATHS:
        return  # unknown routes fall through to their 404/405
    creds = _credentials()
    if creds is None:
        raise Unauthenticated("authentication required: send X-API-Token-ID and X-API-Secret-Key, "
                              "or Authorization: Bearer")
    token_id, secret = creds
    needs_org = not getattr(view, "_fleethub_no_org", False)
    org_id = None
    if needs_org:
        raw = request.headers.get(ORG_HEADER)
        if not raw:
            # Authenticate first so an anonymous caller learns nothing but 401.
            await _principal(services, token_id, secret, None)
            raise BadRequest(f"the {ORG_HEADER} header is required", code="missing_organization")
        try:
            org_id = uuid.UUID(raw)
        except ValueError:
            await _principal(services, token_id, secret, None)
            raise BadRequest(f"{ORG_HEADER} is not a valid organisation id", code="invalid_organization") from None
    role = await _principal(services, token_id, secret, org_id)
    if needs_org:
        if role is None:
            raise Forbidden("not a member of this organisation")
        g.org = OrgContext(org_id, role)


async def _principal(services, token_id: str | None, secret: str, org_id: uuid.UUID | None) -> str | None:
    row = await services.tokens.find_pat_in_org(digest(secret), org_id)
    # One message for every failure: never tell a caller which half of a credential was wrong.
    if row is None or (token_id is not None and not hmac.compare_digest(row["id"], token_id)):
        raise Unauthenticated("invalid API token")
    if row["expires_at"] is not None and row["expires_at"] <= services.clock.now():
        raise Unauthenticated("API token expired")
    g.principal = Principal(kind="user", id=row["id"], user_id=row["user_id"], is_staff=row["is_staff"],
                            via="pat" if token_id else "bearer")
    return row["role"]


def audit(services, status: int) -> None:
    p: Principal | None = getattr(g, "principal", None)
    if p is None or not request.path.startswith("/v1/"):
        return
    o = getattr(g, "org", None)
    services.audit_log.append({
        "id": uuid.uuid4(), "org_id": o.org_id if o else None, "at": services.clock.now(),
        **p.audit_actor, "method": request.method, "path": request.path, "status": status,
        "request_id": g.request_id, "action": request.endpoint, "target": None, "details": None})
