"""Reverts: take a fleet or a device back to the version it ran before (issue 37 item 5).

A revert is a rollout (``start_rollout``), not a side door: it passes every gate a rollout does —
editor on the fleet and viewer on the configuration, the fleets' update windows unless ``force``,
canary and batches, the thresholds that pause it, memory-test deferral, one active rollout per fleet
— and it is audited, listed, paused and cancelled like any other. What is taken back to:

- a fleet: what its devices ran when its newest rollout that is not itself a revert (of the fleet
  or of one of its devices) was created (recorded per device step, migration 0021); where they ran
  different versions, the one most of them ran. The fleet's newest rollout must have settled
  (completed, failed or cancelled): a running one is cancelled first, which already gives back what
  each device it had not finished runs (docs/operations.md). Reverting again sends the same version
  again (to the devices the first revert missed), never the version reverted from: going forward is
  a rollout.
- a device: the version it ran before the one it runs (``devices.previous_version_id``, kept by a
  trigger on every change of what it runs), as a rollout of its fleet over that device alone. Once
  it is back on that version nothing earlier is known, and a second revert is a 409.

Why dedicated routes rather than a flag on ``POST /v1/rollouts``: the hub, not the caller, decides
the version, so the body the spec fixes for a rollout (a configuration and a version) would be
half ignored; and the route sits on the thing an operator reverts, as Revert sits on its page.

Errors: 404 for a fleet or device not in the organisation; 409 ``no_earlier_version`` when there is
nothing to go back to, ``rollout_active`` while a rollout of the fleet is active, ``device_not_in_fleet``
(a fleetless device has no rollout: assign it the version directly), ``device_ineligible`` (offline,
or not matching its fleet's architecture or tags).
"""

from __future__ import annotations

import uuid

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, request
from quart_schema import document_request

from hub.api.common import errors, org, parse_uuid, services
from hub.api.rollouts import RolloutOut, active_rollout_conflict, start_rollout
from hub.api.validation import enveloped, optional_body, parse_body, responds
from hub.auth.authz import Obj, authorize, require_deploy
from hub.errors import Conflict, NotFound
from storage.rollouts import ACTIVE

bp = Blueprint("reverts", __name__, url_prefix="/v1")


class RevertIn(BaseModel):
    """All optional: an empty body (or none) reverts with the gates of a rollout."""
    model_config = ConfigDict(extra="forbid")
    force: bool = Field(False, description="true bypasses the update window (one batch, no canary)")
    batch_size: int | None = Field(None, ge=1, le=100_000, description="a fleet's: devices per batch after a "
                                                                      "canary; default the reverted rollout's")
    success_threshold: float | None = Field(None, ge=0, le=1, description="default the reverted rollout's")
    failure_threshold: float | None = Field(None, ge=0, le=1, description="default the reverted rollout's")


async def _revert_body() -> RevertIn:
    return RevertIn() if not (await request.get_data()).strip() else await parse_body(RevertIn)


async def _fleet(fleet_id: uuid.UUID) -> dict:
    s = services()
    fleet = await s.stores.fleets.get(org().org_id, fleet_id)
    if fleet is None:
        raise NotFound("fleet not found")
    await authorize(s, "editor", Obj("fleet", fleet["id"], fleet["id"]))
    return fleet


async def _version(version_id: uuid.UUID) -> dict:
    s = services()
    version = await s.stores.configs.version(org().org_id, version_id)
    if version is None:  # removed with its configuration since
        raise Conflict("the version to go back to no longer exists", code="no_earlier_version")
    await require_deploy(s, version["config_id"])  # a revert delivers too (docs/security.md)
    return version


@bp.post("/fleets/<fleet_id>/revert")
@optional_body
@document_request(RevertIn)
@responds(enveloped(RolloutOut), 201)
@errors(400, 401, 403, 404, 409)
async def revert_fleet(fleet_id: str):
    """Roll the fleet back to what it ran before its newest rollout: a rollout of that version."""
    s = services()
    data = await _revert_body()
    fleet = await _fleet(parse_uuid(fleet_id, "fleet_id"))
    newest = await s.stores.rollouts.latest_of_fleet(org().org_id, fleet["id"])
    if newest is not None and newest["state"] in ACTIVE:
        raise await active_rollout_conflict(newest["id"])
    last = await s.stores.rollouts.latest_of_fleet(org().org_id, fleet["id"], reverts=False)
    if last is None:
        raise Conflict("the fleet has had no rollout: there is no earlier version to go back to",
                       code="no_earlier_version")
    before = await s.stores.rollouts.versions_before(last["id"], fleet["id"])
    if not before:
        raise Conflict(f"before rollout {last['id']} the fleet's devices ran no other version",
                       code="no_earlier_version")
    version = await _version(before[0]["version_id"])
    rollout = await start_rollout(
        [fleet], version["config_id"], version, force=data.force,
        batch_size=data.batch_size if data.batch_size is not None else last["batch_size"],
        success_threshold=_or(data.success_threshold, last["success_threshold"]),
        failure_threshold=_or(data.failure_threshold, last["failure_threshold"]),
        revert_kind="fleet", revert_of=last["id"],
        audit={"revertOf": str(last["id"]), "fromVersionId": str(last["version_id"]),
               "toVersionId": str(version["id"])})
    rollout["revert"] = {"of_rollout": str(last["id"]), "from_version_id": str(last["version_id"]),
                         "to_version_id": str(version["id"]), "to_version": version["version"],
                         "versions_before": [{"version_id": str(b["version_id"]), "devices": b["devices"]}
                                             for b in before]}
    return {"data": rollout}, 201


@bp.post("/devices/<device_id>/revert")
@optional_body
@document_request(RevertIn)
@responds(enveloped(RolloutOut), 201)
@errors(400, 401, 403, 404, 409)
async def revert_device(device_id: str):
    """Roll the device back to the version it ran before the one it runs: a rollout of its fleet
    over this device alone."""
    s = services()
    data = await _revert_body()
    # the version it ran before the one it runs now, as PostgreSQL says (another node may have just moved it)
    device = await s.stores.devices.get(org().org_id, parse_uuid(device_id, "device_id"), current=True)
    if device is None:
        raise NotFound("device not found")
    await authorize(s, "editor", Obj("device", device["id"], device["fleet_id"]))
    previous = device["previous_version_id"]
    if previous is None:
        raise Conflict("the device has run no other version before the one it runs", code="no_earlier_version")
    if device["fleet_id"] is None:
        raise Conflict(f"the device is in no fleet, and a revert is a rollout of its fleet: assign the version "
                       f"directly (PUT /v1/devices/{device['id']}/configuration with versionId {previous})",
                       code="device_not_in_fleet")
    fleet = await _fleet(device["fleet_id"])
    version = await _version(previous)
    runs = str(device["applied_version_id"]) if device["applied_version_id"] else None  # none after a reset
    rollout = await start_rollout(
        [fleet], version["config_id"], version, force=data.force, batch_size=None,
        success_threshold=_or(data.success_threshold, 0.9), failure_threshold=_or(data.failure_threshold, 0.1),
        only_devices={device["id"]}, revert_kind="device",
        audit={"revertDevice": str(device["id"]), "fromVersionId": runs, "toVersionId": str(version["id"])})
    rollout["revert"] = {"device_id": str(device["id"]), "from_version_id": runs,
                         "to_version_id": str(version["id"]), "to_version": version["version"]}
    return {"data": rollout}, 201


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
