"""Memory tests of one device (spec: Endpoints → Memory test): start, cancel, status, results.

Starting and cancelling need the permission to reboot the device (editor); reading needs viewer.
A test boot (placement offline) may only be started by a signed-in person in the dashboard: any
other credential is refused with 403 operator_required. Errors on these paths have the spec's bare
body ``{error, message, status?}`` (hub/app.py picks it by path; ``status`` carries the running test
of a 409 busy). The live work — one test at a time, the 5-second start rate, the device's answers —
is the DeviceActor's (actors/device_memtests.py); this module validates, authorises, audits and shapes.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema
from quart import Blueprint, g, request
from quart_schema import document_querystring, document_request, document_response

from actors.errors import AskError
from actors.machines import memtest_plan
from actors.machines.memtest import progress
from device_client.shared.memtest_members import MemtestHealth, MemtestInterrupted, MemtestResult, MemtestStatus
from device_client.shared.protocol import memtest_result, memtest_status
from actors.device_memtests import CancelTest, ReadStatus, StartTest
from hub.api.common import jsonable, org, parse_uuid, principal, services
from hub.api.devices import device_obj
from hub.api.validation import MalformedJSON, strict_loads
from hub.auth.authz import authorize
from hub.cluster.asks import ask_device
from hub.errors import BadRequest, Forbidden, NotFound, Unauthenticated
from hub.api.validation import optional_body
from hub.tunnels.auth import also_tunnel_token

bp = Blueprint("memtests", __name__, url_prefix="/v1/devices")

HISTORY = 10
RESULTS_DEFAULT, RESULTS_MAX = 20, 100


# -- documentation models (quart-schema renders them into /v1/openapi.json) -------------------------
class StartRequest(BaseModel):
    """Omitted fields take the mode's default (mode: impact and placement, and quick for Live)."""
    model_config = ConfigDict(extra="forbid")
    impact: Literal["running", "stopped"] | None = Field(None, description="default running")
    placement: Literal["online", "offline"] | None = Field(
        None, description="offline: a test boot; needs impact stopped and a signed-in dashboard session")
    quick: bool | None = Field(None, description="the Quick preset; Live only")
    passes: int | None = Field(None, ge=1, le=20, description="default 1 for Live, 2 for stopped modes")
    kernelPasses: int | None = Field(None, ge=1, le=17, description="test boot only; default 4")
    bitFade: bool | None = Field(None, description="idle-decay check; default on for stopped modes")
    holdOnFailure: bool | None = Field(None, description="test boot only")
    timeBudgetSeconds: int | None = Field(None, ge=60, le=43200, description="default 7200")
    maxBytes: int | None = Field(None, ge=memtest_plan.PAGE_SIZE, description="optional cap on memory tested")


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    runId: str | None = Field(None, min_length=1, max_length=200)


class ResultsQuery(BaseModel):
    limit: int = Field(RESULTS_DEFAULT, ge=1, le=RESULTS_MAX)


class ServedResult(MemtestResult):
    """A result as the API serves it (``served``): the device's members, with ``source`` set by the hub."""
    source: Literal["live", "stored"] = Field(description="live: the device answered with it; stored: the hub read "
                                                          "it from its own storage")
    # absent rather than null on a run that was not interrupted (memtest_result drops it)
    interrupted: MemtestInterrupted | SkipJsonSchema[None] = Field(
        None, description="present only on an interrupted run: where it was when the device reset")


class ServedHealth(MemtestHealth):
    lastResult: ServedResult | None = Field(None, description="the newest result, in full when the hub stored it")


class Run(BaseModel):
    deviceId: str
    runId: str | None
    status: MemtestStatus = Field(description="the run's current state")


class RunEnvelope(BaseModel):
    data: Run


class TestStatus(BaseModel):
    source: Literal["live", "stored"]
    supported: bool | None
    status: MemtestStatus | None = Field(description="the current or last run; null when the hub knows none")
    health: ServedHealth | None
    history: list[ServedResult] = Field(description="the newest results first, at most 10")
    healthReportedAt: str | None = None
    progress: float | None = Field(None, description="the share of the run's planned work done, 0–1 (coverage is "
                                                     "the share of memory touched at least once): testedBytes / "
                                                     "(testedBytes + etaSeconds × rateBps)")


class TestStatusEnvelope(BaseModel):
    data: TestStatus


class Results(BaseModel):
    results: list[ServedResult] = Field(description="the newest first")


class ResultsEnvelope(BaseModel):
    data: Results


