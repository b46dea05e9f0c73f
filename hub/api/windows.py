"""Fleet update windows: set, read, remove, and check a fleet's maintenance window.

Field names are snake_case like the spec's section. The schedule rules (zones, midnight, DST) live in
actors/machines/window.py; this module only validates, authorises, stores and answers.

Shapes (decided where the spec says "not shown"):

- ``PUT /v1/fleets/{fleet_id}/update-window`` (editor) takes all five fields and nothing else, and
  answers 200 ``{"data": {fleet_id, enabled, timezone, start_time, end_time, days_of_week,
  check: {allowed, next_window_at}}}``. A disabled window is validated and kept as sent, so enabling
  it again is one field: ``{"enabled": false}`` alone switches the stored schedule off (a fleet with
  none stays without a window: disabling needs no time zone), and so does what GET shows a fleet
  without a window (``enabled: false``, the others null); ``{"enabled": true}`` alone switches it
  on again (400 missing_field when none is stored).
- ``GET`` (viewer) always answers an object: a fleet without a window is ``enabled: false`` with
  timezone, start_time, end_time and days_of_week null — it is never ``{"data": null}``.
- ``DELETE`` (editor) removes the window (idempotent) and answers the same shape as that GET.
- ``GET .../update-window/check`` (viewer): ``{"data": {allowed, next_window_at}}`` at the hub
  clock's now; next_window_at is RFC 3339 UTC with Z, null when allowed.

Errors: 400 unknown_field / missing_field / malformed_json for the body's shape, 400 invalid_window
with the field named for a value the schedule cannot take; 403 without the relation; 404 for a fleet
that does not exist in the caller's organisation.
"""

from __future__ import annotations

import uuid
from functools import wraps
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel
from quart import Blueprint, request
from quart_schema import document_request

from actors.machines.window import FIELDS, UpdateWindow, WindowError, check
from device_client.shared.clock import rfc3339
from hub.api.common import errors, org, parse_uuid, services
from hub.api.validation import json_object, parse_body, responds
from hub.auth.authz import Obj, authorize
from hub.errors import BadRequest, NotFound
from storage.windows import FleetWindow, UpdateWindows

bp = Blueprint("windows", __name__, url_prefix="/v1/fleets")

