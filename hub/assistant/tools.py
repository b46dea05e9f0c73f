"""The allow-listed tools: read-only questions about the caller's own fleet.

Each runs with the caller's own permissions through the same pieces the REST handlers use
(hub/auth/authz.py): the caller's relation tuples (``tuples_of``; an org admin holds everything) and
the pure ``holds`` / ``visible`` that ``authorize`` and ``scope_for_list`` apply. They take an explicit
``Caller`` instead of reading the request's ``g`` because tool calls also run while the response
streams, after the request context is gone. A device, fleet, rollout or configuration the caller may
not view answers exactly like a missing one, so a tool never tells a member about a fleet they may
not see.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from hub.api.common import jsonable
from hub.api.configurations import config_json
from hub.api.fleets import fleet_json
from hub.auth.authz import Obj, holds, tuples_of, visible

MAX_ROWS = 50

_DEVICE_ARG = {"type": "object", "properties": {"device": {
    "type": "string", "description": "the device's id or its exact name"}}, "required": ["device"]}

TOOL_DEFINITIONS: list[dict] = [
    {"type": "function", "function": {
        "name": "list_fleets", "description": "The fleets the user may view, with their device counts.",
        "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {
        "name": "list_devices",
        "description": "The devices the user may view (at most 50): name, fleet, online, state, last seen.",
        "parameters": {"type": "object", "properties": {
            "fleet_id": {"type": "string", "description": "only this fleet"},
            "online": {"type": "boolean", "description": "only online (true) or offline (false) devices"}}}}},
    {"type": "function", "function": {
        "name": "get_device", "description": "One device's details: state, boot reason, firmware, configuration.",
        "parameters": _DEVICE_ARG}},
    {"type": "function", "function": {
        "name": "memory_test_status",
        "description": "A device's memory-test support, the test running now and the last result it reported.",
        "parameters": _DEVICE_ARG}},
    {"type": "function", "function": {
        "name": "list_rollouts", "description": "Recent rollouts on fleets the user may view, newest first.",
        "parameters": {"type": "object", "properties": {"state": {
            "type": "string", "enum": ["pending", "running", "paused", "completed", "failed", "cancelled"]}}}}},
    {"type": "function", "function": {
        "name": "list_configurations", "description": "Configurations the user may view, with current versions.",
        "parameters": {"type": "object", "properties": {"search": {
            "type": "string", "description": "words in the name or description"}}}}},
]
TOOL_NAMES: tuple[str, ...] = tuple(t["function"]["name"] for t in TOOL_DEFINITIONS)


@dataclass(frozen=True)
class Caller:
    org_id: uuid.UUID
    user_id: uuid.UUID
    is_admin: bool
    is_staff: bool = False


class _Scope:
    """The caller's tuples, loaded once per tool call (cached and invalidated by the AuthCache)."""

    def __init__(self, caller: Caller, tuples: frozenset | None) -> None:
        self.caller = caller
        self.tuples = tuples

    def may(self, relation: str, obj: Obj) -> bool:
        return self.tuples is None or holds(self.tuples, relation, obj, self.caller.org_id)

    def listing(self, object_type: str) -> tuple[bool, set, set]:
        if self.tuples is None:
            return True, set(), set()
        return visible(self.tuples, "viewer", object_type, self.caller.org_id)


async def _scope(services, caller: Caller) -> _Scope:
    tuples = None if caller.is_admin else await tuples_of(services, caller.org_id, "user", caller.user_id)
    return _Scope(caller, tuples)


def definitions(names: list[str]) -> list[dict]:
    return [t for t in TOOL_DEFINITIONS if t["function"]["name"] in names]


def _live(services, row: dict) -> dict:
    return services.device_live(row) or {}


def _device_summary(services, row: dict) -> dict:
    live = _live(services, row)
    return jsonable({"id": row["id"], "name": row["name"], "fleet_id": row["fleet_id"],
                     "online": live.get("online", row["online"]), "state": live.get("state", row["state"]),
                     "last_seen": live.get("lastSeenAt", row["last_seen_at"])})


async def _find_device(services, scope: _Scope, ref: Any) -> dict | None:
    if not isinstance(ref, str) or not ref.strip():
        return None
    org_id = scope.caller.org_id
    try:
        row = await services.stores.devices.get(org_id, uuid.UUID(ref.strip()))
    except ValueError:
        everything, ids, fleets = scope.listing("device")
        rows, _ = await services.stores.devices.list(org_id, offset=0, limit=500,
                                              only=None if everything else (ids, fleets))
        row = next((r for r in rows if r["name"] == ref.strip()), None)
    if row is None or not scope.may("viewer", Obj("device", row["id"], row["fleet_id"])):
        return None
    return row


_NOT_VISIBLE = {"error": "not_found", "message": "no such device is visible to you"}


async def list_fleets(services, scope: _Scope, args: dict) -> dict:
    everything, ids, fleets = scope.listing("fleet")
    rows, total = await services.stores.fleets.list(scope.caller.org_id, offset=0, limit=MAX_ROWS,
                                             only=None if everything else ids | fleets)
    return {"fleets": [{k: v for k, v in fleet_json(r).items() if k in ("id", "name", "device_count")}
                       for r in rows], "total": total}