class MemtestErrorBody(BaseModel):
    """The memory-test endpoints' bare error body."""
    error: str
    message: str
    status: MemtestStatus | None = Field(None, description="409 busy: the running test's status")


def _errors(*statuses: int):
    def decorator(func):
        for status in statuses:
            func = document_response(MemtestErrorBody, status)(func)
        return func
    return decorator


# -- parsing ------------------------------------------------------------------------------------------
def invalid(message: str) -> BadRequest:
    return BadRequest(message, code="invalid")


async def _json_object() -> dict[str, Any]:
    """The body as a JSON object; an empty body is an empty object (every field is optional)."""
    raw = await request.get_data(as_text=False)
    if not raw.strip():
        return {}
    try:
        data = strict_loads(raw)  # NaN, Infinity and deep nesting are not JSON either
    except MalformedJSON as exc:
        raise invalid(f"body: {exc}") from None
    if not isinstance(data, dict):
        raise invalid("body: must be a JSON object")
    return data


async def _device(device_id: str, relation: str) -> dict:
    s = services()
    # A malformed id is the caller's 400 bad_uuid, as on every other path (hub/api/common.parse_uuid).
    row = await s.stores.devices.get(org().org_id, parse_uuid(device_id, "device id"))
    if row is None:
        raise NotFound("device not found")
    await authorize(s, relation, device_obj(row))
    return row


def _ask_timeout() -> float:
    t = services().settings.command_timeout
    return t * 5 + 5  # a start's own timeout, a status read after a busy refusal, and slack


# -- endpoints ------------------------------------------------------------------------------------------
@bp.post("/<id>/memory-test")
@optional_body
@also_tunnel_token
@document_request(StartRequest)
@document_response(RunEnvelope, 202)
@_errors(400, 401, 403, 404, 409, 422, 429, 502, 503, 504)
async def start_memory_test(id: str):  # noqa: A002 — the spec's path parameter name
    device_id = id
    s = services()
    raw = await _json_object()
    try:
        plan = memtest_plan.plan_for(raw)
    except memtest_plan.PlanInvalid as exc:
        raise invalid(str(exc)) from None
    run_id = str(uuid.uuid4())
    # Every start is in the audit log with its plan, refused ones too (the row carries the status).
    g.audit_details = {"operation": "memory_test.start", "deviceId": device_id, "runId": run_id, "plan": plan}
    row = await _device(device_id, "editor")
    if plan["mode"] == "test_boot" and principal().credential_kind != "session":
        raise Forbidden("a test boot may only be started by a signed-in person in the dashboard or at the "
                        "device console; API tokens, CLI tokens and service accounts cannot",
                        code="operator_required")
    if principal().credential_kind == "tunnel_token":
        # Recognised only so a test boot can be refused as the spec says; it opens nothing else.
        raise Unauthenticated("a tunnel token is accepted by the tunnel session endpoints only")
    answer = await ask_device(s, row["id"], StartTest(run_id, plan), timeout=_ask_timeout())
    return {"data": jsonable({"deviceId": str(row["id"]), "runId": answer["runId"] or run_id,
                              "status": answer["status"]})}, 202


@bp.post("/<id>/memory-test/cancel")
@optional_body
@document_request(CancelRequest)
@document_response(RunEnvelope, 202)
@_errors(400, 401, 403, 404, 409, 502, 503, 504)
async def cancel_memory_test(id: str):  # noqa: A002 — the spec's path parameter name
    device_id = id
    s = services()
    raw = await _json_object()
    unknown = sorted(set(raw) - {"runId"})
    if unknown:
        raise invalid(f"{unknown[0]}: unknown field")
    run_id = raw.get("runId")
    if run_id is not None and (not isinstance(run_id, str) or not 1 <= len(run_id) <= 200):
        raise invalid("runId: must be a non-empty string of at most 200 characters")
    g.audit_details = {"operation": "memory_test.cancel", "deviceId": device_id, "runId": run_id, "plan": None}
    row = await _device(device_id, "editor")
    actor = s.registry.lookup(("device", row["id"]))
    known = (actor.memtests.machine.running if actor is not None else None) or {}  # a snapshot read
    g.audit_details = {**g.audit_details, "runId": run_id or known.get("runId"), "plan": known.get("plan")}
    answer = await ask_device(s, row["id"], CancelTest(run_id), timeout=_ask_timeout())
    status = answer["status"]
    g.audit_details = {**g.audit_details, "runId": status.get("runId") or g.audit_details["runId"],
                       "plan": status.get("plan") or g.audit_details["plan"]}
    return {"data": jsonable({"deviceId": str(row["id"]), "runId": g.audit_details["runId"],
                              "status": status})}, 202


