"""GET /v1/audit-events: the organisation's API calls, newest first (spec, Audit)."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint

from hub.api.common import MAX_PAGE, Pagination, errors, jsonable, org, pagination, services
from hub.api.validation import query, responds
from hub.auth.authz import require_org
from hub.billing.state import require_feature
from hub.errors import BadRequest
from hub.instants import Instant

bp = Blueprint("audit", __name__, url_prefix="/v1")


class AuditQuery(BaseModel):
    # Unknown parameters are refused too: a typo in a filter must not silently widen the result.
    model_config = ConfigDict(extra="forbid")
    page: int = Field(1, ge=1, le=MAX_PAGE)
    limit: int = Field(50, ge=1, le=1000)
    from_: Instant | None = Field(None, alias="from")  # aware, in range (hub/instants.py), in UTC
    to: Instant | None = None
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"] | None = None
    pathPrefix: str | None = Field(None, min_length=1, max_length=1000)
    actorUserId: uuid.UUID | None = None


class AuditEvent(BaseModel):
    id: str
    at: str
    organizationId: str | None
    actorType: str
    actorUserId: str | None
    actorDisplay: str = Field(description="who called, as a person reads it: the user's email with the "
                                          "token's description (or id) for a PAT, the service account's "
                                          "name; a user, token or service account deleted since shows "
                                          "its id and (deleted)")
    credentialKind: str | None
    credentialId: str | None
    method: str
    path: str
    query: str | None
    status: int
    requestId: str
    clientAddress: str | None
    durationMs: float | None
    action: str | None
    details: dict


class AuditPage(BaseModel):
    data: list[AuditEvent]
    pagination: Pagination


def actor_display(e: dict) -> str:
    """The actor as the audit page names it, from the names storage joined to the event (now, not
    when the call was made: a renamed token shows its new description)."""
    if e["actor_type"] == "service":
        name = e.get("actor_service_name")
        return f"service account {name}" if name is not None else f"service account {e['actor_id']} (deleted)"
    if e["actor_type"] != "user":
        return e["actor_type"]  # anonymous, system
    email = e.get("actor_email")
    if email is None:
        return f"user {e['actor_user_id']} (deleted)"  # their tokens went with them
    token = e["actor_id"]
    if e["credential_kind"] not in ("pat", "tunnel_token") or token in (None, "session"):
        return email
    if not e.get("actor_token_found"):
        return f"{email}, token {token} (deleted)"
    description = e.get("actor_token_description")
    return f'{email}, token "{description}"' if description else f"{email}, token {token}"


def event_json(e: dict) -> dict:
    return jsonable({
        "id": e["id"], "at": e["at"], "organizationId": e["org_id"], "actorType": e["actor_type"],
        "actorUserId": e["actor_user_id"], "actorDisplay": actor_display(e), "credentialKind": e["credential_kind"],
        "credentialId": e["actor_id"],
        "method": e["method"], "path": e["path"], "query": e["query"], "status": e["status"],
        "requestId": e["request_id"], "clientAddress": e["client_addr"], "durationMs": e["duration_ms"],
        "action": e["action"], "details": e["details"] or {}})


@bp.get("/audit-events")
@query(AuditQuery)
@responds(AuditPage)
@errors(400, 401, 403, 500)
async def list_audit_events(query_args: AuditQuery):
    s = services()
    await require_org(s, "audit_viewer")
    await require_feature(s, org().org_id, "audit_log")  # the entitlement gates reading (docs/billing.md)
    q = query_args
    if q.from_ and q.to and q.from_ > q.to:
        raise BadRequest("from must not be after to", code="invalid_range")
    # Calls answered just before this one are still in the write-behind batch: flush it first so
    # the log a caller reads includes everything up to their own request.
    await s.audit_log.flush()
    rows, total = await s.stores.audit.query(org().org_id, offset=(q.page - 1) * q.limit, limit=q.limit, since=q.from_,
                                      until=q.to, method=q.method, path_prefix=q.pathPrefix,
                                      actor_user_id=q.actorUserId)
    return {"data": [event_json(r) for r in rows], "pagination": pagination(q.page, q.limit, total)}