async def list_devices(services, scope: _Scope, args: dict) -> dict:
    everything, ids, fleets = scope.listing("device")
    fleet_id = None
    if args.get("fleet_id"):
        try:
            fleet_id = uuid.UUID(str(args["fleet_id"]))
        except ValueError:
            return {"error": "invalid", "message": "fleet_id is not a valid id"}
    online = args.get("online") if isinstance(args.get("online"), bool) else None
    rows, total = await services.stores.devices.list(scope.caller.org_id, offset=0, limit=MAX_ROWS, fleet_id=fleet_id,
                                              only=None if everything else (ids, fleets))
    devices = [_device_summary(services, r) for r in rows]
    if online is not None:
        devices = [d for d in devices if d["online"] is online]
    return {"devices": devices, "total": len(devices) if online is not None else total}


async def get_device(services, scope: _Scope, args: dict) -> dict:
    row = await _find_device(services, scope, args.get("device"))
    if row is None:
        return _NOT_VISIBLE
    live = _live(services, row)
    facts = live.get("facts") or {}
    return {**_device_summary(services, row), **jsonable({
        "boot_reason": live.get("bootReason", row["boot_reason"]),
        "firmware": facts.get("firmware") or row["firmware"],
        "architecture": facts.get("architecture") or row["architecture"], "tags": row["tags"],
        "configuration": {"config_id": row.get("config_id"), "applied_version_id": row.get("applied_version_id"),
                          "status": row.get("config_status")}})}


def _brief(value: Any) -> Any:
    """Scalars of a stored memory-test record; lists (errors, pages: up to 256 each) become counts."""
    if not isinstance(value, dict):
        return value
    out: dict = {}
    for k, v in value.items():
        if isinstance(v, list):
            out[f"{k}Count"] = len(v)
        elif isinstance(v, dict):
            out[k] = {kk: vv for kk, vv in v.items() if not isinstance(vv, (list, dict))}
        else:
            out[k] = v
    return out


async def memory_test_status(services, scope: _Scope, args: dict) -> dict:
    row = await _find_device(services, scope, args.get("device"))
    if row is None:
        return _NOT_VISIBLE
    facts = _live(services, row).get("facts") or row.get("facts")
    if isinstance(facts, str):
        facts = json.loads(facts)
    caps = ((facts or {}).get("capabilities") or {}).get("memoryTest")
    out: dict = {"device": row["name"], "device_id": str(row["id"]), "capabilities": caps,
                 "running_when_connected": (facts or {}).get("memoryTestRunning")}
    store = getattr(services, "memtests", None)
    if store is None:
        out["note"] = "stored memory-test results are not available on this deployment"
        return jsonable(out)
    stored = await store.stored(scope.caller.org_id, row["id"], 5)
    out.update(status=_brief(stored["status"]), health=_brief(stored["health"]),
               recent_results=[_brief(r) for r in stored["history"]])
    return jsonable(out)


async def list_rollouts(services, scope: _Scope, args: dict) -> dict:
    state = args.get("state") if isinstance(args.get("state"), str) else None
    rows, _ = await services.stores.rollouts.list(scope.caller.org_id, offset=0, limit=200, state=state)
    # As GET /v1/rollouts/{id}: a rollout is visible with viewer on every fleet it covers.
    mine = [r for r in rows if all(scope.may("viewer", Obj("fleet", f, f)) for f in r["fleet_ids"])]
    return {"rollouts": [jsonable({k: r[k] for k in ("id", "state", "reason", "fleet_ids", "config_id",
                                                     "current_batch", "created_at", "updated_at")})
                         for r in mine[:MAX_ROWS]], "total": len(mine)}


async def list_configurations(services, scope: _Scope, args: dict) -> dict:
    everything, ids, _ = scope.listing("configuration")
    search = args.get("search") if isinstance(args.get("search"), str) else None
    rows, total = await services.stores.configs.list(scope.caller.org_id, offset=0, limit=MAX_ROWS, search=search or None,
                                              status=None, sort_by="name", sort_order="asc",
                                              only=None if everything else ids)
    return {"configurations": [{k: v for k, v in config_json(r).items()
                                if k in ("id", "name", "status", "currentVersion", "deviceCount")} for r in rows],
            "total": total}


_RUN = {"list_fleets": list_fleets, "list_devices": list_devices, "get_device": get_device,
        "memory_test_status": memory_test_status, "list_rollouts": list_rollouts,
        "list_configurations": list_configurations}
assert set(_RUN) == set(TOOL_NAMES)


async def run_tool(services, caller: Caller, name: str, arguments: str) -> str:
    """The tool's answer as a JSON string (what goes back to the model as the tool message)."""
    if name not in _RUN:
        return json.dumps({"error": "tool_not_allowed", "message": f"{name} is not an allow-listed tool"})
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        args = None
    if not isinstance(args, dict):
        return json.dumps({"error": "invalid", "message": "the arguments are not a JSON object"})
    result = await _RUN[name](services, await _scope(services, caller), args)
    return json.dumps(result, separators=(",", ":"), default=str)
