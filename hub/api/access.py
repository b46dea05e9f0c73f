"""Who may do what: the caller (GET /v1/me), members, relation tuples, service accounts.

Managing access is the organisation admin's job: every mutation here needs the admin role, and
each one invalidates the cached lookups it affects before it answers (hub/auth/cache.py).
"""

from __future__ import annotations

import secrets
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from quart import Blueprint

from hub.api.common import errors, jsonable, org, parse_uuid, principal, services
from hub.api.validation import DeletedOut, body, enveloped, responds
from hub.auth.pat import cli_safe_secret
from hub.auth.authz import OBJECT_TYPES, RELATIONS, require_admin
from hub.auth.middleware import no_org
from hub.auth.pat import digest
from hub.errors import BadRequest, Conflict, NotFound
from storage.identity import DuplicateServiceAccount

bp = Blueprint("access", __name__, url_prefix="/v1")

Relation = Literal["viewer", "editor", "billing_viewer", "billing_admin", "tunnel_access", "audit_viewer"]
ObjectType = Literal["organization", "fleet", "device", "configuration"]
assert set(Relation.__args__) == set(RELATIONS) and set(ObjectType.__args__) == set(OBJECT_TYPES)


class Me(BaseModel):
    kind: str
    credential: str
    credentialId: str
    userId: str | None
    serviceAccountId: str | None
    organizations: list[dict]


class MeEnvelope(BaseModel):
    data: Me


@bp.get("/me")
@no_org
@responds(MeEnvelope)
@errors(401)
async def me():
    p = principal()
    s = services()
    orgs = []
    if p.user_id is not None:
        rows = await s.db.fetch(
            "SELECT o.id, o.name, o.tier, m.role FROM memberships m JOIN organizations o ON o.id = m.org_id "
            "WHERE m.user_id = $1 ORDER BY o.name", p.user_id)
        orgs = [{"id": str(r["id"]), "name": r["name"], "tier": r["tier"], "role": r["role"]} for r in rows]
    return {"data": {"kind": p.kind, "credential": p.credential_kind, "credentialId": p.id,
                     "userId": str(p.user_id) if p.user_id else None,
                     "serviceAccountId": str(p.service_id) if p.service_id else None, "organizations": orgs}}


# -- members ---------------------------------------------------------------------------------
class MemberAdd(BaseModel):
    model_config = ConfigDict(extra="forbid")
    email: str = Field(..., min_length=3, max_length=320)
    role: Literal["admin", "member"] = "member"


class MemberOut(BaseModel):
    id: str
    email: str
    name: str
    role: str
    created_at: str


@bp.get("/members")
@responds(enveloped(MemberOut, many=True))
@errors(401, 403)
async def list_members():
    await require_admin()
    rows = await services().db.fetch(
        "SELECT u.id, u.email, u.name, m.role, m.created_at FROM memberships m JOIN users u ON u.id = m.user_id "
        "WHERE m.org_id = $1 ORDER BY m.created_at", org().org_id)
    return {"data": [jsonable(dict(r)) for r in rows]}


class MemberAdded(BaseModel):
    id: str
    email: str
    role: str


@bp.post("/members")
@body(MemberAdd)
@responds(enveloped(MemberAdded), 201)
@errors(400, 401, 403, 404)
async def add_member(data: MemberAdd):
    await require_admin()
    s = services()
    user = await s.orgs.get_user_by_email(data.email)
    if user is None:
        raise NotFound("no user with this email; create users with `fleethub admin create-user`")
    await s.orgs.add_member(org().org_id, user["id"], data.role, s.clock.now())
    await s.invalidate(f"user:{user['id']}")
    return {"data": {"id": str(user["id"]), "email": user["email"], "role": data.role}}, 201


class MemberRemoved(BaseModel):
    id: str
    removed: bool


class RelationGranted(BaseModel):
    model_config = ConfigDict(extra="allow")
    object_type: str
    object_id: str | None
    relation: str
    subject_type: str
    subject_id: str
    created: bool


class RelationRevoked(BaseModel):
    revoked: bool


@bp.delete("/members/<user_id>")
@responds(enveloped(MemberRemoved))
@errors(400, 401, 403, 404)
async def remove_member(user_id: str):
    await require_admin()
    s = services()
    uid = parse_uuid(user_id, "user_id")
    if uid == principal().user_id:
        raise BadRequest("you cannot remove yourself; another admin can", code="self_removal")
    status = await s.db.execute("DELETE FROM memberships WHERE org_id = $1 AND user_id = $2", org().org_id, uid)
    if not status.endswith(" 1"):
        raise NotFound("no such member")
    await s.db.execute("DELETE FROM relations WHERE org_id = $1 AND subject_type = 'user' AND subject_id = $2",
                       org().org_id, uid)
    await s.invalidate(f"user:{uid}", f"subject:{uid}")
    return {"data": {"id": str(uid), "removed": True}}


# -- relations -------------------------------------------------------------------------------
class RelationTuple(BaseModel):
    model_config = ConfigDict(extra="forbid")
    object_type: ObjectType
    object_id: uuid.UUID | None = Field(None, description="omit for organization: an org-wide grant")
    relation: Relation
    subject_type: Literal["user", "service"]
    subject_id: uuid.UUID


