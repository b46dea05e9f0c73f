"""Configurations with versioned specs (spec: Configuration; Endpoints: Configurations).

Field names are camelCase like the spec's configuration section. A configuration's ``status`` is
``active`` or ``archived`` (the spec leaves its values open). ``spec`` is an object; of its contents
the hub checks ``ports`` (spec), ``workload`` (a command the device agent runs and health-checks) and
``containers`` (container_spec.py: images pinned to digests when the version is created); other
members are kept as given.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from quart import Blueprint, g, request
from quart_schema import document_querystring

from actors.device import ApplyConfig, RemoveFiles
from device_client.shared import imageref
from device_client.shared.protocol import CONFIG_SPEC_MAX_BYTES
from hub.api.common import Pagination, errors, jsonable, org, pagination, parse_uuid, principal, services
from hub.api.container_spec import Container, Port, check_containers, pin_images
from hub.api.registry_credentials import opened_for
from hub.api.secret_files import tell_linked
from hub.api.validation import DeletedOut, body, enveloped, invalid, responds
from hub.auth.authz import Obj, authorize, require_deploy, require_org, scope_for_list
from hub.errors import BadRequest, NotFound

bp = Blueprint("configurations", __name__, url_prefix="/v1/configurations")


class HealthCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: list[str] | None = None
    timeoutSeconds: float = Field(10, gt=0, le=600)
    graceSeconds: float = Field(1, ge=0, le=60)


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(..., min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    healthCheck: HealthCheck = Field(default_factory=HealthCheck)


class Spec(BaseModel):
    model_config = ConfigDict(extra="allow")
    ports: list[Port] = Field(default_factory=list, max_length=256)
    workload: Workload | None = None
    containers: list[Container] | None = Field(None, max_length=16)

    @field_validator("containers")
    @classmethod
    def _one_workload(cls, value: list[Container] | None, info: ValidationInfo) -> list[Container] | None:
        if value is not None:
            if info.data.get("workload") is not None:
                raise ValueError("a version runs a workload command or containers, not both")
            check_containers(value)
        return value


def checked_spec(raw: Any) -> dict:
    """The spec as stored: validated, ports normalised to integers, unknown members kept."""
    if not isinstance(raw, dict):
        raise BadRequest("spec: must be an object", code="invalid_spec")
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        err = invalid(exc, where="spec")
        err.code, err.message = "invalid_spec", "spec." + err.message
        raise err from None
    stored = spec.model_dump(exclude_none=True, exclude_unset=False) | {
        k: v for k, v in raw.items() if k not in _CHECKED}
    return _bounded(stored)


_CHECKED = ("ports", "workload", "containers")


def _bounded(stored: dict) -> dict:
    size = len(json.dumps(stored, ensure_ascii=False, separators=(",", ":")).encode())
    if size > CONFIG_SPEC_MAX_BYTES:
        # config.apply carries the spec and the files in one frame, bounded by construction
        raise BadRequest(f"spec: {size} bytes as JSON, over the limit of {CONFIG_SPEC_MAX_BYTES}",
                         code="invalid_spec")
    return stored


async def version_spec(raw: Any) -> dict:
    """``checked_spec``, then each container's image pinned to the digest its registry serves now."""
    stored = checked_spec(raw)
    if stored.get("containers"):
        registries = {imageref.parse(c["image"]).registry for c in stored["containers"]}
        stored["containers"] = await pin_images(stored["containers"], allowed=services().settings.registries,
                                                credentials=await opened_for(org().org_id, registries))
        stored = _bounded(stored)
    return stored


class ConfigCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=200)
    description: str = Field("", max_length=2000)
    tags: list[str] = Field(default_factory=list, max_length=64)
    spec: dict[str, Any]
    fleetId: uuid.UUID | None = Field(None, description="assign the new configuration to this fleet")


class ConfigUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, min_length=1, max_length=200)
    description: str | None = Field(None, max_length=2000)
    tags: list[str] | None = Field(None, max_length=64)
    status: Literal["active", "archived"] | None = None
    spec: dict[str, Any] | None = None


class VersionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any]


class VersionOut(BaseModel):
    id: str
    configId: str
    version: int
    spec: dict
    createdAt: str
    createdBy: str | None


class ConfigOut(BaseModel):
    id: str
    name: str
    description: str
    tags: list[str]
    status: str
    currentVersion: int
    secretFileCount: int
    deviceCount: int
    createdAt: str
    updatedAt: str
    version: VersionOut | None = None


class ConfigEnvelope(BaseModel):
    data: ConfigOut


class ConfigList(BaseModel):
    data: list[ConfigOut]
    pagination: Pagination


def version_json(v: dict | None) -> dict | None:
    if v is None:
        return None
    return jsonable({"id": v["id"], "configId": v["config_id"], "version": v["version"], "spec": v["spec"],
                     "createdAt": v["created_at"], "createdBy": v["created_by"]})


