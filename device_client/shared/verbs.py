"""The device link's verbs and events as models: what each command carries, what its reply holds,
which errors it may answer, and what each event's payload is.

protocol.py models the frames (hello, welcome, command, reply, event); this module models what goes
*inside* a command's ``payload``, a reply's ``payload`` and an event's ``payload``, verb by verb. It
is the single source of docs/device-protocol.md's verb and event tables and of the JSON Schema the
hub serves (``GET /v1/device/protocol.json``, device_client/shared/protocol_schema.py): a test renders
them again from here and fails when the document differs, and the qualification kit
(device_client/qualify/) checks a device's replies against these same models.

The hub is strict about the results that move a state (``files.put``, ``files.delete``,
``config.apply``, events ``files.result`` and ``config.result``) and about what a memory test reports
(the memtest replies and events, whose members are memtest_members.py's): it validates them with
``check`` and treats a malformed one as a protocol error. Other replies are read leniently: a model here
documents them and the kit checks them, and extra members are always allowed (a newer device may
say more than an older hub reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .systemfacts import SystemFacts  # noqa: F401  (a nested model: the doc's tables find it by name)
from .memtest_members import (  # noqa: F401  (nested models: the doc's tables find them here by name)
    MemtestEdac,
    MemtestError,
    MemtestHealth,
    MemtestInterrupted,
    MemtestKernel,
    MemtestPage,
    MemtestPlan,
    MemtestResult,
    MemtestStatus,
)


class Body(BaseModel):
    """A payload: extra members are allowed (forward compatible) and kept."""
    model_config = ConfigDict(extra="allow")


class Empty(Body):
    """No members."""


# ---- secret files ---------------------------------------------------------------------------------

class SecretFile(Body):
    fileId: str = Field(description="the hub's id of the file")
    path: str = Field(description="where the file goes: an absolute, canonical path the device checks against "
                                  "the allowed paths (Secret files and configurations); a failing path is answered "
                                  "failed")
    mode: int = Field(0o600, description="POSIX mode as an integer, e.g. 384 for 0o600")
    uid: int = Field(0, description="owner uid")
    gid: int = Field(0, description="owner gid")
    contentB64: str = Field(description="the contents, base64 (at most 64 KiB decoded)")
    sha256: str = Field(description="hex SHA-256 of the decoded contents")
    source: Literal["device", "configuration"] = "device"
    configId: str | None = Field(None, description="the configuration the file belongs to (source configuration)")


FileStatus = Literal["on_device", "failed", "removed", "overridden"]


class FileResult(Body):
    fileId: str | None = Field(None, description="the file's id, when the command named one")
    path: str
    status: FileStatus = Field(description="on_device (written, digest matches), failed (see error), removed, "
                                           "overridden (a device file holds the path)")
    sha256: str | None = Field(None, description="digest of what is on disk (on_device)")
    error: str | None = Field(None, description="why it failed, in words (failed)")


class FilesPut(Body):
    files: list[SecretFile]


class FilesDelete(Body):
    paths: list[str]


class FileResults(Body):
    results: list[FileResult] = Field(description="one per file or path of the command, in order")


class FilesWiped(Body):
    removed: list[str] = Field(description="paths removed")
    failed: list[FileResult] | None = Field(None, description="files that could not be removed")


# ---- configurations -------------------------------------------------------------------------------

#: checkOutput and workloadLog: the agent's bound (device_client/logtail.py MAX_CHARS), which the hub holds it to
OUTPUT_TAIL_CHARS = 2048


class RegistryLogin(Body):
    username: str = Field(max_length=256)
    password: str = Field(max_length=4096)

    def __repr__(self) -> str:
        return f"RegistryLogin(username={self.username!r}, password=<hidden>)"


class ConfigApply(Body):
    configId: str
    versionId: str
    version: int | None = Field(None, description="the version's number")
    spec: dict[str, Any] = Field(description="the configuration's spec (workload, healthCheck, ...)")
    files: list[SecretFile] = Field(default_factory=list, description="the configuration's files for this device")
    registryAuth: dict[str, RegistryLogin] = Field(
        default_factory=dict, description="registry (host[:port]) -> the organisation's credential for it: only "
                                          "the registries of the version's images; write-only (kept in a 0600 file "
                                          "for the engine's pulls, never logged or returned). Present on a re-send of "
                                          "the version the device runs (after a login changed on the hub), it "
                                          "replaces the device's logins, {} removing them")
    registryProxy: Literal["off", "fallback", "always"] | None = Field(
        None, description="the fleet's registry proxy mode for this version's pulls: off (the fleet's proxy is "
                          "off), fallback (the registry, then the hub) or always (the hub only, never the "
                          "registry itself); absent: the agent's --registry-proxy alone. Also on a re-send of "
                          "the version the device runs (the fleet's proxy changed): kept with it for the pulls "
                          "of a restart")


class ConfigApplyResult(Body):
    status: Literal["applied", "rejected"]
    configId: str
    versionId: str
    error: str | None = Field(None, description="why it was rejected (rejected)")
    rolledBackTo: str | None = Field(None, description="the versionId the device runs again, or null (rejected)")
    files: list[FileResult] = Field(default_factory=list, description="the configuration's files (applied)")
    checkOutput: str | None = Field(None, max_length=OUTPUT_TAIL_CHARS,
                                    description="the end of what the failing health check printed (rejected): its "
                                                "last 20 lines within its last 2 KiB, undecodable bytes as U+FFFD, "
                                                "control characters other than newline and tab escaped (\\x1b)")
    workloadLog: str | None = Field(None, max_length=OUTPUT_TAIL_CHARS,
                                    description="the workload log's last lines when the version was rejected, "
                                                "bounded and escaped as checkOutput")


# ---- the device and the link ----------------------------------------------------------------------

class Pong(Body):
    pong: Literal[True]
    deviceClock: str = Field(description="the device's clock, RFC 3339")


class RebootRequest(Body):
    reason: str | None = Field(None, pattern=r"^[a-z][a-z0-9_]{0,31}$",
                               description="the boot reason the next hello reports (default reboot)")


class Rebooting(Body):
    rebooting: Literal[True]


class Drain(Body):
    reconnectAfter: float = Field(5.0, ge=0, le=600, description="seconds, 0 to 600: close the link (1001) after the "
                                  "replies in flight, then reconnect at a random moment within this many seconds")
    url: str | None = Field(None, description="the base address of the hub to reconnect to, http(s)://host[:port] "
                                              "(the link URL is derived from it); absent or null: this hub")


class Draining(Body):
    draining: Literal[True]
    reconnectAfter: float | None = Field(None, description="the seconds the device will reconnect within (the "
                                                           "command's value, or 5 when it gave none)")


class Keys(Body):
    hubKeys: dict[str, str] = Field(description="key id (kid, free text) -> the raw 32-byte Ed25519 public key in "
                                                "standard base64 with padding; the whole set replaces welcome.hubKeys")


class KeyIds(Body):
    kids: list[str] = Field(description="the key ids the device now holds")


class Notice(Body):
    code: str = Field(description="malformed_result")
    message: str = Field(description="what was refused and why, naming the field")


class TelemetrySet(Body):
    enabled: bool


class TelemetryState(Body):
    enabled: bool


class TelemetrySample(Body):
    sentAt: str | None = Field(None, description="the device's clock, RFC 3339")
    uptime: float | None = Field(None, description="seconds since the agent started")
    system: SystemFacts | None = Field(None, description="read like hello.system: the hub keeps the newest")


# ---- memory tests ---------------------------------------------------------------------------------

# Status, Health, Result and Plan: device_client/shared/memtest_members.py

class MemtestStart(Body):
    runId: str
    plan: MemtestPlan = Field(description="every member with its mode default applied")


class MemtestCancel(Body):
    runId: str | None = None


class MemtestStatusReply(Body):
    status: MemtestStatus | None = Field(description="the run's status now (the ended one after a cancel)")


class MemtestStatusFull(Body):
    supported: bool = Field(description="false: the firmware has no memory test")
    status: MemtestStatus | None = Field(description="the current or last run; phase idle when no test ever ran")
    health: MemtestHealth
    history: list[MemtestResult] = Field(description="up to 10 recent results, newest first, brief")


class MemtestAck(Body):
    runIds: list[str]


# ---- tunnels --------------------------------------------------------------------------------------

class Sdp(Body):
    sdp: str
    type: str


class TunnelOpen(Body):
    grant: str = Field(description="a JWT (EdDSA) signed with the welcome.hubKeys key its header kid names, aud fleethub:tunnel-grant")
    offer: Sdp
    iceServers: list[dict[str, Any]] = Field(default_factory=list)


class TunnelAnswer(Body):
    answer: Sdp


class TunnelClose(Body):
    sessionId: str
    reason: str | None = None


class TunnelClosed(Body):
    closed: bool


class IceRestart(Body):
    sessionId: str
    offer: Sdp


# ---- events ---------------------------------------------------------------------------------------

class HeartbeatEvent(Body):
    deviceClock: str | None = Field(None, description="RFC 3339")
    uptime: float | None = Field(None, description="seconds since the agent's boot")


class WorkloadHealth(Body):
    healthy: bool
    detail: str = ""


class MemtestResultEvent(Body):
    result: MemtestResult = Field(description="sent until memtest.ack")


class MemtestHealthEvent(Body):
    health: MemtestHealth


class TunnelUsage(Body):
    sessionId: str
    bytesIn: int
    bytesOut: int
    relayedBytes: int
    durationSeconds: float
    final: bool
    reason: str | None = None


class ContainerPulled(Body):
    container: str = Field(description="the container's name in the version")
    image: str = Field(description="the image, pinned by digest")
    bytes: int = Field(ge=0, description="the image's size as the engine holds it")
    seconds: float = Field(ge=0, description="how long the pull took (0 when the image was there)")
    via: str | None = Field(None, description="registry: from the image's registry; proxy: through the hub's "
                                              "registry proxy (docs/containers.md)")


class ContainerPullProgress(Body):
    container: str = Field(description="the container's name in the version")
    image: str = Field(description="the image, pinned by digest")
    bytes: int = Field(ge=0, description="bytes received so far (podman: the blobs in its download directory)")
    seconds: float = Field(ge=0, description="since the pull began")
    rateBps: int = Field(ge=0, description="bytes / seconds")


class Refusal(Body):
    """A frame the device did not get across because it was over the limit."""
    frame: str = Field(description="what the frame was: hello, reply, event <kind> (frame when unknown)")
    bytes: int = Field(description="its size in UTF-8 bytes (0 when unknown)")
    limit: int = Field(description="the frame limit in force (welcome.maxFrameBytes)")
    by: Literal["agent", "hub"] = Field(description="agent: the device saw it was too big and did not send it; "
                                                    "hub: the hub closed the link with 1009 for it")
    action: str = Field(description="what the device did with it: trimmed (sent smaller), dropped, or unknown")
    reason: str = Field(description="the reason in words (the hub's 1009 close reason when by is hub), at most "
                                    "200 characters")
    at: str = Field(description="when, RFC 3339 (the device's clock)")


class LinkRefused(Body):
    refusals: list[Refusal]


# ---- the tables -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verb:
    name: str
    summary: str
    payload: type[BaseModel]
    reply: type[BaseModel]
    errors: tuple[str, ...] = ()
    optional: bool = False  # a device may answer unknown_command (it lacks the feature)
    strict: bool = False  # the hub validates the reply: a malformed one is a protocol error


COMMON_ERRORS = ("unknown_command", "wrong_device", "invalid_payload", "internal")

VERBS: dict[str, Verb] = {v.name: v for v in (
    Verb("ping", "a live round trip, no side effect", Empty, Pong),
    Verb("reboot", "restart; the next hello says bootReason (the payload's reason, default reboot)",
         RebootRequest, Rebooting),
    Verb("files.put", "write each secret file atomically; one result per file (one failing file does not "
         "fail the others)", FilesPut, FileResults, strict=True),
    Verb("files.delete", "remove files the hub put there; a path it does not manage is reported removed",
         FilesDelete, FileResults, strict=True),
    Verb("files.wipe", "remove every file the hub put there (unpair, factory reset)", Empty, FilesWiped),
    Verb("config.apply", "write the version, restart the workload, verify its health, then write the files; "
         "roll back on failure", ConfigApply, ConfigApplyResult, errors=("busy",), strict=True),
    Verb("link.drain", "the hub is stopping: close the link (1001) after the replies in flight, reconnect "
         "within reconnectAfter seconds (to url when given)", Drain, Draining),
    Verb("link.keys", "the hub rotated its signing key: these replace welcome.hubKeys", Keys, KeyIds),
    Verb("link.notice", "the hub refused something the device sent (a malformed result): log it", Notice, Empty,
         optional=True),
    Verb("telemetry.set", "switch telemetry events on or off; persisted", TelemetrySet, TelemetryState,
         optional=True),
    Verb("memtest.start", "start a memory test (docs/memtests.md)", MemtestStart, MemtestStatusReply,
         errors=("busy", "unsupported", "workload_stop_failed", "invalid"), optional=True, strict=True),
    Verb("memtest.cancel", "cancel the running test", MemtestCancel, MemtestStatusReply,
         errors=("not_running",), optional=True, strict=True),
    Verb("memtest.status", "the tester's status, health and brief history", Empty, MemtestStatusFull,
         optional=True, strict=True),
    Verb("memtest.ack", "the hub stored these results: stop sending them", MemtestAck, Empty,
         errors=("invalid",), optional=True),
    Verb("tunnel.open", "answer a tunnel offer after checking the grant", TunnelOpen, TunnelAnswer,
         errors=("target_not_configured", "ssh_disabled", "shell_disabled", "device_unsupported", "invalid_grant",
                 "rejected"),
         optional=True),
    Verb("tunnel.close", "close a tunnel session", TunnelClose, TunnelClosed, optional=True),
    Verb("tunnel.ice_restart", "restart ICE of an open session", IceRestart, TunnelAnswer,
         errors=("device_unsupported", "rejected"), optional=True),
)}


@dataclass(frozen=True)
class EventKind:
    kind: str
    summary: str
    payload: type[BaseModel]
    strict: bool = False


EVENTS: dict[str, EventKind] = {e.kind: e for e in (
    EventKind("heartbeat", "every welcome.heartbeatInterval seconds", HeartbeatEvent),
    EventKind("files.result", "work the device did on its own (drift corrected or found at boot)", FileResults,
              strict=True),
    EventKind("config.result", "the outcome of a config.apply (also its reply), or of an apply a power loss "
              "interrupted", ConfigApplyResult, strict=True),
    EventKind("workload.health", "the workload's health changed", WorkloadHealth),
    EventKind("memtest.progress", "a running memory test's Status (at most about one a second)", MemtestStatus,
              strict=True),
    EventKind("memtest.result", "a finished run's Result, again at every link until memtest.ack", MemtestResultEvent,
              strict=True),
    EventKind("memtest.health", "the tester's Health, at every link", MemtestHealthEvent, strict=True),
    EventKind("tunnel.usage", "totals of a tunnel session every 30 s and at its close", TunnelUsage),
    EventKind("telemetry", "a sample while telemetry is on", TelemetrySample),
    EventKind("container.pull_progress", "an image is arriving: about one a second while it is pulled "
              "(docs/containers.md)", ContainerPullProgress),
    EventKind("container.pulled", "an image of a container version is on the device (docs/containers.md)",
              ContainerPulled),
    EventKind("link.refused", "frames refused as too big since the last link", LinkRefused),
)}


@dataclass(frozen=True)
class Malformed(Exception):
    """A reply or event payload that does not match its model; ``where`` names the field."""
    what: str  # "reply to config.apply", "event files.result"
    where: str  # "results.0.status"
    problem: str  # "Field required"
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.what}: {self.where}: {self.problem}" if self.where else f"{self.what}: {self.problem}"


def _check(model: type[BaseModel], payload: Any, what: str) -> BaseModel:
    try:
        return model.model_validate(payload if payload is not None else {})
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        raise Malformed(what, ".".join(str(p) for p in first["loc"]), first["msg"]) from None


def check_reply(verb: str, payload: Any) -> BaseModel:
    """The reply payload of ``verb`` as its model; Malformed naming the field otherwise."""
    return _check(VERBS[verb].reply, payload, f"reply to {verb}")


def check_payload(verb: str, payload: Any) -> BaseModel:
    return _check(VERBS[verb].payload, payload, f"command {verb}")


def check_member(model: type[BaseModel], value: Any, what: str) -> BaseModel:
    """A member of a frame (say the hello's lastMemoryTest) as ``model``; Malformed naming the field."""
    return _check(model, value, what)


def check_event(kind: str, payload: Any) -> BaseModel:
    """An event's payload as its model (a kind not listed here is any object)."""
    model = EVENTS[kind].payload if kind in EVENTS else Body
    return _check(model, payload, f"event {kind}")
