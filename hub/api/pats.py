"""The caller's own personal API tokens: create (the secret is shown once), list, delete."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint

from hub.api.common import errors, jsonable, principal, services
from hub.api.validation import body, enveloped, responds
from hub.auth.routes import no_org
from hub.auth.pat import digest, new_pat
from hub.errors import BadRequest, Forbidden, NotFound
from hub.instants import Instant

bp = Blueprint("pats", __name__, url_prefix="/v1/pats")


class PatCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = Field("", max_length=200)
    expires_at: Instant | None = None  # aware and in range (hub/instants.py)


class PatOut(BaseModel):
    id: str
    description: str
    expires_at: str | None
    created_at: str
    last_used_at: str | None


class PatCreated(PatOut):
    secret: str = Field(description="shown once; stored only as its SHA-256")


class PatCreatedEnvelope(BaseModel):
    data: PatCreated


class PatList(BaseModel):
    data: list[PatOut]


def _pat_json(row: dict) -> dict:
    return jsonable({k: row[k] for k in ("id", "description", "expires_at", "created_at", "last_used_at")})


def _user_id():
    p = principal()
    if p.user_id is None:
        raise Forbidden("only a person has personal API tokens")
    return p.user_id


@bp.post("")
@no_org
@body(PatCreate)
@responds(PatCreatedEnvelope, 201)
@errors(400, 401)
async def create_pat(data: PatCreate):
    s = services()
    now = s.clock.now()
    if data.expires_at is not None:
        if data.expires_at <= now:
            raise BadRequest("expires_at: must be in the future", code="invalid_field")
    pat_id, secret = new_pat()
    row = await s.stores.tokens.create_pat(pat_id, _user_id(), digest(secret), now,
                                    description=data.description, expires_at=data.expires_at)
    return {"data": {**_pat_json(row), "secret": secret}}, 201


@bp.get("")
@no_org
@responds(PatList)
@errors(401)
async def list_pats():
    rows = await services().stores.tokens.list_pats(_user_id())
    return {"data": [_pat_json(r) for r in rows]}


class PatDeleted(BaseModel):
    id: str
    deleted: bool


@bp.delete("/<pat_id>")
@no_org
@responds(enveloped(PatDeleted))
@errors(401, 404)
async def delete_pat(pat_id: str):
    s = services()
    if not await s.stores.tokens.delete_pat(pat_id, _user_id()):
        raise NotFound("token not found")
    await s.invalidate(f"pat:{pat_id}")  # revoked for the very next request, in every hub process
    return {"data": {"id": pat_id, "deleted": True}}