def config_json(c: dict, version: dict | None = None) -> dict:
    out = jsonable({"id": c["id"], "name": c["name"], "description": c["description"], "tags": c["tags"],
                    "status": c["status"], "currentVersion": c["current_version"],
                    "secretFileCount": c["secret_file_count"], "deviceCount": c["device_count"],
                    "createdAt": c["created_at"], "updatedAt": c["updated_at"]})
    if version is not None:
        out["version"] = version_json(version)
    return out


# -- list and summary -----------------------------------------------------------------------------
_SORT = ("name", "createdAt", "updatedAt", "status", "currentVersion")
SortBy = Literal["name", "createdAt", "updatedAt", "status", "currentVersion"]


class ListQuery(BaseModel):
    """The list's query, for the OpenAPI document (``_list_args`` parses it)."""
    page: int = Field(1, ge=1, le=1_000_000, description="starts at 1; default 1")
    limit: int = Field(10, ge=1, le=100, description="default 10")
    search: str | None = Field(None, description="matches the name or the description")
    name: str | None = Field(None, min_length=1, max_length=200, description="exactly this name (unique)")
    status: Literal["active", "archived"] | None = None
    sortBy: SortBy = "createdAt"
    sortOrder: Literal["asc", "desc"] = "desc"


class SummaryQuery(ListQuery):
    """As the list's, but page 1 and limit 10 replace a missing or invalid value (spec)."""
    page: int = Field(1, description="default 1, also when invalid")
    limit: int = Field(10, description="default 10, also when invalid or above 100")


def _list_args(*, lenient: bool) -> dict:
    """page, limit, search, name, status, sortBy, sortOrder. The summary (``lenient``) takes page 1 and
    limit 10 when they are missing or invalid; the list refuses invalid values with 400."""
    args = request.args
    out: dict[str, Any] = {}
    for name, default, high in (("page", 1, 1_000_000), ("limit", 10, 100)):
        raw = args.get(name)
        try:
            value = int(raw) if raw is not None else default
            if not 1 <= value <= high:
                raise ValueError
        except ValueError:
            if not lenient:
                raise BadRequest(f"{name}: must be an integer from 1 to {high}", code="invalid_query") from None
            value = default
        out[name] = value
    out["search"] = args.get("search") or None
    name = args.get("name")
    if name is not None and not 1 <= len(name) <= 200:
        raise BadRequest("name: from 1 to 200 characters", code="invalid_query")
    out["name"] = name
    status = args.get("status") or None
    if status not in (None, "active", "archived"):
        raise BadRequest("status: must be active or archived", code="invalid_query")
    out["status"] = status
    sort_by = args.get("sortBy") or "createdAt"
    if sort_by not in _SORT:
        raise BadRequest(f"sortBy: must be one of {', '.join(_SORT)}", code="invalid_query")
    sort_order = (args.get("sortOrder") or "desc").lower()
    if sort_order not in ("asc", "desc"):
        raise BadRequest("sortOrder: must be asc or desc", code="invalid_query")
    out["sort_by"], out["sort_order"] = sort_by, sort_order
    return out


async def _list(lenient: bool):
    s = services()
    a = _list_args(lenient=lenient)
    everything, ids, _ = await scope_for_list(s, "viewer", "configuration")
    rows, total = await s.stores.configs.list(org().org_id, offset=(a["page"] - 1) * a["limit"], limit=a["limit"],
                                       search=a["search"], name=a["name"], status=a["status"],
                                       sort_by=a["sort_by"], sort_order=a["sort_order"],
                                       only=None if everything else ids)
    return {"data": [config_json(r) for r in rows], "pagination": pagination(a["page"], a["limit"], total)}


@bp.get("")
@document_querystring(ListQuery)
@responds(ConfigList)
@errors(400, 401, 403, 500)
async def list_configurations():
    return await _list(lenient=False)


@bp.get("/summary")
@document_querystring(SummaryQuery)
@responds(ConfigList)
@errors(400, 401, 403, 500)
async def configuration_summary():
    return await _list(lenient=True)


# -- one configuration ----------------------------------------------------------------------------
async def _load(config_id: str, relation: str) -> tuple[dict, dict]:
    s = services()
    found = await s.stores.configs.get(org().org_id, parse_uuid(config_id, "configId"))
    if found is None:
        raise NotFound("configuration not found")
    await authorize(s, relation, Obj("configuration", found[0]["id"]))
    return found


@bp.post("")
@body(ConfigCreate)
@responds(ConfigEnvelope, 201)
@errors(400, 401, 403, 409, 500)
async def create_configuration(data: ConfigCreate):
    s = services()
    await require_org(s, "editor")
    spec = await version_spec(data.spec)
    if data.fleetId is not None:
        if not await s.stores.identity.object_in_org(org().org_id, "fleet", data.fleetId):
            raise BadRequest("fleetId: no such fleet in this organisation", code="invalid_reference")
        await authorize(s, "editor", Obj("fleet", data.fleetId, data.fleetId))
    config, version = await s.stores.configs.create(org().org_id, s.clock.now(), name=data.name,
                                             description=data.description, tags=data.tags, spec=spec,
                                             created_by=principal().id, fleet_id=data.fleetId)
    return {"data": config_json(config, version)}, 201


