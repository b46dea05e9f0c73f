"""The MCP tools: each names the REST call it makes, its arguments as a strict model, and its answer's schema.

A tool does not re-implement its endpoint: hub/mcp/inproc.py sends the REST request it describes
through the hub's own app with the caller's credential, so authorisation (hub/auth/authz.py), the
audit row, validation and the answer are the endpoint's own, and a device the caller may not view
answers 404 like a missing one. The read tools the dashboard assistant already offers
(hub/assistant/tools.py) keep its names and descriptions here, so one description serves both.

Arguments are checked before any request is made, as strictly as the REST bodies: unknown fields,
wrong types, strings past their length or holding NUL, and ids that are not UUIDs are tool errors.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from typing_extensions import Annotated

from hub.assistant.tools import TOOL_DEFINITIONS

# Small pages by default: what a model reads back must fit in its context. The API's own maximum
# still applies (the endpoint refuses more with 400, which the tool returns as its error).
DEFAULT_LIMIT = 20

Text = Annotated[str, StringConstraints(min_length=1, max_length=200)]
# strict mode refuses a UUID given as a string; ids arrive as JSON strings, so they are parsed here.
Id = Annotated[uuid.UUID, Field(strict=False)]


def _no_nul(value: Any) -> Any:
    if isinstance(value, str) and ("\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value)):
        raise ValueError("must not hold NUL or lone surrogates")
    return value


class Args(BaseModel):
    """Every tool's arguments: nothing unknown, no coercion of strings into numbers or booleans."""
    model_config = ConfigDict(extra="forbid", strict=True)
    organization_id: Id | None = Field(
        None, description="the organisation to act in; default: the X-Organization-ID the client sent")

    @field_validator("*", mode="before")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        return _no_nul(value)

    @classmethod
    def model_json_schema_for_mcp(cls) -> dict:
        schema = cls.model_json_schema()
        schema.pop("title", None)
        return schema


class Paged(Args):
    page: int = Field(1, ge=1, le=1_000_000, description="starts at 1")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=100, description=f"rows per page (default {DEFAULT_LIMIT})")


class DeviceRef(Args):
    device_id: Id = Field(description="the device's id")


class RolloutRef(Args):
    rollout_id: Id = Field(description="the rollout's id")


class DeviceList(Paged):
    fleet_id: Id | None = Field(None, description="only this fleet")
    online: bool | None = Field(None, description="only online (true) or offline (false) devices")
    search: Text | None = Field(None, description="part of the device's name, any case")
    tag: Text | None = None
    condition: Literal["MemoryFault"] | None = None
    config_status: Literal["pending", "applying", "applied", "rejected", "failed", "none"] | None = None


class ConfigList(Paged):
    search: Text | None = Field(None, description="words in the name or description")
    status: Literal["active", "archived"] | None = None


class ConfigVersions(Paged):
    config_id: Id = Field(description="the configuration's id")


class RolloutList(Paged):
    state: Literal["pending", "running", "paused", "completed", "failed", "cancelled"] | None = None


class Impact(Args):
    fleet_id: Id = Field(description="the fleet the rollout would cover")
    target_version_id: Id = Field(description="the configuration version it would deliver")
    force: bool = Field(False, description="ignore the fleet's update window")


class Results(DeviceRef):
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=100)


class AuditList(Paged):
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=200, description=f"rows per page (default {DEFAULT_LIMIT})")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] | None = None
    path_prefix: Annotated[str, StringConstraints(min_length=1, max_length=1000)] | None = None
    since: Text | None = Field(None, description="RFC 3339 instant; only events at or after it")
    until: Text | None = Field(None, description="RFC 3339 instant; only events at or before it")


class StartTest(DeviceRef):
    impact: Literal["running", "stopped"] | None = Field(
        None, description="running: Live (the workload keeps running); stopped: Full online")
    placement: Literal["online", "offline"] | None = Field(
        None, description="offline is a test boot: refused here (403 operator_required)")
    quick: bool | None = Field(None, description="the Quick preset; Live only")
    passes: int | None = Field(None, ge=1, le=20)
    timeBudgetSeconds: int | None = Field(None, ge=60, le=43200)
    maxBytes: int | None = Field(None, ge=4096, le=1 << 50)


class CancelTest(DeviceRef):
    runId: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args: type[Args]
    method: str
    path: str  # with {placeholders} filled from the arguments of the same name
    permission: str  # what the caller needs, as docs/mcp.md lists it
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True
    paged: bool = False
    query: dict[str, str] = field(default_factory=dict)  # argument -> query parameter
    body: tuple[str, ...] = ()  # arguments sent as the JSON body
    follows: str | None = None  # the long work it starts, followed when asked for progress (hub/mcp/follow.py)

    def request(self, args: Args) -> tuple[str, str, dict[str, str], dict | None]:
        """(method, path, query, body) of the REST call these arguments make."""
        values = args.model_dump(exclude_none=True)
        path = self.path.format(**{k: str(v) for k, v in values.items()})
        query = {param: _query_value(values[arg]) for arg, param in self.query.items() if arg in values}
        body = None
        if self.body or self.method == "POST":
            body = {k: _json_value(values[k]) for k in self.body if k in values}
        return self.method, path, query, body

    def output_schema(self) -> dict:
        data: dict = {"type": "array", "items": {"type": "object"}} if self.paged else {"type": "object"}
        props: dict = {"data": data}
        if self.paged:
            props["pagination"] = {"type": "object", "properties": {
                k: {"type": "integer"} for k in ("page", "limit", "total", "totalPages")}}
        return {"type": "object", "properties": props, "required": ["data"]}


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _json_value(value: Any) -> Any:
    return str(value) if isinstance(value, uuid.UUID) else value


