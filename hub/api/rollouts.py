"""Rollouts (spec: Rollout requests; Endpoints: Rollouts) — snake_case like the spec's section.

Two request forms for POST /v1/rollouts: forced {fleet_id, config_id, force} and batched
{fleet_ids, configuration_id, batch_size}; either may name a version (default: the configuration's
current one) and thresholds. The impact calculation answers what a rollout would do right now; the
spec names its body {fleet_id, target_version_id, force}. The spec fixes each of these names, and
names one thing differently in each form, so every form's names are taken by both endpoints
(RolloutSelection): a body written for one works for the other. Reverts (hub/api/reverts.py)
are rollouts too, started through ``start_rollout``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, copy_current_app_context, g
from quart_schema import document_request

from actors.machines import rollout as rm
from actors.machines.window import UpdateWindow, WindowError, check, is_open, next_start_after
from device_client.shared.clock import rfc3339
from device_client.shared.protocol import runs_containers
from hub.cluster.asks import control_rollout
from hub.cluster.leases import HeldElsewhere
from hub.api.common import PageQuery, errors, jsonable, org, pagination, parse_uuid, principal, services
from hub.api.rollout_forms import ONE_CONFIG, ImpactBody, RolloutIn, RolloutRequest, RolloutSelection
from hub.api.sse import resume_point, stream_response
from hub.auth.routes import org_of
from hub.auth.streams import StreamAccess
from hub.api.validation import enveloped, parse_body, query, responds
from hub.auth.authz import Obj, authorize, require_deploy, scope_for_list
from hub.errors import BadRequest, Conflict, Forbidden, NotFound
from storage.rollouts import FleetBusy

bp = Blueprint("rollouts", __name__, url_prefix="/v1/rollouts")

PENDING_ACTIONS = ("health_check", "battery_discharging", "mission_critical")


# The enumerations as the machine spells them (actors/machines/rollout.py), for the document.
RolloutStateName = Literal[tuple(st.value for st in rm.RolloutState)]  # type: ignore[valid-type]
StepName = Literal[tuple(st.value for st in rm.Step)]  # type: ignore[valid-type]


class RolloutQuery(PageQuery):
    state: RolloutStateName | None = None


async def _fleets(fleet_ids: list[uuid.UUID]) -> list[dict]:
    s = services()
    fleets = []
    for fid in dict.fromkeys(fleet_ids):
        fleet = await s.stores.fleets.get(org().org_id, fid)
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
    stored = await s.stores.windows.get_many(org().org_id, list(fleet_ids)) if fleet_ids else {}
    now = s.clock.now()
    return {fid: rfc3339(check(_window({"update_window": raw}), now).next_window_at) for fid, raw in stored.items()}


def _waiting(queued_by_fleet: dict[uuid.UUID, int], openings: dict[uuid.UUID, str | None]) -> dict:
    """Devices held back by a closed update window: how many, and until when the first of them waits
    (the earliest next opening of their fleets; None when a window is open and the rollout's next
    tick starts them)."""
    nexts = [openings.get(fid) for fid, n in queued_by_fleet.items() if n]
    return {"devices": sum(queued_by_fleet.values()),
            "until": min(nexts) if nexts and None not in nexts else None}  # one format, UTC: strings compare


def _eligibility(device: dict, fleet: dict, live: dict | None, version: dict) -> str | None:
    """Why a device is not eligible (online, fleet architecture, fleet tags, a container engine for a
    version with containers), or None."""
    if not (live and live["online"]):
        return "offline"
    if version["spec"].get("containers") and not runs_containers(live.get("facts")):
        return "no container engine (the version runs containers; the device's agent offers none)"
    arch = (live.get("facts") or {}).get("architecture") or device["architecture"]
    if fleet["architecture"] and arch != fleet["architecture"]:
        return f"architecture {arch or 'unknown'} does not match the fleet's {fleet['architecture']}"
    missing = set(fleet["tags"]) - set(device["tags"])
    if missing:
        return f"missing fleet tags: {', '.join(sorted(missing))}"
    return None


async def _fleet_devices(fleet: dict) -> list[tuple[dict, dict | None]]:
    s = services()
    rows, _ = await s.stores.devices.list(org().org_id, offset=0, limit=100_000, fleet_id=fleet["id"])
    out = []
    for row in rows:
        # None: not live here (offline; in a cluster, held by another node, whose presence row says it)
        live = s.device_live(row)
        if live is None:
            live = s.topology.presence_from_row(row)
        out.append((row, live))
    return out


class ImpactOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    fleet_id: str | None = Field(..., description="the fleet, when the request named one")
    fleet_ids: list[str]
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
    revert_kind: Literal["fleet", "device"] | None = Field(None, description="a revert's (POST /v1/fleets/{id}/revert "
                                                                             "or /v1/devices/{id}/revert), else null")
    revert_of: str | None = Field(None, description="a fleet revert: the rollout it undoes")


async def _selected(data: RolloutSelection, *, authorize_config: bool) -> tuple[list[dict], uuid.UUID, dict]:
    """The fleets (editor on each), the configuration and the version a request names."""
    s = services()
    fleets = await _fleets(data.fleets())
    config_id, version_id = data.configuration(), data.version()
    named = "target_version_id" if data.target_version_id is not None else "version_id"
    if config_id is not None:
        found = await s.stores.configs.get(org().org_id, config_id)
        if found is None:
            raise BadRequest("configuration not in this organisation", code="invalid_reference")
        version = found[1]
    elif version_id is None:
        raise BadRequest(f"target_version_id: give a version, or {ONE_CONFIG} (its current version)",
                         code="missing_field")
    if version_id is not None:
        version = await s.stores.configs.version(org().org_id, version_id)
        if version is None:
            raise BadRequest(f"{named}: no such configuration version in this organisation",
                             code="invalid_reference")
        if config_id is not None and version["config_id"] != config_id:
            raise BadRequest(f"{named}: not a version of this configuration", code="invalid_reference")
    if authorize_config:
        await require_deploy(s, version["config_id"])
    return fleets, version["config_id"], version


async def _impact_of(fleet: dict, version: dict, force: bool, now) -> dict:
    window = _window(fleet)
    in_window = force or window is None or is_open(window, now)
    eligible, ineligible, pending = [], [], {a: [] for a in PENDING_ACTIONS}
    for row, live in await _fleet_devices(fleet):
        reason = _eligibility(row, fleet, live, version)
        if reason:
            ineligible.append({"device_id": str(row["id"]), "reason": reason})
            continue
        eligible.append(str(row["id"]))
        for action in (live.get("facts") or {}).get("pendingActions") or []:
            if action in pending:
                pending[action].append(str(row["id"]))
    return {"eligible": eligible, "ineligible": ineligible, "pending": pending, "in_window": in_window,
            "next_window_at": None if in_window else next_start_after(window, now),
            "window_bypassed": bool(force and window is not None and not is_open(window, now))}


@bp.post("/impact")
@document_request(ImpactBody)
@responds(enveloped(ImpactOut))
@errors(400, 401, 403, 404)
async def impact():
    """What a rollout would do now. The spec's form is {fleet_id, target_version_id, force}; the
    create forms' names are taken too (RolloutSelection), and over several fleets the counts are
    their sums (each fleet's window decides for its devices)."""
    data = await parse_body(RolloutSelection)
    fleets, _, version = await _selected(data, authorize_config=False)
    now = services().clock.now()
    parts = [await _impact_of(fleet, version, data.force, now) for fleet in fleets]
    eligible = [d for p in parts for d in p["eligible"]]
    queued = [d for p in parts if not p["in_window"] for d in p["eligible"]]
    pending = {a: [d for p in parts for d in p["pending"][a]] for a in PENDING_ACTIONS}
    starts = [p["next_window_at"] for p in parts if p["next_window_at"] is not None]
    return {"data": {
        "fleet_id": str(fleets[0]["id"]) if len(fleets) == 1 else None,
        "fleet_ids": [str(f["id"]) for f in fleets],
        "target_version_id": str(version["id"]), "force": data.force,
        "eligible_devices": len(eligible), "eligible_device_ids": eligible,
        "ineligible_devices": [d for p in parts for d in p["ineligible"]],
        "in_window": len(eligible) - len(queued),
        "queued_for_next_window": len(queued),
        "next_window_at": rfc3339(min(starts)) if starts else None,
        "window_bypassed": any(p["window_bypassed"] for p in parts),
        "pending_actions": pending,
        "devices_with_pending_actions": len({d for ids in pending.values() for d in ids}),
    }}


@bp.post("")
@document_request(RolloutRequest)
@responds(enveloped(RolloutOut), 201)
@errors(400, 401, 403, 404, 409)
async def create_rollout():
    data = await parse_body(RolloutIn)
    fleets, config_id, version = await _selected(data, authorize_config=True)
    return {"data": await start_rollout(fleets, config_id, version, force=data.force, batch_size=data.batch_size,
                                        success_threshold=data.success_threshold,
                                        failure_threshold=data.failure_threshold)}, 201


async def start_rollout(fleets: list[dict], config_id: uuid.UUID, version: dict, *, force: bool,
                        batch_size: int | None, success_threshold: float, failure_threshold: float,
                        only_devices: set[uuid.UUID] | None = None, revert_kind: str | None = None,
                        revert_of: uuid.UUID | None = None, audit: dict | None = None) -> dict:
    """Plan, store and start a rollout of ``version`` over the fleets' eligible devices (only
    ``only_devices`` of them when given: a device's revert); the caller has authorised it. Every
    rollout goes through here, so a revert passes the same gates (windows unless forced, canary and
    batches, thresholds, memory-test deferral in the machine, one active rollout per fleet)."""
    s = services()
    eligible, steps = [], []
    for fleet in fleets:
        for row, live in await _fleet_devices(fleet):
            if only_devices is not None and row["id"] not in only_devices:
                continue
            reason = _eligibility(row, fleet, live, version)
            if reason:
                steps.append((row["id"], fleet["id"], 0, rm.Step.INELIGIBLE.value, reason))
            else:
                eligible.append((row["id"], fleet["id"]))
    if only_devices is not None and not eligible:
        why = "; ".join(st[4] for st in steps) or "not in the fleet"
        raise Conflict(f"the device cannot take a rollout now: {why}", code="device_ineligible")
    batches = rm.plan_batches([str(d) for d, _ in eligible], batch_size=batch_size, force=force)
    fleet_of = {str(d): f for d, f in eligible}
    for number, batch in enumerate(batches):
        steps += [(uuid.UUID(d), fleet_of[d], number, rm.Step.PENDING.value, None) for d in batch]
    now = s.clock.now()
    p = principal()
    row = {"id": uuid.uuid4(), "org_id": org().org_id, "fleet_ids": [f["id"] for f in fleets], "config_id": config_id,
           "version_id": version["id"], "force": force, "batch_size": batch_size,
           "success_threshold": success_threshold, "failure_threshold": failure_threshold,
           "state": rm.RolloutState.PENDING.value, "created_by": p.id, "created_by_user": p.user_id,
           "created_at": now, "updated_at": now, "revert_kind": revert_kind, "revert_of": revert_of}
    try:
        created = await s.topology.create_rollout(row, steps)
    except FleetBusy as exc:
        raise await active_rollout_conflict(uuid.UUID(str(exc))) from None
    g.audit_details = {"rolloutId": str(created["id"]), "force": force, **(audit or {}),
                       **({"forcedBy": p.user_id and str(p.user_id) or p.id} if force else {})}
    try:
        await s.rollout_actor(created["id"])
    except HeldElsewhere:
        pass  # a cluster node cut off from NATS creates it unowned: another node's lease round runs it
    return await _rollout_json(created["id"])


async def _rollout_json(rollout_id: uuid.UUID) -> dict:
    s = services()
    found = await s.stores.rollouts.get(org().org_id, rollout_id)
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
        "revert_kind": row.get("revert_kind"), "revert_of": row.get("revert_of"),
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
    revert_kind: Literal["fleet", "device"] | None = None
    revert_of: str | None = None


@bp.get("")
@query(RolloutQuery)
@responds(enveloped(RolloutSummary, many=True, paged=True))
@errors(400, 401, 403)
async def list_rollouts(query_args: RolloutQuery):
    s = services()
    # As GET /v1/rollouts/{id}: a rollout is listed only to a caller with viewer on each of its fleets.
    everything, ids, fleets = await scope_for_list(s, "viewer", "fleet")
    rows, total = await s.stores.rollouts.list(org().org_id, offset=query_args.offset, limit=query_args.limit,
                                        state=query_args.state, only_fleets=None if everything else ids | fleets)
    openings = await _next_openings({fid for r in rows for fid in r["queued_by_fleet"]})
    return {"data": [jsonable({**{k: r[k] for k in ("id", "state", "reason", "fleet_ids", "config_id", "version_id",
                                                     "force", "batch_size", "current_batch", "created_at",
                                                     "updated_at", "revert_kind", "revert_of")},
                               **_names(r), "waiting_for_window": _waiting(r["queued_by_fleet"], openings)})
                     for r in rows],
            "pagination": pagination(query_args.page, query_args.limit, total)}


async def active_rollout_conflict(rollout_id: uuid.UUID) -> Conflict:
    """409 rollout_active, naming the active rollout only to a caller who may view it (viewer on
    every one of its fleets): another's id would be a handle on something they get 403 for."""
    s = services()
    found = await s.stores.rollouts.get(org().org_id, rollout_id)
    visible = found is not None
    for fid in found[0]["fleet_ids"] if found is not None else ():
        try:
            await authorize(s, "viewer", Obj("fleet", fid, fid))
        except Forbidden:
            visible = False
            break
    if visible:
        return Conflict(f"rollout {rollout_id} is active on a fleet of this request: pause or cancel it first "
                        f"(POST /v1/rollouts/{rollout_id}/cancel)", code="rollout_active")
    return Conflict("a rollout is active on a fleet of this request, on fleets you cannot all view: "
                    "ask someone who can view them to pause or cancel it", code="rollout_active")


async def _load(rollout_id: str, relation: str) -> dict:
    s = services()
    found = await s.stores.rollouts.get(org().org_id, parse_uuid(rollout_id, "rollout_id"))
    if found is None:
        raise NotFound("rollout not found")
    for fid in found[0]["fleet_ids"]:
        await authorize(s, relation, Obj("fleet", fid, fid))
    return found[0]


async def _rollout_org(services, rollout_id: str) -> uuid.UUID | None:
    return await services.stores.rollouts.org_of(parse_uuid(rollout_id, "rollout_id"))


@bp.get("/<rollout_id>")
@org_of(_rollout_org)
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
@org_of(_rollout_org)
@responds(enveloped(RolloutOut))
@errors(400, 401, 403, 404, 409)
async def pause_rollout(rollout_id: str):
    return await _control(rollout_id, rm.Pause())


@bp.post("/<rollout_id>/resume")
@org_of(_rollout_org)
@responds(enveloped(RolloutOut))
@errors(400, 401, 403, 404, 409)
async def resume_rollout(rollout_id: str):
    return await _control(rollout_id, rm.Resume())


@bp.post("/<rollout_id>/cancel")
@org_of(_rollout_org)
@responds(enveloped(RolloutOut))
@errors(400, 401, 403, 404, 409)
async def cancel_rollout(rollout_id: str):
    return await _control(rollout_id, rm.Cancel())


@bp.get("/<rollout_id>/events")
@org_of(_rollout_org)
@errors(400, 401, 403, 404, 410)
async def rollout_events(rollout_id: str):
    """Progress as server-sent events: the current status first, then step and state changes."""
    s = services()
    row = await _load(rollout_id, "viewer")
    subscription = await s.events.open(("rollout", row["id"]), owner=("org", org().org_id))
    replay = await resume_point(s, subscription, org().org_id, f"rollouts/{row['id']}")
    try:
        first = {"kind": "rollout.snapshot", "rolloutId": str(row["id"]), "payload": await _rollout_json(row["id"])}
    except BaseException:
        subscription.close()
        raise
    access = StreamAccess.of_request(s, "viewer", *(Obj("fleet", fid, fid) for fid in row["fleet_ids"]))

    @copy_current_app_context
    async def snapshot() -> dict:
        return {**first, "payload": await _rollout_json(row["id"])}

    return await stream_response(subscription, first, {"rolloutId": str(row["id"])}, access, replay, snapshot)