async def _check_tuple(t: RelationTuple) -> uuid.UUID:
    s = services()
    object_id = t.object_id or (org().org_id if t.object_type == "organization" else None)
    if object_id is None:
        raise BadRequest("object_id: required for this object_type", code="missing_field")
    # Objects and subjects of another organisation are refused like unknown ones.
    if not await s.identity.object_in_org(org().org_id, t.object_type, object_id):
        raise BadRequest(f"object_id: no such {t.object_type} in this organisation", code="invalid_reference")
    if t.subject_type == "user":
        found = await s.orgs.role_of(org().org_id, t.subject_id)
    else:
        found = await s.db.fetchval("SELECT 1 FROM service_accounts WHERE org_id = $1 AND id = $2",
                                    org().org_id, t.subject_id)
    if not found:
        raise BadRequest("subject_id: no such member or service account in this organisation",
                         code="invalid_reference")
    return object_id


class RelationOut(BaseModel):
    object_type: str
    object_id: str | None
    relation: str
    subject_type: str
    subject_id: str
    created_at: str


@bp.get("/relations")
@responds(enveloped(RelationOut, many=True))
@errors(401, 403)
async def list_relations():
    await require_admin()
    rows = await services().identity.list_relations(org().org_id)
    return {"data": [jsonable(r) for r in rows]}


@bp.post("/relations")
@body(RelationTuple)
@responds(enveloped(RelationGranted), 201)
@responds(enveloped(RelationGranted), 200)
@errors(400, 401, 403)
async def grant_relation(data: RelationTuple):
    await require_admin()
    s = services()
    object_id = await _check_tuple(data)
    created = await s.identity.grant(org().org_id, data.object_type, object_id, data.relation, data.subject_type,
                                     data.subject_id, s.clock.now())
    await s.invalidate(f"subject:{data.subject_id}")
    return {"data": {**jsonable(data.model_dump()), "object_id": str(object_id), "created": created}}, \
        (201 if created else 200)


@bp.delete("/relations")
@body(RelationTuple)
@responds(enveloped(RelationRevoked))
@errors(400, 401, 403, 404)
async def revoke_relation(data: RelationTuple):
    await require_admin()
    s = services()
    object_id = data.object_id or org().org_id
    if not await s.identity.revoke(org().org_id, data.object_type, object_id, data.relation, data.subject_type,
                                   data.subject_id):
        raise NotFound("no such relation")
    await s.invalidate(f"subject:{data.subject_id}")
    return {"data": {"revoked": True}}


# -- service accounts ------------------------------------------------------------------------
class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    relation: Relation
    object_type: ObjectType = "organization"
    object_id: uuid.UUID | None = None

    @model_validator(mode="after")
    def _object(self) -> "Policy":
        if self.object_type != "organization" and self.object_id is None:
            raise ValueError("object_id is required unless object_type is organization")
        return self


class ServiceAccountCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=200)
    description: str = Field("", max_length=2000)
    policies: list[Policy] = Field(default_factory=list, max_length=200)


class ServiceAccountOut(BaseModel):
    id: str
    name: str
    description: str
    client_id: str
    created_at: str


class ServiceAccountCreated(ServiceAccountOut):
    client_secret: str = Field(description="shown once")
    token_url: str


def _sa_json(row: dict) -> dict:
    return jsonable({k: row[k] for k in ("id", "name", "description", "client_id", "created_at")})


@bp.get("/service-accounts")
@responds(enveloped(ServiceAccountOut, many=True))
@errors(401, 403)
async def list_service_accounts():
    await require_admin()
    rows = await services().identity.list_service_accounts(org().org_id)
    return {"data": [_sa_json(r) for r in rows]}


@bp.post("/service-accounts")
@body(ServiceAccountCreate)
@responds(enveloped(ServiceAccountCreated), 201)
@errors(400, 401, 403, 409)
async def create_service_account(data: ServiceAccountCreate):
    await require_admin()
    s = services()
    grants = []
    for policy in data.policies:
        object_id = policy.object_id or org().org_id
        if not await s.identity.object_in_org(org().org_id, policy.object_type, object_id):
            raise BadRequest(f"policies: no such {policy.object_type} in this organisation",
                             code="invalid_reference")
        grants.append((policy.object_type, object_id, policy.relation))
    client_id, secret = "sa_" + secrets.token_urlsafe(12), cli_safe_secret()
    try:
        row = await s.identity.create_service_account(org().org_id, data.name, data.description, client_id,
                                                      digest(secret), principal().user_id, s.clock.now(), grants)
    except DuplicateServiceAccount:
        raise Conflict(f"a service account named {data.name!r} already exists", code="name_exists") from None
    return {"data": {**_sa_json(row), "client_secret": secret, "token_url": "/v1/oauth/token",
                     "policies": [{"object_type": t, "object_id": str(i), "relation": r} for t, i, r in grants]}}, 201


@bp.delete("/service-accounts/<sa_id>")
@responds(enveloped(DeletedOut))
@errors(400, 401, 403, 404)
async def delete_service_account(sa_id: str):
    await require_admin()
    s = services()
    sid = parse_uuid(sa_id, "service_account_id")
    if not await s.identity.delete_service_account(org().org_id, sid):
        raise NotFound("service account not found")
    await s.invalidate(f"service:{sid}", f"subject:{sid}")
    return {"data": {"id": str(sid), "deleted": True}}
