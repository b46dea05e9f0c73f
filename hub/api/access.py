"""Who may do what: the caller (GET /v1/me), members, relation tuples, service accounts.

Managing access is the organisation admin's job: every mutation here needs the admin role, and
each one invalidates the cached lookups it affects before it answers (hub/auth/cache.py). People
join an organisation only by accepting an invitation (or by the operator's ``fleethub admin
create-user``): an admin cannot attach a registered user, nor learn which emails are registered.
An organisation always keeps one admin (409 ``last_admin``).
"""

from __future__ import annotations

import datetime as dt
import secrets
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from quart import Blueprint, g

from hub.api.common import errors, jsonable, org, parse_uuid, principal, services
from hub.api.validation import DeletedOut, body, enveloped, responds
from hub.auth.pat import cli_safe_secret
from hub.auth.authz import OBJECT_TYPES, RELATIONS, require_admin
from hub.auth.routes import no_org
from hub.auth.principals import OrgContext
from hub.auth.pat import digest
from hub.errors import BadRequest, Conflict, Forbidden, NotFound

bp = Blueprint("access", __name__, url_prefix="/v1")

# An invitation not accepted within this long lapses (the admin can invite again).
INVITATION_LIFETIME = dt.timedelta(days=7)

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


class InvitationOut(BaseModel):
    id: str
    email: str
    role: str
    status: Literal["pending"]
    created_at: str
    expires_at: str


def _invitation_json(row: dict) -> dict:
    return jsonable({"id": row["id"], "email": row["email"], "role": row["role"], "status": "pending",
                     "created_at": row["created_at"], "expires_at": row["expires_at"]})


@bp.post("/members")
@body(MemberAdd)
@responds(enveloped(MemberAdded), 200)
@responds(enveloped(InvitationOut), 202)
@errors(400, 401, 403, 409)
async def add_member(data: MemberAdd):
    """A current member's email changes their role (200; 409 for the organisation's last admin).
    Any other email gets an invitation (202), the same answer whether or not it belongs to a
    registered user, so the endpoint does not tell which emails exist; the person joins when they
    accept it (``POST /v1/invitations/{id}/accept``)."""
    await require_admin()
    s = services()
    member = await s.stores.identity.member_by_email(org().org_id, data.email)
    if member is not None:
        await _set_role(member["id"], data.role)
        return {"data": {"id": str(member["id"]), "email": member["email"], "role": data.role}}, 200
    now = s.clock.now()
    invitation = await s.stores.identity.invite(org().org_id, data.email, data.role, principal().user_id, now,
                                         now + INVITATION_LIFETIME)
    g.audit_details = {"invitationId": str(invitation["id"]), "role": data.role}
    return {"data": _invitation_json(invitation)}, 202


async def _set_role(user_id: uuid.UUID, role: str) -> None:
    s = services()
    outcome = await s.stores.identity.set_role(org().org_id, user_id, role)
    if outcome == "last_admin":
        raise Conflict("the organisation's last admin cannot give up the role; make another admin first",
                       code="last_admin")
    if outcome == "not_member":
        raise NotFound("no such member")
    await s.invalidate(f"user:{user_id}")


@bp.get("/invitations")
@responds(enveloped(InvitationOut, many=True))
@errors(401, 403)
async def list_invitations():
    """The organisation's open invitations (admin)."""
    await require_admin()
    s = services()
    return {"data": [_invitation_json(r) for r in await s.stores.identity.org_invitations(org().org_id, s.clock.now())]}


@bp.delete("/invitations/<invitation_id>")
@responds(enveloped(DeletedOut))
@errors(400, 401, 403, 404)
async def revoke_invitation(invitation_id: str):
    await require_admin()
    iid = parse_uuid(invitation_id, "invitation_id")
    if not await services().stores.identity.revoke_invitation(org().org_id, iid):
        raise NotFound("no open invitation with this id")
    return {"data": {"id": str(iid), "deleted": True}}


class MyInvitation(BaseModel):
    id: str
    organization: dict
    role: str
    created_at: str
    expires_at: str