_ASSISTANT = {t["function"]["name"]: t["function"]["description"] for t in TOOL_DEFINITIONS}
_PAGE = {"page": "page", "limit": "limit"}

TOOLS: tuple[Tool, ...] = (
    Tool("list_fleets", _ASSISTANT["list_fleets"], Paged, "GET", "/v1/fleets", "viewer on the fleet",
         paged=True, query=_PAGE),
    Tool("list_devices", "The devices the caller may view, a page at a time, with the REST list's filters.",
         DeviceList, "GET", "/v1/devices", "viewer on the device or its fleet", paged=True,
         query={**_PAGE, "fleet_id": "fleet_id", "online": "online", "search": "search", "tag": "tag",
                "condition": "condition", "config_status": "config_status"}),
    Tool("get_device", _ASSISTANT["get_device"], DeviceRef, "GET", "/v1/devices/{device_id}",
         "viewer on the device"),
    Tool("get_device_diagnosis", "Why a device is in the state it is: its link, takeovers, protocol errors, "
         "configuration and memory findings.", DeviceRef, "GET", "/v1/devices/{device_id}/diagnosis",
         "viewer on the device"),
    Tool("list_configurations", _ASSISTANT["list_configurations"], ConfigList, "GET", "/v1/configurations",
         "viewer on the configuration", paged=True, query={**_PAGE, "search": "search", "status": "status"}),
    Tool("list_configuration_versions", "A configuration's versions, newest first.", ConfigVersions, "GET",
         "/v1/configurations/{config_id}/versions", "viewer on the configuration", paged=True, query=_PAGE),
    Tool("list_rollouts", _ASSISTANT["list_rollouts"], RolloutList, "GET", "/v1/rollouts",
         "viewer on every fleet the rollout covers", paged=True, query={**_PAGE, "state": "state"}),
    Tool("get_rollout", "One rollout with its steps (batches) and each device's progress.", RolloutRef, "GET",
         "/v1/rollouts/{rollout_id}", "viewer on every fleet it covers"),
    Tool("rollout_impact", "What a rollout of a version to a fleet would do now: eligible devices, the update "
         "window, pending actions. Changes nothing.", Impact, "POST", "/v1/rollouts/impact",
         "editor on the fleet", body=("fleet_id", "target_version_id", "force")),
    Tool("memory_test_status", _ASSISTANT["memory_test_status"] + " Includes its health and progress.",
         DeviceRef, "GET", "/v1/devices/{device_id}/memory-test", "viewer on the device"),
    Tool("memory_test_results", "A device's stored memory-test results, newest first.", Results, "GET",
         "/v1/devices/{device_id}/memory-test/results", "viewer on the device", query={"limit": "limit"}),
    Tool("list_audit_events", "The organisation's audit log, newest first.", AuditList, "GET",
         "/v1/audit-events", "audit_viewer on the organisation (and the audit_log feature)", paged=True,
         query={**_PAGE, "method": "method", "path_prefix": "pathPrefix", "since": "from", "until": "to"}),
    Tool("ping_device", "A live round trip to the device; no side effect on it.", DeviceRef, "POST",
         "/v1/devices/{device_id}/ping", "viewer on the device", read_only=False),
    Tool("reboot_device", "Reboot the device now.", DeviceRef, "POST", "/v1/devices/{device_id}/reboot",
         "editor on the device", read_only=False, destructive=True, idempotent=False),
    Tool("start_memory_test", "Start a Live (impact running) or Full online (impact stopped) memory test. "
         "Returns at once with the run's id: poll memory_test_status for progress and the result. With a "
         "progressToken it reports progress and returns when the run ends (at most 10 minutes). A test boot "
         "(placement offline) is refused: only a person in the dashboard or at the device may start one.",
         StartTest, "POST", "/v1/devices/{device_id}/memory-test", "editor on the device", read_only=False,
         idempotent=False, body=("impact", "placement", "quick", "passes", "timeBudgetSeconds", "maxBytes"),
         follows="memory_test"),
    Tool("cancel_memory_test", "Cancel the device's running memory test (or the run named).", CancelTest, "POST",
         "/v1/devices/{device_id}/memory-test/cancel", "editor on the device", read_only=False, body=("runId",)),
    Tool("pause_rollout", "Pause a pending or running rollout; devices already updated keep their version.",
         RolloutRef, "POST", "/v1/rollouts/{rollout_id}/pause", "editor on every fleet it covers",
         read_only=False),
    Tool("resume_rollout", "Resume a paused rollout. With a progressToken it reports the devices' progress and "
         "returns when the rollout ends or is paused again (at most 10 minutes).", RolloutRef, "POST",
         "/v1/rollouts/{rollout_id}/resume", "editor on every fleet it covers", read_only=False, follows="rollout"),
    Tool("cancel_rollout", "Cancel a rollout for good; devices not yet updated are left as they are.", RolloutRef,
         "POST", "/v1/rollouts/{rollout_id}/cancel", "editor on every fleet it covers", read_only=False,
         destructive=True),
)
BY_NAME: dict[str, Tool] = {t.name: t for t in TOOLS}
