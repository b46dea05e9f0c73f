"""Rollouts (spec: Rollout requests; Endpoints: Rollouts) — snake_case like the spec's section.

Two request forms for POST /v1/rollouts: forced {fleet_id, config_id, force} and batched
{fleet_ids, configuration_id, batch_size}; either may name a version (default: the configuration's
current one) and thresholds. The impact calculation answers what a rollout would do right now.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel
from quart import Blueprint, g, request
from quart_schema import document_request

from actors.machines import rollout as rm
from actors.machines.window import UpdateWindow, WindowError, check, is_open, next_start_after
from device_client.shared.clock import rfc3339
from hub.cluster.asks import control_rollout
from hub.cluster.leases import HeldElsewhere
from hub.api.common import PageQuery, errors, jsonable, org, pagination, parse_uuid, principal, services
from hub.api.sse import stream_response
from hub.auth.streams import StreamAccess
from hub.api.validation import body, enveloped, parse_body, query, responds
from hub.auth.authz import Obj, authorize, scope_for_list
from hub.errors import BadRequest, Conflict, NotFound
from storage.rollouts import FleetBusy

bp = Blueprint("rollouts", __name__, url_prefix="/v1/rollouts")

PENDING_ACTIONS = ("health_check", "battery_discharging", "mission_critical")


class ImpactRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fleet_id: uuid.UUID
    target_version_id: uuid.UUID
    force: bool = False


class _Thresholds(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version_id: uuid.UUID | None = None
    success_threshold: float = Field(0.9, ge=0, le=1)
    failure_threshold: float = Field(0.1, ge=0, le=1)


class ForcedRollout(_Thresholds):
    fleet_id: uuid.UUID
    config_id: uuid.UUID
    force: bool = False
    batch_size: int | None = Field(None, ge=1, le=100_000)


class BatchedRollout(_Thresholds):
    fleet_ids: list[uuid.UUID] = Field(..., min_length=1, max_length=100)
    configuration_id: uuid.UUID
    batch_size: int = Field(..., ge=1, le=100_000)
    force: bool = False


class RolloutRequest(RootModel[ForcedRollout | BatchedRollout]):
    """Either form of the spec: forced {fleet_id, config_id, force} or batched {fleet_ids,
    configuration_id, batch_size} (documentation: the view tells them apart by fleet_ids)."""


# The enumerations as the machine spells them (actors/machines/rollout.py), for the document.
RolloutStateName = Literal[tuple(st.value for st in rm.RolloutState)]  # type: ignore[valid-type]
StepName = Literal[tuple(st.value for st in rm.Step)]  # type: ignore[valid-type]


class RolloutQuery(PageQuery):
    state: RolloutStateName | None = None


async def _fleets(fleet_ids: list[uuid.UUID]) -> list[dict]:
    s = services()
    fleets = []
    for fid in dict.fromkeys(fleet_ids):
        fleet = await s.fleets.get(org().org_id, fid)
        if fleet is None:
            raise BadRequest(f"fleet {fid} is not in this organisation", code="invalid_reference")
        await authorize(s, "editor", Obj("fleet", fid, fid))
        fleets.append(fleet)
    return fleets


def _window(fleet: dict) -> UpdateWindow | None:
    raw = fleet.get("update_window")
    if isinstance(raw, str):
        raw = json.loads(raw)  # the fleet row as read by storage/fleets.py: jsonb arrives as text
    try:
        return UpdateWindow.parse(raw) if raw else None
    except WindowError:
        return None


def _names(row: dict) -> dict:
    """What the rollout's parts are called (storage/rollouts.py reads them with the row)."""
    return {"config_name": row["config_name"], "version_number": row["version_number"],
            "fleets": [{"id": fid, "name": row["fleet_names"].get(fid)} for fid in row["fleet_ids"]]}


async def _next_openings(fleet_ids: set[uuid.UUID]) -> dict[uuid.UUID, str | None]:
    """When each fleet's update window next opens (RFC 3339), None where it is open now or there is
    none: the same computation as GET /v1/fleets/{id}/update-window/check."""
    s = services()
    stored = await s.windows.get_many(org().org_id, list(fleet_ids)) if fleet_ids else {}
    now = s.clock.now()
    return {fid: rfc3339(check(_window({"update_window": raw}), now).next_window_at) for fid, raw in stored.items()}