@bp.get("/<id>/memory-test")
@document_response(TestStatusEnvelope)
@_errors(400, 401, 403, 404)
async def memory_test_status(id: str):  # noqa: A002 — the spec's path parameter name
    device_id = id
    """Live when the device answers; else what the hub stored (source stored, healthReportedAt)."""
    s = services()
    row = await _device(device_id, "viewer")
    # No actor runs for a device not heard from lately: then it is offline and the read is stored.
    actor = s.registry.lookup(("device", row["id"]))
    online = actor is not None and actor.machine is not None and actor.machine.online
    facts = (actor.facts if actor is not None else None) or row.get("facts") or {}  # the last hello's
    caps = (facts.get("capabilities") or {}).get("memoryTest") or {}
    live: dict[str, Any] | None = None
    supported: bool | None = bool(caps.get("online") or caps.get("offline")) if caps else None
    # In a cluster the device may be linked to another node: its actor there answers (hub/cluster/asks.py).
    elsewhere = None if online else await s.topology.holder(row["id"])
    if online or elsewhere is not None:
        try:
            live = await ask_device(s, row["id"], ReadStatus(), timeout=s.settings.command_timeout + 5,
                                    node=elsewhere)
        except AskError as exc:
            # Firmware without memory tests answers live (supported false); a device that is gone,
            # silent or failing is read from what the hub stored.
            live = {"supported": False} if exc.code == "unsupported" else None
    stored = await s.stores.memtests.stored(org().org_id, row["id"], HISTORY)
    if live is not None:
        history = live.get("history") if isinstance(live.get("history"), list) else stored["history"]
        data = {"source": "live", "supported": bool(live.get("supported", True)),
                "status": memtest_status(live.get("status") if "status" in live else stored["status"]),
                "health": _health_in_full(live.get("health") or stored["health"] or {"capabilities": caps},
                                          stored["history"], "live"),
                "history": [_in_full(r, stored["history"], "live") for r in history[:HISTORY]]}
    else:
        data = {"source": "stored", "supported": supported, "status": stored["status"],
                "health": _health_in_full(stored["health"] or {"capabilities": caps}, stored["history"], "stored"),
                "history": [served(r, "stored") for r in stored["history"]],
                "healthReportedAt": stored["healthReportedAt"]}
    data["progress"] = progress(data["status"])  # the share of the planned work done (actors/machines/memtest.py)
    return {"data": jsonable(data)}


def served(result: Any, source: str) -> Any:
    """A result as the API gives it: the spec's members (memtest_result) and ``source``, live when the
    device answered with it, stored when the hub read it from its own storage."""
    result = memtest_result(result)
    return {**result, "source": source} if isinstance(result, dict) else result


def _in_full(result: Any, stored: list[dict], source: str) -> Any:
    """A device sends results ``brief`` in a status reply (a frame could not hold eleven in full):
    the stored result with that runId in its place, when the hub has it."""
    if isinstance(result, dict) and result.get("brief"):
        kept = next((r for r in stored if r.get("runId") == result.get("runId")), None)
        if kept is not None:
            return served(kept, "stored")
    return served(result, source)


def _health_in_full(health: dict, stored: list[dict], source: str) -> dict:
    last = health.get("lastResult")
    return {**health, "lastResult": _in_full(last, stored, source)} if isinstance(last, dict) else health


@bp.get("/<id>/memory-test/results")
@document_querystring(ResultsQuery)
@document_response(ResultsEnvelope)
@_errors(400, 401, 403, 404)
async def memory_test_results(id: str):  # noqa: A002 — the spec's path parameter name
    device_id = id
    s = services()
    unknown = sorted(set(request.args) - {"limit"})
    if unknown:
        raise invalid(f"{unknown[0]}: unknown query parameter")
    raw = request.args.get("limit")
    limit = RESULTS_DEFAULT
    if raw is not None:
        try:
            limit = int(raw)
        except ValueError:
            raise invalid("limit: must be an integer") from None
        if not 1 <= limit <= RESULTS_MAX:
            raise invalid(f"limit: must be between 1 and {RESULTS_MAX}")
    row = await _device(device_id, "viewer")
    return {"data": {"results": [served(r, "stored") for r in await s.stores.memtests.results(org().org_id, row["id"], limit)]}}