@bp.get("/<configId>")
@responds(ConfigEnvelope)
@errors(400, 401, 403, 404)
async def get_configuration(configId: str):
    config, version = await _load(configId, "viewer")
    return {"data": config_json(config, version)}


@bp.put("/<configId>")
@body(ConfigUpdate)
@responds(ConfigEnvelope)
@errors(400, 401, 403, 404, 409)
async def update_configuration(configId: str, data: ConfigUpdate):
    s = services()
    config, _ = await _load(configId, "editor")
    changes = data.model_dump(exclude_unset=True)
    spec = changes.pop("spec", None)
    for key in list(changes):
        if changes[key] is None:
            raise BadRequest(f"{key}: cannot be null", code="invalid_field")
    if spec is None and "spec" in data.model_fields_set:
        raise BadRequest("spec: cannot be null", code="invalid_spec")
    updated = await s.stores.configs.update(org().org_id, config["id"], s.clock.now(), metadata=changes,
                                     spec=await version_spec(spec) if spec is not None else None, created_by=principal().id)
    if updated is None:
        raise NotFound("configuration not found")
    config, new_version = updated
    return {"data": config_json(config, new_version)}


@bp.delete("/<configId>")
@responds(enveloped(DeletedOut))
@errors(400, 401, 403, 404)
async def delete_configuration(configId: str):
    s = services()
    config, _ = await _load(configId, "editor")
    deleted = await s.stores.configs.delete(org().org_id, config["id"])
    if deleted is None:
        raise NotFound("configuration not found")
    files, removed = deleted
    by_device: dict[uuid.UUID, list[str]] = {}
    for device_id, path in removed:
        by_device.setdefault(device_id, []).append(path)
    for device_id, paths in by_device.items():
        await tell_linked(s, device_id, RemoveFiles(tuple(paths)))  # offline devices drop them at their next hello
    return {"data": {"id": str(config["id"]), "deleted": True, "secretFilesDeleted": files}}


# -- versions -------------------------------------------------------------------------------------
@bp.get("/<config_id>/versions")
@responds(enveloped(VersionOut, many=True))
@errors(400, 401, 403, 404)
async def list_versions(config_id: str):
    s = services()
    config, _ = await _load(config_id, "viewer")
    versions = await s.stores.configs.versions(org().org_id, config["id"]) or []
    return {"data": [version_json(v) for v in versions]}


@bp.post("/<config_id>/versions")
@body(VersionCreate)
@responds(enveloped(VersionOut), 201)
@errors(400, 401, 403, 404)
async def create_version(config_id: str, data: VersionCreate):
    s = services()
    config, _ = await _load(config_id, "editor")
    updated = await s.stores.configs.update(org().org_id, config["id"], s.clock.now(), metadata={},
                                     spec=await version_spec(data.spec), created_by=principal().id)
    if updated is None:
        raise NotFound("configuration not found")
    return {"data": version_json(updated[1])}, 201


# -- direct assignment to one device ----------------------------------------------------------------
class Assignment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    configId: uuid.UUID
    versionId: uuid.UUID | None = Field(None, description="default: the configuration's current version")


device_bp = Blueprint("device_configuration", __name__, url_prefix="/v1/devices")


class AssignmentOut(BaseModel):
    deviceId: str
    configId: str
    versionId: str
    version: int
    status: str | None


@device_bp.put("/<device_id>/configuration")
@body(Assignment)
@responds(enveloped(AssignmentOut), 202)
@errors(400, 401, 403, 404)
async def assign_configuration(device_id: str, data: Assignment):
    """Assign a configuration version to one device; it is sent at once if the device is online,
    else when it next connects. The device applies it with a health check and reports the result."""
    s = services()
    # its configuration as PostgreSQL says (another node may have just changed it): whether files move
    device = await s.stores.devices.get(org().org_id, parse_uuid(device_id, "device_id"), current=True)
    if device is None:
        raise NotFound("device not found")
    await authorize(s, "editor", Obj("device", device["id"], device["fleet_id"]))
    found = await s.stores.configs.get(org().org_id, data.configId)
    if found is None:
        raise BadRequest("configId: no such configuration in this organisation", code="invalid_reference")
    await require_deploy(s, data.configId)
    config, current = found
    version = current
    if data.versionId is not None:
        version = await s.stores.configs.version(org().org_id, data.versionId)
        if version is None or version["config_id"] != data.configId:
            raise BadRequest("versionId: not a version of this configuration", code="invalid_reference")
    now = s.clock.now()
    if device["config_id"] != data.configId:
        await s.stores.secrets.assign_config(device["id"], data.configId, now)
    updated = await s.stores.devices.assign_config(org().org_id, device["id"], data.configId, version["id"], now)
    actor = await s.device_actor(device["id"])
    actor.tell(ApplyConfig())
    g.audit_details = {"configId": str(data.configId), "versionId": str(version["id"])}
    return {"data": jsonable({"deviceId": device["id"], "configId": data.configId, "versionId": version["id"],
                              "version": version["version"], "status": updated["config_status"]})}, 202