def _waiting(queued_by_fleet: dict[uuid.UUID, int], openings: dict[uuid.UUID, str | None]) -> dict:
    """Devices held back by a closed update window: how many, and until when the first of them waits
    (the earliest next opening of their fleets; None when a window is open and the rollout's next
    tick starts them)."""
    nexts = [openings.get(fid) for fid, n in queued_by_fleet.items() if n]
    return {"devices": sum(queued_by_fleet.values()),
            "until": min(nexts) if nexts and None not in nexts else None}  # one format, UTC: strings compare


def _eligibility(device: dict, fleet: dict, live: dict | None) -> str | None:
    """Why a device is not eligible (online, fleet architecture, fleet tags), or None."""
    if not (live and live["online"]):
        return "offline"
    arch = (live.get("facts") or {}).get("architecture") or device["architecture"]
    if fleet["architecture"] and arch != fleet["architecture"]:
        return f"architecture {arch or 'unknown'} does not match the fleet's {fleet['architecture']}"
    missing = set(fleet["tags"]) - set(device["tags"])
    if missing:
        return f"missing fleet tags: {', '.join(sorted(missing))}"
    return None


async def _fleet_devices(fleet: dict) -> list[tuple[dict, dict | None]]:
    s = services()
    rows, _ = await s.devices.list(org().org_id, offset=0, limit=100_000, fleet_id=fleet["id"])
    out = []
    for row in rows:
        live = s.device_live(row)  # None: not live here (offline, or in a cluster held by another node)
        if live is None and s.clustered:
            live = {"online": row["online"], "facts": row.get("facts") or {}}  # the holding node's row
        out.append((row, live))
    return out


class ImpactOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    fleet_id: str
    eligible_devices: int
    in_window: int
    queued_for_next_window: int


class RolloutDeviceOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    device_id: str
    fleet_id: str
    batch: int
    step: StepName
    error: str | None
    check_output: str | None = Field(None, description="the device rejected the version: the end of what its health "
                                                       "check printed (as the device's configuration.check_output)")
    waiting_for_window_until: str | None = Field(
        None, description="step QUEUED_MAINTENANCE: when its fleet's update window next opens (RFC 3339 UTC), as "
                          "/v1/fleets/{id}/update-window/check's next_window_at; null otherwise or while it is open")
    updated_at: str


class NamedFleet(BaseModel):
    id: str
    name: str | None = Field(..., description="null when the fleet was deleted since")


class WaitingForWindow(BaseModel):
    devices: int = Field(..., description="devices in step QUEUED_MAINTENANCE: waiting for their fleet's update "
                                          "window (not in progress)")
    until: str | None = Field(..., description="the earliest next opening of those fleets' windows (RFC 3339 UTC); "
                                               "null when none waits or a window is open now")


class RolloutOut(BaseModel):
    """A rollout with its counts per step, its batches and each device's step."""
    model_config = ConfigDict(extra="allow")
    id: str
    state: RolloutStateName
    counts: dict[StepName, int]
    total_devices: int
    config_name: str | None = Field(..., description="the configuration's name (null when deleted since)")
    version_number: int | None = Field(..., description="the rolled-out version's number")
    fleets: list[NamedFleet]
    waiting_for_window: WaitingForWindow
    batches: list[dict[str, Any]]
    devices: list[RolloutDeviceOut]


@bp.post("/impact")
@body(ImpactRequest)
@responds(enveloped(ImpactOut))
@errors(400, 401, 403, 404)
async def impact(data: ImpactRequest):
    s = services()
    [fleet] = await _fleets([data.fleet_id])
    version = await s.configs.version(org().org_id, data.target_version_id)
    if version is None:
        raise BadRequest("target_version_id: no such configuration version in this organisation",
                         code="invalid_reference")
    now = s.clock.now()
    window = _window(fleet)
    in_window = data.force or window is None or is_open(window, now)
    eligible, ineligible, pending = [], [], {a: [] for a in PENDING_ACTIONS}
    for row, live in await _fleet_devices(fleet):
        reason = _eligibility(row, fleet, live)
        if reason:
            ineligible.append({"device_id": str(row["id"]), "reason": reason})
            continue
        eligible.append(str(row["id"]))
        for action in (live.get("facts") or {}).get("pendingActions") or []:
            if action in pending:
                pending[action].append(str(row["id"]))
    return {"data": {
        "fleet_id": str(fleet["id"]), "target_version_id": str(data.target_version_id), "force": data.force,
        "eligible_devices": len(eligible), "eligible_device_ids": eligible,
        "ineligible_devices": ineligible,
        "in_window": len(eligible) if in_window else 0,
        "queued_for_next_window": 0 if in_window else len(eligible),
        "next_window_at": None if in_window else rfc3339(next_start_after(window, now)),
        "window_bypassed": bool(data.force and window is not None and not is_open(window, now)),
        "pending_actions": {a: ids for a, ids in pending.items()},
        "devices_with_pending_actions": len({d for ids in pending.values() for d in ids}),
    }}


