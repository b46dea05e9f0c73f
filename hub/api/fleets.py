"""Fleets: list, create, read, update — with what rollouts need (architecture, tags, configuration,
registry proxy). Field names are snake_case like the spec's fleet sections."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint

from actors.machines.window import UpdateWindow, WindowError
from hub.api.common import (
    PageQuery,
    Pagination,
    errors,
    jsonable,
    org,
    pagination,
    parse_uuid,
    services,
)
from hub.api.registry_credentials import send_pull_settings
from hub.api.validation import body, query, responds
from hub.auth.authz import Obj, authorize, require_deploy, require_org, scope_for_list
from hub.errors import BadRequest, NotFound

bp = Blueprint("fleets", __name__, url_prefix="/v1/fleets")


class FleetCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=200)
    description: str = Field("", max_length=2000)
    tags: list[str] = Field(default_factory=list, max_length=64)
    architecture: str | None = Field(None, max_length=64)
    config_id: uuid.UUID | None = None
    registry_proxy: bool = False
    registry_proxy_mode: Literal["fallback", "always"] = Field(
        "fallback", description="with registry_proxy on: fallback (devices pull from the registry, and through "
                                "the hub when that fails) or always (through the hub only); docs/billing.md")


class FleetUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, min_length=1, max_length=200)
    description: str | None = Field(None, max_length=2000)
    tags: list[str] | None = Field(None, max_length=64)
    architecture: str | None = Field(None, max_length=64)
    config_id: uuid.UUID | None = None
    registry_proxy: bool | None = None
    registry_proxy_mode: Literal["fallback", "always"] | None = None


class FleetQuery(PageQuery):
    name: str | None = Field(None, min_length=1, max_length=200, description="exactly this name (unique)")


class FleetOut(BaseModel):
    id: uuid.UUID
    name: str
    description: str
    tags: list[str]
    architecture: str | None
    config_id: uuid.UUID | None
    registry_proxy: bool
    registry_proxy_mode: str = Field(..., description="fallback or always (used while registry_proxy is on)")
    device_count: int
    update_window: dict[str, Any] | None = Field(
        None, description="the fleet's update window as GET /v1/fleets/{id}/update-window shows it (enabled, "
                          "timezone, start_time, end_time, days_of_week); null when it has none")
    created_at: str
    updated_at: str


class FleetEnvelope(BaseModel):
    data: FleetOut


class FleetList(BaseModel):
    data: list[FleetOut]
    pagination: Pagination


def _window(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, str):
        raw = json.loads(raw)  # jsonb arrives as text (storage/fleets.py)
    try:
        return UpdateWindow.parse(raw).to_json() if raw else None
    except WindowError:
        return None  # as a rollout reads it (hub/api/rollouts.py): no window


def fleet_json(row: dict) -> dict:
    return jsonable({**{k: row.get(k) for k in ("id", "name", "description", "tags", "architecture", "config_id",
                                                "registry_proxy", "registry_proxy_mode", "device_count", "created_at",
                                                "updated_at")},
                     "update_window": _window(row.get("update_window"))})


async def _check_config(config_id: uuid.UUID | None) -> None:
    if config_id is None:
        return
    if not await services().stores.identity.object_in_org(org().org_id, "configuration", config_id):
        raise BadRequest("config_id: no such configuration in this organisation", code="invalid_reference")
    await require_deploy(services(), config_id)


@bp.get("")
@query(FleetQuery)
@responds(FleetList)
@errors(400, 401, 403)
async def list_fleets(query_args: FleetQuery):
    s = services()
    everything, ids, fleets = await scope_for_list(s, "viewer", "fleet")
    rows, total = await s.stores.fleets.list(org().org_id, offset=query_args.offset, limit=query_args.limit,
                                      only=None if everything else ids | fleets, name=query_args.name)
    return {"data": [fleet_json(r) for r in rows],
            "pagination": pagination(query_args.page, query_args.limit, total)}


@bp.post("")
@body(FleetCreate)
@responds(FleetEnvelope, 201)
@errors(400, 401, 403, 409)
async def create_fleet(data: FleetCreate):
    s = services()
    await require_org(s, "editor")
    await _check_config(data.config_id)
    row = await s.stores.fleets.create(org().org_id, s.clock.now(), **data.model_dump())
    return {"data": fleet_json({**row, "device_count": 0})}, 201


@bp.get("/<fleet_id>")
@responds(FleetEnvelope)
@errors(400, 401, 403, 404)
async def get_fleet(fleet_id: str):
    return {"data": fleet_json(await _load(fleet_id, "viewer"))}


async def _load(fleet_id: str, relation: str) -> dict:
    s = services()
    row = await s.stores.fleets.get(org().org_id, parse_uuid(fleet_id, "fleet_id"))
    if row is None:
        raise NotFound("fleet not found")
    await authorize(s, relation, Obj("fleet", row["id"], row["id"]))
    return row


@bp.patch("/<fleet_id>")
@body(FleetUpdate)
@responds(FleetEnvelope)
@errors(400, 401, 403, 404, 409)
async def update_fleet(fleet_id: str, data: FleetUpdate):
    s = services()
    fid = (await _load(fleet_id, "editor"))["id"]
    changes = data.model_dump(exclude_unset=True)
    for key in ("name", "tags", "description", "registry_proxy", "registry_proxy_mode"):
        if key in changes and changes[key] is None:
            raise BadRequest(f"{key}: cannot be null", code="invalid_field")
    await _check_config(changes.get("config_id"))
    before = await s.stores.fleets.registry_proxy_mode(fid)
    row = await s.stores.fleets.update(org().org_id, fid, s.clock.now(), changes)
    if row is None:
        raise NotFound("fleet not found")
    if await s.stores.fleets.registry_proxy_mode(fid) != before:
        # the devices pull their images by it: those running containers get it now, not at their next version
        await send_pull_settings(s, org().org_id, fleet_id=fid)
    full = await s.stores.fleets.get(org().org_id, fid)
    return {"data": fleet_json(full)}
