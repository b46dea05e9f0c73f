"""Devices: provision (the device token is returned once), list, read, update, remove, reboot.

Stored fields come from storage; live ones (online, state, last seen, boot reason) from the device's
actor when it runs, since presence is written behind and the actor is its only writer.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, copy_current_app_context

import trio

from actors.device import Reboot, Send
from device_client.shared.linkcodes import Close
from hub.cluster.asks import ask_device
from device_client.shared.clock import rfc3339
from hub.api.registry_credentials import send_pull_settings
from hub.api.common import Pagination, PageQuery, errors, jsonable, org, pagination, parse_uuid, services
from hub.auth.authz import Obj, authorize, require_org, scope_for_list
from hub.api.sse import resume_point, stream_response
from hub.auth.streams import StreamAccess, object_tag
from hub.api.validation import body, query, responds
from hub.auth.pat import digest, new_device_token
from hub.errors import BadRequest, NotFound

bp = Blueprint("devices", __name__, url_prefix="/v1/devices")

Tag = str


class DeviceCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=200)
    fleet_id: uuid.UUID | None = None
    tags: list[Tag] = Field(default_factory=list, max_length=64)


class DeviceUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, min_length=1, max_length=200)
    fleet_id: uuid.UUID | None = None
    tags: list[Tag] | None = Field(None, max_length=64)


class DeviceQuery(PageQuery):
    fleet_id: uuid.UUID | None = None
    online: bool | None = None
    tag: str | None = None
    firmware: str | None = Field(None, max_length=200)
    architecture: str | None = Field(None, max_length=100)
    condition: Literal["MemoryFault"] | None = Field(None, description="devices with this condition")
    updating: bool | None = Field(None, description="a configuration on its way to the device (pending or "
                                                    "applying), or not")
    config_status: Literal["pending", "applying", "applied", "rejected", "failed", "none"] | None = Field(
        None, description="devices whose configuration has this status (configuration.status); none: no "
                          "configuration assigned")
    search: str | None = Field(None, max_length=200, description="part of the device's name, any case")
    name: str | None = Field(None, min_length=1, max_length=200,
                             description="exactly this name (names are not unique: check the total)")


class DeviceConfiguration(BaseModel):
    config_id: uuid.UUID | None
    version_id: uuid.UUID | None
    version: int | None = Field(description="the assigned version's number")
    applied_version_id: uuid.UUID | None
    applied_version: int | None = Field(description="the number of the version the device runs and has verified")
    previous_version_id: uuid.UUID | None = Field(None, description="the version the device ran before the one it "
                                                                    "runs: what POST /v1/devices/{id}/revert goes back to")
    previous_version: int | None = Field(None, description="that version's number")
    status: Literal["pending", "applying", "applied", "rejected", "failed"] | None = Field(
        description="pending (assigned), applying (sent to the device), applied, rejected (by the device, "
                    "rolled back) or failed (no valid result in time; sent again at the next link)")
    error: str | None = Field(description="why it was rejected or failed; a health check's rejection ends with the "
                                          "check's last output line")
    check_output: str | None = Field(description="rejected by its health check: the end of what the check printed "
                                                 "on the device (its last 20 lines within 2 KiB, at most 2,048 "
                                                 "characters, control characters escaped as \\xNN); else null")
    workload_log: str | None = Field(description="rejected: the workload log's last lines on the device when it "
                                                 "rejected the version, bounded and escaped as check_output; else "
                                                 "null")


class DeviceSystem(BaseModel):
    """The device's system facts, from its last hello or telemetry sample (docs/device-protocol.md,
    SystemFacts), as the hub kept them: within their bounds, null where the device did not say."""
    uptime_seconds: float | None = Field(description="seconds since the device booted, when it said so")
    ip_addresses: list[str] = Field(description="its own addresses (at most 16), loopback and link-local left out")
    cpu_percent: float | None = Field(description="CPU busy, 0-100, between the device's last two samples")
    memory_percent: float | None = Field(description="memory in use, 0-100")
    memory_total_bytes: int | None
    disk_percent: float | None = Field(description="the device root's filesystem in use, 0-100")
    disk_total_bytes: int | None
    at: str = Field(description="when the hub received these facts (RFC 3339)")


class DeviceOut(BaseModel):
    id: uuid.UUID
    name: str
    fleet_id: uuid.UUID | None
    tags: list[str]
    online: bool
    state: str = Field(description="offline, online, rebooting or maintenance")
    last_seen: str | None
    boot_reason: str | None = Field(description="power_on, reboot, memory_test, ... as the device reported")
    firmware: str | None
    architecture: str | None
    conditions: list[dict]
    has_tunnel_identity: bool
    tunnel_targets: dict | None = Field(None, description="what the device's agent offers tunnels, from its "
                                        "last hello: {names, ports, ssh} (null: it never said)")
    agent_version: str | None = Field(None, description="the agent's version from its last hello (null: it never "
                                                     "said)")
    system: DeviceSystem | None = Field(None, description="uptime, addresses, CPU, memory and disk use (null: "
                                                          "the device never said)")
    configuration: DeviceConfiguration
    created_at: str
    updated_at: str


class DeviceCreated(DeviceOut):
    token: str = Field(description="the device token: shown once, sent by the agent on the device link")


class DeviceEnvelope(BaseModel):
    data: DeviceOut


class DeviceCreatedEnvelope(BaseModel):
    data: DeviceCreated


class DeviceList(BaseModel):
    data: list[DeviceOut]
    pagination: Pagination


class CommandAccepted(BaseModel):
    deviceId: str
    state: str | None = None
    roundTripMs: float | None = None
    device: dict = Field(description="the device's reply payload")


class CommandEnvelope(BaseModel):
    data: CommandAccepted


class Deleted(BaseModel):
    id: str
    deleted: bool


class DeletedEnvelope(BaseModel):
    data: Deleted


def device_json(row: dict) -> dict:
    live = services().device_live(row) or {}  # a snapshot read; only the actor writes it
    conn = live or {"state": row["state"], "online": row["online"], "bootReason": row["boot_reason"],
                    "lastSeenAt": row["last_seen_at"]}
    facts = live.get("facts") or {}
    stored = row.get("facts") or {}
    # Each field converted by what it holds (ids, times; jsonable only for the JSON documents): the
    # device document is the most read answer, and walking it whole was a quarter of its view's cost.
    return {
        "id": str(row["id"]), "name": row["name"], "fleet_id": _text(row["fleet_id"]), "tags": list(row["tags"]),
        "online": conn["online"], "state": conn["state"], "last_seen": rfc3339(conn["lastSeenAt"]),
        "boot_reason": conn["bootReason"], "firmware": facts.get("firmware") or row["firmware"],
        "architecture": facts.get("architecture") or row["architecture"], "conditions": jsonable(row["conditions"]),
        "has_tunnel_identity": bool(facts.get("tunnelPublicKey") or row["tunnel_public_key"]),
        "tunnel_targets": jsonable(facts.get("tunnelTargets") or stored.get("tunnelTargets")),
        "agent_version": facts.get("agentVersion") or stored.get("agentVersion") or None,
        "system": _system(facts.get("system") or stored.get("system")),
        "configuration": _configuration(row),
        "created_at": rfc3339(row["created_at"]), "updated_at": rfc3339(row["updated_at"]),
    }


def _system(system: dict | None) -> dict | None:
    # kept bounded by the link and the actor (systemfacts.checked), so only renamed here
    if not isinstance(system, dict) or "at" not in system:
        return None
    return {"uptime_seconds": system.get("uptimeSeconds"), "ip_addresses": list(system.get("ipAddresses") or []),
            "cpu_percent": system.get("cpuPercent"), "memory_percent": system.get("memoryPercent"),
            "memory_total_bytes": system.get("memoryTotalBytes"), "disk_percent": system.get("diskPercent"),
            "disk_total_bytes": system.get("diskTotalBytes"), "at": system["at"]}


def _configuration(row: dict) -> dict:
    rejected = row.get("config_status") == "rejected"
    return {"config_id": _text(row.get("config_id")), "version_id": _text(row.get("config_version_id")),
            "version": row.get("config_version"), "applied_version_id": _text(row.get("applied_version_id")),
            "applied_version": row.get("applied_version"), "status": row.get("config_status"),
            "previous_version_id": _text(row.get("previous_version_id")),
            "previous_version": row.get("previous_version"),
            "error": row.get("config_error"),
            # the device's words belong to its rejection only (storage clears them with any other result)
            "check_output": row.get("config_check_output") if rejected else None,
            "workload_log": row.get("config_workload_log") if rejected else None}


def _text(value: uuid.UUID | None) -> str | None:
    return None if value is None else str(value)


async def _check_fleet(fleet_id: uuid.UUID | None) -> None:
    """The fleet a device goes into: it must be this organisation's (a foreign one is 400, like a
    missing one), and the caller needs editor on it — or org-wide editor for no fleet."""
    s = services()
    if fleet_id is None:
        await require_org(s, "editor")
        return
    if not await s.stores.identity.object_in_org(org().org_id, "fleet", fleet_id):
        raise BadRequest("fleet_id: no such fleet in this organisation", code="invalid_reference")
    await authorize(s, "editor", Obj("fleet", fleet_id, fleet_id))


def device_obj(row: dict) -> Obj:
    return Obj("device", row["id"], row["fleet_id"])


@bp.post("")
@body(DeviceCreate)
@responds(DeviceCreatedEnvelope, 201)
@errors(400, 401, 403)
async def create_device(data: DeviceCreate):
    s = services()
    await _check_fleet(data.fleet_id)
    token = new_device_token()
    row = await s.stores.devices.create(org().org_id, digest(token), s.clock.now(), name=data.name,
                                 fleet_id=data.fleet_id, tags=data.tags)
    return {"data": {**device_json(row), "token": token}}, 201


@bp.get("")
@query(DeviceQuery)
@responds(DeviceList)
@errors(400, 401, 403)
async def list_devices(query_args: DeviceQuery):
    s = services()
    everything, ids, fleets = await scope_for_list(s, "viewer", "device")
    rows, total = await s.stores.devices.list(
        org().org_id, offset=query_args.offset, limit=query_args.limit, fleet_id=query_args.fleet_id,
        online=query_args.online, tag=query_args.tag, firmware=query_args.firmware,
        architecture=query_args.architecture, condition=query_args.condition, updating=query_args.updating,
        config_status=query_args.config_status, search=query_args.search, name=query_args.name,
        only=None if everything else (ids, fleets))
    return {"data": [device_json(r) for r in rows],
            "pagination": pagination(query_args.page, query_args.limit, total)}


async def _load(device_id: str, relation: str) -> dict:
    """The device of this organisation (else 404, like a missing one), if the caller holds ``relation``."""
    s = services()
    row = await s.stores.devices.get(org().org_id, parse_uuid(device_id, "device_id"))
    if row is None:
        raise NotFound("device not found")
    await authorize(s, relation, device_obj(row))
    return row


async def _load_identity(device_id: str, relation: str) -> uuid.UUID:
    """``_load`` for a command that needs only to know the caller may send it: the device's id, from
    what this process already knows of it (storage/devices.py ``identities``: no storage read for a
    warm device), else 404 like a missing one; 403 without ``relation``."""
    s = services()
    known = await s.stores.devices.identity(org().org_id, parse_uuid(device_id, "device_id"))
    if known is None:
        raise NotFound("device not found")
    await authorize(s, relation, Obj("device", known[0], known[1]))
    return known[0]


@bp.get("/<device_id>")
@responds(DeviceEnvelope)
@errors(400, 401, 403, 404)
async def get_device(device_id: str):
    return {"data": device_json(await _load(device_id, "viewer"))}


@bp.patch("/<device_id>")
@body(DeviceUpdate)
@responds(DeviceEnvelope)
@errors(400, 401, 403, 404)
async def update_device(device_id: str, data: DeviceUpdate):
    s = services()
    changes = data.model_dump(exclude_unset=True)
    if changes.get("name", "") is None or ("tags" in changes and changes["tags"] is None):
        raise BadRequest("name and tags cannot be null", code="invalid_field")
    current = await _load(device_id, "editor")
    if "fleet_id" in changes and changes["fleet_id"] != current["fleet_id"]:
        await _check_fleet(changes["fleet_id"])
    row = await s.stores.devices.update(org().org_id, current["id"], s.clock.now(), changes)
    if row is None:
        raise NotFound("device not found")
    if row["fleet_id"] != current["fleet_id"]:
        await s.invalidate(object_tag(device_obj(row)))  # its open streams re-check now, on every node
        # its new fleet's registry proxy mode, now, if it runs containers (not with its next version)
        await send_pull_settings(s, org().org_id, device_id=row["id"])
    return {"data": device_json(row)}


@bp.delete("/<device_id>")
@responds(DeletedEnvelope)
@errors(400, 401, 403, 404)
async def delete_device(device_id: str):
    s = services()
    dev_id = (await _load(device_id, "editor"))["id"]
    if not await s.stores.devices.delete(org().org_id, dev_id):
        raise NotFound("device not found")
    await s.invalidate(object_tag(Obj("device", dev_id)))
    link = s.links.get(dev_id)
    if link is not None:
        # its token no longer exists; the agent's reconnects are refused
        link.close(Close.CREDENTIAL_REVOKED, "the device was removed: its token is revoked")
    return {"data": {"id": str(dev_id), "deleted": True}}


@bp.post("/<device_id>/reboot")
@responds(CommandEnvelope, 202)
@errors(400, 401, 403, 404, 502, 503, 504)
async def reboot_device(device_id: str):
    s = services()
    dev_id = await _load_identity(device_id, "editor")
    # in a cluster, the actor of the node holding the device's link (hub/cluster/asks.py)
    reply = await ask_device(s, dev_id, Reboot(), timeout=s.settings.command_timeout + 5)
    return {"data": {"deviceId": str(dev_id), "state": "rebooting", "device": reply}}, 202


@bp.post("/<device_id>/ping")
@responds(CommandEnvelope)
@errors(400, 401, 403, 404, 502, 503, 504)
async def ping_device(device_id: str):
    """A live round trip to the device through its actor and the bus, with no side effect."""
    s = services()
    dev_id = await _load_identity(device_id, "viewer")
    actor = await s.device_actor(dev_id)
    started = trio.current_time()
    reply = await actor.ask(Send("ping", {}), timeout=s.settings.command_timeout + 5)
    return {"data": {"deviceId": str(dev_id), "roundTripMs": round((trio.current_time() - started) * 1000, 3),
                     "device": reply}}


@bp.get("/<device_id>/events")
@errors(400, 401, 403, 404, 410)
async def device_events(device_id: str):
    """The device state stream (SSE): the current state first, then every change as it happens."""
    s = services()
    row = await _load(device_id, "viewer")
    subscription = await s.events.open(("device", row["id"]), owner=("org", org().org_id))
    replay = await resume_point(s, subscription, org().org_id, f"devices/{row['id']}")
    first = {"kind": "device.snapshot", "deviceId": str(row["id"]), "payload": device_json(row)}

    @copy_current_app_context
    async def snapshot() -> dict:
        return {**first, "payload": device_json(await _load(device_id, "viewer"))}

    return await stream_response(subscription, first, {"deviceId": str(row["id"])},
                                 StreamAccess.of_request(s, "viewer", device_obj(row)), replay, snapshot)


async def _wipe(row: dict) -> dict:
    """Have the device remove every secret file it manages (503 offline, 504 no answer)."""
    s = services()
    actor = await s.device_actor(row["id"])
    return await actor.ask(Send("files.wipe", {}), timeout=s.settings.command_timeout + 5)


@bp.post("/<device_id>/factory-reset")
@responds(CommandEnvelope)
@errors(400, 401, 403, 404, 502, 503, 504)
async def factory_reset_device(device_id: str):
    """Wipe every secret file from the device and forget what the hub meant to deliver to it: its
    own files and its configuration assignment. The device stays in the organisation, blank."""
    s = services()
    row = await _load(device_id, "editor")
    wiped = await _wipe(row)
    await s.stores.secrets.forget_device(row["id"])
    await s.stores.devices.clear_config(row["id"], s.clock.now())
    return {"data": {"deviceId": str(row["id"]), "state": "reset", "device": wiped}}


@bp.post("/<device_id>/unpair")
@responds(CommandEnvelope)
@errors(400, 401, 403, 404, 502, 503, 504)
async def unpair_device(device_id: str):
    """Wipe every secret file from the device, then remove it from the organisation (its token
    stops working). The device must be online: an offline device could not be wiped; remove it with
    DELETE instead, which revokes it and deletes its files in the hub."""
    s = services()
    row = await _load(device_id, "editor")
    wiped = await _wipe(row)
    await s.stores.devices.delete(org().org_id, row["id"])
    link = s.links.get(row["id"])
    if link is not None:
        link.close(Close.CREDENTIAL_REVOKED, "the device was unpaired: its token is revoked")
    return {"data": {"deviceId": str(row["id"]), "state": "unpaired", "device": wiped}}