@bp.post("")
@document_request(RolloutRequest)
@responds(enveloped(RolloutOut), 201)
@errors(400, 401, 403, 404, 409)
async def create_rollout():
    s = services()
    raw = await request.get_data()
    form = BatchedRollout if b'"fleet_ids"' in raw else ForcedRollout
    data = await parse_body(form)
    if isinstance(data, BatchedRollout):
        fleet_ids, config_id = data.fleet_ids, data.configuration_id
    else:
        fleet_ids, config_id = [data.fleet_id], data.config_id
    fleets = await _fleets(fleet_ids)
    found = await s.configs.get(org().org_id, config_id)
    if found is None:
        raise BadRequest("configuration not in this organisation", code="invalid_reference")
    await authorize(s, "viewer", Obj("configuration", config_id))
    version = found[1]
    if data.version_id is not None:
        version = await s.configs.version(org().org_id, data.version_id)
        if version is None or version["config_id"] != config_id:
            raise BadRequest("version_id: not a version of this configuration", code="invalid_reference")
    eligible, steps = [], []
    for fleet in fleets:
        for row, live in await _fleet_devices(fleet):
            reason = _eligibility(row, fleet, live)
            if reason:
                steps.append((row["id"], fleet["id"], 0, rm.Step.INELIGIBLE.value, reason))
            else:
                eligible.append((row["id"], fleet["id"]))
    batches = rm.plan_batches([str(d) for d, _ in eligible], batch_size=data.batch_size, force=data.force)
    fleet_of = {str(d): f for d, f in eligible}
    for number, batch in enumerate(batches):
        steps += [(uuid.UUID(d), fleet_of[d], number, rm.Step.PENDING.value, None) for d in batch]
    now = s.clock.now()
    p = principal()
    row = {"id": uuid.uuid4(), "org_id": org().org_id, "fleet_ids": [f["id"] for f in fleets], "config_id": config_id,
           "version_id": version["id"], "force": data.force, "batch_size": data.batch_size,
           "success_threshold": data.success_threshold, "failure_threshold": data.failure_threshold,
           "state": rm.RolloutState.PENDING.value, "created_by": p.id, "created_by_user": p.user_id,
           "created_at": now, "updated_at": now}
    try:
        created = await s.rollouts.create(row, steps)
    except FleetBusy as exc:
        raise Conflict(f"a fleet of this request already has an active rollout ({exc})",
                       code="rollout_active") from None
    g.audit_details = {"rolloutId": str(created["id"]), "force": data.force,
                       **({"forcedBy": p.user_id and str(p.user_id) or p.id} if data.force else {})}
    try:
        await s.rollout_actor(created["id"])
    except HeldElsewhere:
        pass  # a cluster: another node's lease round took the new rollout first and runs it (hub/cluster/leases.py)
    return {"data": await _rollout_json(created["id"])}, 201


async def _rollout_json(rollout_id: uuid.UUID) -> dict:
    s = services()
    found = await s.rollouts.get(org().org_id, rollout_id)
    if found is None:
        raise NotFound("rollout not found")
    row, steps = found
    queued_by_fleet: dict[uuid.UUID, int] = {}
    for st in steps:
        if st["step"] == rm.Step.QUEUED_MAINTENANCE.value:
            queued_by_fleet[st["fleet_id"]] = queued_by_fleet.get(st["fleet_id"], 0) + 1
    openings = await _next_openings(set(queued_by_fleet))
    counts = {st.value: 0 for st in rm.Step}
    batches: dict[int, dict[str, int]] = {}
    for st in steps:
        counts[st["step"]] += 1
        b = batches.setdefault(st["batch"], {x.value: 0 for x in rm.Step})
        b[st["step"]] += 1
    return jsonable({
        "id": row["id"], "state": row["state"], "reason": row["reason"], "fleet_ids": row["fleet_ids"],
        "config_id": row["config_id"], "version_id": row["version_id"], **_names(row), "force": row["force"],
        "batch_size": row["batch_size"], "success_threshold": row["success_threshold"],
        "failure_threshold": row["failure_threshold"], "current_batch": row["current_batch"],
        "created_by": row["created_by"], "created_at": row["created_at"], "updated_at": row["updated_at"],
        "counts": counts, "total_devices": len(steps), "waiting_for_window": _waiting(queued_by_fleet, openings),
        "batches": [{"batch": n, "canary": n == 0 and len(batches) > 1 and not row["force"], "counts": c}
                    for n, c in sorted(batches.items())],
        "devices": [{"device_id": st["device_id"], "fleet_id": st["fleet_id"], "batch": st["batch"],
                     "step": st["step"], "error": st["error"], "check_output": st.get("check_output"),
                     "waiting_for_window_until": openings.get(st["fleet_id"])
                     if st["step"] == rm.Step.QUEUED_MAINTENANCE.value else None,
                     "updated_at": st["updated_at"]} for st in steps],
    })


