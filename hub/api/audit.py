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


def event_json(e: dict) -> dict:
    return jsonable({
        "id": e["id"], "at": e["at"], "organizationId": e["org_id"], "actorType": e["actor_type"],
        "actorUserId": e["actor_user_id"], "credentialKind": e["credential_kind"], "credentialId": e["actor_id"],
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
    rows, total = await s.audit.query(org().org_id, offset=(q.page - 1) * q.limit, limit=q.limit, since=q.from_,
                                      until=q.to, method=q.method, path_prefix=q.pathPrefix,
                                      actor_user_id=q.actorUserId)
    return {"data": [event_json(r) for r in rows], "pagination": pagination(q.page, q.limit, total)}