DayName = Literal["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_HHMM = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"


class UpdateWindowIn(BaseModel):
    """A fleet's update window. All fields are required; none other is accepted."""
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(..., description="the window is in force; a disabled window always allows")
    timezone: str = Field(..., description="IANA zone name; the schedule is evaluated in this zone",
                          examples=["Europe/Berlin"])
    start_time: str = Field(..., pattern=_HHMM, description="window start, wall time HH:MM",
                            examples=["22:00"])
    end_time: str = Field(..., pattern=_HHMM, examples=["04:00"],
                          description="window end, HH:MM; before start_time the window crosses midnight and "
                                      "belongs to the day it starts on; equal to start_time means the whole day")
    days_of_week: list[DayName] = Field(..., max_length=7, examples=[["Monday", "Tuesday"]],
                                        description="days the window opens on, no duplicates; "
                                                    "at least one when enabled")


class WindowSwitch(BaseModel):
    """Switch the stored schedule off (or on again) without sending it."""
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(..., description="false: the window stops holding rollouts, its schedule is kept (no "
                                           "window stored: the fleet has none); true: the stored schedule is in "
                                           "force again")


class UpdateWindowBody(RootModel[UpdateWindowIn | WindowSwitch]):
    """The five fields of a window, or ``enabled`` alone to switch the stored schedule."""


class _WindowFields(BaseModel):
    """The body's shape only (unknown and missing fields); the values are UpdateWindow.parse's."""
    model_config = ConfigDict(extra="forbid")
    enabled: Any
    timezone: Any
    start_time: Any
    end_time: Any
    days_of_week: Any


class WindowCheckOut(BaseModel):
    allowed: bool = Field(..., description="true inside the window, or when there is no enabled window")
    next_window_at: str | None = Field(..., description="when not allowed: the next window start, RFC 3339 UTC")


class UpdateWindowOut(BaseModel):
    fleet_id: uuid.UUID
    enabled: bool
    timezone: str | None = Field(..., description="null when the fleet has no window")
    start_time: str | None
    end_time: str | None
    days_of_week: list[DayName] | None


class UpdateWindowSaved(UpdateWindowOut):
    check: WindowCheckOut


class UpdateWindowEnvelope(BaseModel):
    data: UpdateWindowOut


class UpdateWindowSavedEnvelope(BaseModel):
    data: UpdateWindowSaved


class WindowCheckEnvelope(BaseModel):
    data: WindowCheckOut


def _windows() -> UpdateWindows:
    return services().stores.windows


def _parsed(fields: dict[str, Any]) -> UpdateWindow:
    try:
        return UpdateWindow.parse(fields)
    except WindowError as exc:
        raise BadRequest(str(exc), code="invalid_window",
                         details=[{"field": exc.field, "problem": exc.message}]) from None


def _is_switch(raw: dict[str, Any]) -> bool:
    """``enabled`` alone; or ``enabled: false`` with the other fields null, as GET shows a fleet
    without a window (what GET answered, PUT takes back)."""
    if not isinstance(raw.get("enabled"), bool) or not set(raw) <= set(FIELDS):
        return False
    rest = [raw[k] for k in raw if k != "enabled"]
    return not rest or (raw["enabled"] is False and all(v is None for v in rest))


def _window_body(func):
    """Parse the body into an UpdateWindow: shape errors as everywhere, value errors invalid_window.
    A body of ``enabled`` alone (a boolean) is a switch of the stored schedule instead (``switch``):
    disabling needs no time zone, and enabling again needs nothing the hub already holds."""
    @wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        data = await request.get_data()
        raw = json_object(data) if data else None
        if raw is not None and _is_switch(raw):
            return await func(*args, window=None, switch=raw["enabled"], **kwargs)
        fields = await parse_body(_WindowFields)
        return await func(*args, window=_parsed(fields.model_dump()), switch=None, **kwargs)

    return document_request(UpdateWindowBody)(wrapper)


async def _load(fleet_id: str, relation: str) -> FleetWindow:
    s = services()
    found = await _windows().get(org().org_id, parse_uuid(fleet_id, "fleet_id"))
    if found is None:
        raise NotFound("fleet not found")
    await authorize(s, relation, Obj("fleet", found.fleet_id, found.fleet_id))
    return found


def _stored(found: FleetWindow) -> UpdateWindow | None:
    return UpdateWindow.parse(found.window) if found.window is not None else None


def _window_json(fleet_id: uuid.UUID, window: UpdateWindow | None) -> dict[str, Any]:
    if window is None:
        return {"fleet_id": str(fleet_id), "enabled": False, "timezone": None, "start_time": None,
                "end_time": None, "days_of_week": None}
    return {"fleet_id": str(fleet_id), **window.to_json()}


def _check_json(window: UpdateWindow | None) -> dict[str, Any]:
    result = check(window, services().clock.now())
    return {"allowed": result.allowed, "next_window_at": rfc3339(result.next_window_at)}


def _reload(fleet_id: uuid.UUID) -> None:
    services().fleet_changed(fleet_id)  # the fleet's actor and its running rollouts re-read the window


@bp.put("/<fleetId>/update-window")
@_window_body
@responds(UpdateWindowSavedEnvelope)
@errors(400, 401, 403, 404)
async def put_window(fleetId: str, window: UpdateWindow | None, switch: bool | None):
    s = services()
    found = await _load(fleetId, "editor")
    if switch is not None:
        window = _switched(found, switch)
    if not await _windows().set(org().org_id, found.fleet_id, window.to_json() if window is not None else None, s.clock.now()):
        raise NotFound("fleet not found")
    _reload(found.fleet_id)
    return {"data": {**_window_json(found.fleet_id, window), "check": _check_json(window)}}


def _switched(found: FleetWindow, enabled: bool) -> UpdateWindow | None:
    """The stored schedule switched on or off. Off with none stored is no window (what GET already
    shows such a fleet); on with none stored needs the schedule, so it is refused as a body missing it."""
    if found.window is None:
        if not enabled:
            return None
        raise BadRequest("timezone: Field required (no schedule is stored to enable: send all five fields)",
                         code="missing_field", details=[{"field": "timezone", "problem": "Field required"}])
    return _parsed({**found.window, "enabled": enabled})


@bp.get("/<fleetId>/update-window")
@responds(UpdateWindowEnvelope)
@errors(400, 401, 403, 404)
async def get_window(fleetId: str):
    found = await _load(fleetId, "viewer")
    return {"data": _window_json(found.fleet_id, _stored(found))}


@bp.delete("/<fleetId>/update-window")
@responds(UpdateWindowEnvelope)
@errors(400, 401, 403, 404)
async def delete_window(fleetId: str):
    s = services()
    found = await _load(fleetId, "editor")
    if found.window is not None:
        if not await _windows().set(org().org_id, found.fleet_id, None, s.clock.now()):
            raise NotFound("fleet not found")
        _reload(found.fleet_id)
    return {"data": _window_json(found.fleet_id, None)}


@bp.get("/<fleetId>/update-window/check")
@responds(WindowCheckEnvelope)
@errors(400, 401, 403, 404)
async def check_window(fleetId: str):
    found = await _load(fleetId, "viewer")
    return {"data": _check_json(_stored(found))}