class RolloutSummary(BaseModel):
    id: str
    state: RolloutStateName
    reason: str | None
    fleet_ids: list[str]
    config_id: str
    version_id: str
    force: bool
    batch_size: int | None
    current_batch: int
    config_name: str | None
    version_number: int | None
    fleets: list[NamedFleet]
    waiting_for_window: WaitingForWindow
    created_at: str
    updated_at: str


@bp.get("")
@query(RolloutQuery)
@responds(enveloped(RolloutSummary, many=True, paged=True))
@errors(400, 401, 403)
async def list_rollouts(query_args: RolloutQuery):
    s = services()
    # As GET /v1/rollouts/{id}: a rollout is listed only to a caller with viewer on each of its fleets.
    everything, ids, fleets = await scope_for_list(s, "viewer", "fleet")
    rows, total = await s.rollouts.list(org().org_id, offset=query_args.offset, limit=query_args.limit,
                                        state=query_args.state, only_fleets=None if everything else ids | fleets)
    openings = await _next_openings({fid for r in rows for fid in r["queued_by_fleet"]})
    return {"data": [jsonable({**{k: r[k] for k in ("id", "state", "reason", "fleet_ids", "config_id", "version_id",
                                                     "force", "batch_size", "current_batch", "created_at",
                                                     "updated_at")},
                               **_names(r), "waiting_for_window": _waiting(r["queued_by_fleet"], openings)})
                     for r in rows],
            "pagination": pagination(query_args.page, query_args.limit, total)}


async def _load(rollout_id: str, relation: str) -> dict:
    s = services()
    found = await s.rollouts.get(org().org_id, parse_uuid(rollout_id, "rollout_id"))
    if found is None:
        raise NotFound("rollout not found")
    for fid in found[0]["fleet_ids"]:
        await authorize(s, relation, Obj("fleet", fid, fid))
    return found[0]


@bp.get("/<rollout_id>")
@responds(enveloped(RolloutOut))
@errors(400, 401, 403, 404)
async def get_rollout(rollout_id: str):
    row = await _load(rollout_id, "viewer")
    return {"data": await _rollout_json(row["id"])}


async def _control(rollout_id: str, event: object):
    s = services()
    row = await _load(rollout_id, "editor")
    if row["state"] not in ("pending", "running", "paused"):
        raise Conflict(f"the rollout is {row['state']}", code="invalid_state")
    await control_rollout(s, row["id"], event)  # in a cluster, on the node holding its lease
    return {"data": await _rollout_json(row["id"])}


@bp.post("/<rollout_id>/pause")
@responds(enveloped(RolloutOut))
@errors(400, 401, 403, 404, 409)
async def pause_rollout(rollout_id: str):
    return await _control(rollout_id, rm.Pause())


@bp.post("/<rollout_id>/resume")
@responds(enveloped(RolloutOut))
@errors(400, 401, 403, 404, 409)
async def resume_rollout(rollout_id: str):
    return await _control(rollout_id, rm.Resume())


@bp.post("/<rollout_id>/cancel")
@responds(enveloped(RolloutOut))
@errors(400, 401, 403, 404, 409)
async def cancel_rollout(rollout_id: str):
    return await _control(rollout_id, rm.Cancel())


@bp.get("/<rollout_id>/events")
@errors(400, 401, 403, 404)
async def rollout_events(rollout_id: str):
    """Progress as server-sent events: the current status first, then step and state changes."""
    s = services()
    row = await _load(rollout_id, "viewer")
    first = {"kind": "rollout.snapshot", "rolloutId": str(row["id"]), "payload": await _rollout_json(row["id"])}
    subscription = await s.events.open(("rollout", row["id"]), owner=("org", org().org_id))
    access = StreamAccess.of_request(s, "viewer", *(Obj("fleet", fid, fid) for fid in row["fleet_ids"]))
    return await stream_response(subscription, first, {"rolloutId": str(row["id"])}, access)