@bp.get("/me/invitations")
@no_org
@responds(enveloped(MyInvitation, many=True))
@errors(401, 403)
async def my_invitations():
    """Open invitations addressed to the caller's email."""
    s = services()
    rows = await s.stores.identity.invitations_of(_person(), s.clock.now())
    return {"data": [jsonable({"id": r["id"], "organization": {"id": str(r["org_id"]), "name": r["org_name"]},
                               "role": r["role"], "created_at": r["created_at"], "expires_at": r["expires_at"]})
                     for r in rows]}


class Accepted(BaseModel):
    organization_id: str
    role: str


@bp.post("/invitations/<invitation_id>/accept")
@no_org
@responds(enveloped(Accepted))
@errors(400, 401, 403, 404)
async def accept_invitation(invitation_id: str):
    """Join the inviting organisation. 404 for an invitation that is not the caller's, expired or
    already accepted, like a missing one."""
    s = services()
    user_id = _person()
    row = await s.stores.identity.accept_invitation(parse_uuid(invitation_id, "invitation_id"), user_id, s.clock.now())
    if row is None:
        raise NotFound("no open invitation with this id for you")
    await s.invalidate(f"user:{user_id}")
    # Audited in the organisation joined, where its admins read the log.
    g.org = OrgContext(row["org_id"], row["member_role"])
    g.audit_details = {"invitationId": str(row["id"]), "role": row["member_role"]}
    return {"data": {"organization_id": str(row["org_id"]), "role": row["member_role"]}}


def _person() -> uuid.UUID:
    """Invitations are for people: a service account has none."""
    user_id = principal().user_id
    if user_id is None:
        raise Forbidden("invitations are for users, not service accounts", code="user_required")
    return user_id


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
@errors(400, 401, 403, 404, 409)
async def remove_member(user_id: str):
    await require_admin()
    s = services()
    uid = parse_uuid(user_id, "user_id")
    if uid == principal().user_id:
        raise BadRequest("you cannot remove yourself; another admin can", code="self_removal")
    # Checked under a lock: two admins removing each other at once must not leave none.
    outcome = await s.stores.identity.remove_member(org().org_id, uid)
    if outcome == "last_admin":
        raise Conflict("the organisation's last admin cannot be removed", code="last_admin")
    if outcome == "not_member":
        raise NotFound("no such member")
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
    if not await s.stores.identity.object_in_org(org().org_id, t.object_type, object_id):
        raise BadRequest(f"object_id: no such {t.object_type} in this organisation", code="invalid_reference")
    if t.subject_type == "user":
        found = await s.stores.orgs.role_of(org().org_id, t.subject_id)
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
    rows = await services().stores.identity.list_relations(org().org_id)
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
    created = await s.stores.identity.grant(org().org_id, data.object_type, object_id, data.relation, data.subject_type,
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
    if not await s.stores.identity.revoke(org().org_id, data.object_type, object_id, data.relation, data.subject_type,
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
    rows = await services().stores.identity.list_service_accounts(org().org_id)
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
        if not await s.stores.identity.object_in_org(org().org_id, policy.object_type, object_id):
            raise BadRequest(f"policies: no such {policy.object_type} in this organisation",
                             code="invalid_reference")
        grants.append((policy.object_type, object_id, policy.relation))
    client_id, secret = "sa_" + secrets.token_urlsafe(12), cli_safe_secret()
    row = await s.stores.identity.create_service_account(org().org_id, data.name, data.description, client_id,
                                                  digest(secret), principal().user_id, s.clock.now(), grants)
    return {"data": {**_sa_json(row), "client_secret": secret, "token_url": "/v1/oauth/token",
                     "policies": [{"object_type": t, "object_id": str(i), "relation": r} for t, i, r in grants]}}, 201


@bp.delete("/service-accounts/<sa_id>")
@responds(enveloped(DeletedOut))
@errors(400, 401, 403, 404)
async def delete_service_account(sa_id: str):
    await require_admin()
    s = services()
    sid = parse_uuid(sa_id, "service_account_id")
    if not await s.stores.identity.delete_service_account(org().org_id, sid):
        raise NotFound("service account not found")
    await s.invalidate(f"service:{sid}", f"subject:{sid}")
    return {"data": {"id": str(sid), "deleted": True}}
