"""The device link's wire format: JSON text frames over one WebSocket per device.

The hub imports these models; the device client never imports the hub. Every frame is an object
with a ``type``:

    device → hub   hello    first frame after the handshake: the device's facts
    hub → device   welcome  the hub accepted the hello (device id, heartbeat interval)
    hub → device   command  {id, subject, payload}: run the verb named by subject cmd.<device_id>.<verb>
    device → hub   reply    {id, ok, payload | error}: the answer to one command
    device → hub   event    {kind, payload}: heartbeat, config applied/rejected, secret file written, ...

Commands are idempotent by id: a device that sees the same id twice answers with the first reply.

Command verbs and their payloads (hub → device; the reply payload after the arrow):

    ping            {}                                  → {pong, deviceClock}
    reboot          {reason?}                           → {rebooting: true}
    files.put       {files: [SecretFilePayload]}        → {results: [FileResult]}
    files.delete    {paths: [str]}                      → {results: [FileResult]}
    files.wipe      {}                                  → {removed: [str]}   (unpair / factory reset)
    config.apply    ConfigApplyPayload                  → ConfigApplyResult
    link.drain      {reconnectAfter (s), url?}          → {draining: true}  (the hub is stopping: close
                                                          the link, reconnect within reconnectAfter
                                                          seconds, to url when given)
    link.keys       {hubKeys: {kid: base64 key}}        → {kids: [str]}  (the hub rotated its signing
                                                          key: these replace welcome.hubKeys)

SecretFilePayload: {fileId, path, mode (int, e.g. 0o600), uid, gid, contentB64, sha256, source
("device" | "configuration"), configId?}. FileResult: {fileId?, path, status ("on_device" |
"failed" | "removed"), sha256?, error?}. The agent writes each file atomically, skips the write when
the sha256 on disk already matches (correcting mode and ownership drift in place), and reports each
file on its own: one failing file does not fail the others.

ConfigApplyPayload: {configId, versionId, version (int), spec (object), files: [SecretFilePayload]}.
ConfigApplyResult: {status ("applied" | "rejected"), configId, versionId, error?, rolledBackTo?
(versionId or null), files: [FileResult]}. The agent writes the version into its data dir, restarts
the workload, verifies health within the spec's deadline, and only then writes the configuration's
files; on failure it restores the previous version (and workload) and writes none of the new files.

Events (device → hub) beyond heartbeat: ``files.result`` {results: [FileResult]} for work the device
did on its own (drift corrected at boot), ``config.result`` ConfigApplyResult, ``workload.health``
{healthy, detail}.

Memory tests (device_client/memtest/ on the device, hub/api/memtests.py on the hub):

    memtest.start   {runId, plan: Plan}                 → {status: Status}
    memtest.cancel  {runId?}                            → {status: Status}
    memtest.status  {}                                  → {supported, status: Status|null,
                                                           health: Health, history: [Result]}
    memtest.ack     {runIds: [str]}                     → {}   (the hub stored these results)

Plan: {mode ("live" | "live_quick" | "full_online" | "test_boot"), impact, placement, quick, passes,
kernelPasses, bitFade, holdOnFailure, timeBudgetSeconds, maxBytes?} with every default already
applied by the hub. Status, Health and Result carry the spec's member names (Resources → Memory
test). Error codes in a memtest reply: busy (a test runs; the hub reads the status to answer 409),
not_running, unsupported, workload_stop_failed, invalid; anything else is internal. ``memtest.start``
answers after the workload was stopped (full online) and before the test runs; for a test boot it
answers with phase ``rebooting`` and then reboots with boot reason ``memory_test``.
Events: ``memtest.progress`` Status (at most about one a second), ``memtest.result`` {result: Result},
sent at the end of a run and again at every link until the hub acknowledges it with memtest.ack;
``memtest.health`` {health: Health} at every link. Results are bounded (memtest/bounds.py: 256 errors,
the 256 pages with the most errors and ``pageSummary``); a run's full page map goes over HTTP, not a
frame (memtest/pagemap.py). Event ``link.refused`` {refusals} reports frames refused as too big
(linkframes.py). Hello: capabilities.memoryTest, retiredPages,
lastMemoryTest (the newest Result, or the interrupted report), workloadHeld, maintenance, and
``memoryTestRunning`` (Status of a run in progress, e.g. in a test boot's maintenance).

Containers (device_client/containers.py): hello capabilities.containerEngine {name, version} when the
agent runs containers (``podman version`` at its start); absent, the hub does not send the device a
version with ``spec.containers`` (its configuration is rejected with the reason) and a rollout of one
counts it ineligible. ConfigApplyPayload.registryAuth {registry: {username, password}}: the credentials
for the registries of the version's images, only those; the agent keeps them in a 0600 auth.json in
its data dir for the engine's pulls and never logs or returns them. A config.apply of the version the
device already runs with ``registryAuth`` present (after a login was created, rotated or deleted on the
hub) restarts nothing and replaces that file with these logins ({}: removes it). ``registryProxy``: the
fleet's registry proxy mode (off, fallback, always) for the version's pulls (device_client/pullroute.py),
sent again the same way when the fleet's proxy changes.

Tunnels (webrtc/device_tunnel.py with device_client/tunnel.py's configuration on the device, webrtc/ on the
CLI, hub/api/tunnels.py on the hub):

    tunnel.open         {grant, offer: {sdp, type}, iceServers: [IceServer]}  → {answer: {sdp, type}}
    tunnel.close        {sessionId, reason?}                                  → {closed: bool}
    tunnel.ice_restart  {sessionId, offer: {sdp, type}}                       → {answer: {sdp, type}}

A grant is a JWT signed with EdDSA (Ed25519) by the hub's key named in its header's ``kid``; claims:
{v: 2, iss: "fleethub", aud: "fleethub:tunnel-grant", sid, orgId, deviceId, principal, target, nbf,
exp (NumericDate seconds), relay (bool), bandwidthBps, clientFingerprint (the DTLS fingerprint of the
CLI's offer), deviceKey (the device's tunnel public key)} (webrtc/grant.py). The device verifies
the grant against the keys the hub sent in ``welcome.hubKeys`` ({kid: base64 public key}; after a
key rotation ``link.keys`` replaces them on a live link) and that deviceId is its own and the offer's fingerprint is clientFingerprint. Reply error codes:
target_not_configured, ssh_disabled, shell_disabled, device_unsupported, invalid_grant, and rejected (any other
refusal, with the reason as message). Data channels: ``control`` (JSON: {type: "renew", grant} →
{type: "renewed", expiresAt} or {type: "error", reason}; {type: "closing", reason}) and one channel
per forwarded TCP connection labelled ``tcp``; for the ``shell`` target, one channel per terminal labelled
``shell`` (a PTY: bytes as on ``tcp``, plus the text message {resize: {cols, rows}}). Event ``tunnel.usage`` {sessionId, bytesIn, bytesOut,
relayedBytes, durationSeconds, final (bool), reason?} while open (every 30 s) and when it closes:
totals since the session opened (bytesIn + bytesOut count every byte; relayedBytes is the part that
went through a TURN relay). A final report made while there was no link is sent at the next link, so
it may arrive after the hub ended the session (expired); the hub records its totals all the same. Hello ``tunnelTargets`` {names: [str], ports: [int], ssh: bool, shell: bool}: the
hub refuses a target that is neither a name nor a port listed there (404 target_not_configured)
before it asks the device; a target given as a port is its decimal string, e.g. "8080". ``ssh`` is
always passed on to a device that sends tunnelTargets: the device answers or refuses ssh_disabled;
``shell`` likewise (shell_disabled).

Billing (device_client/telemetry.py; hub/billing/devices.py):

    telemetry.set   {enabled: bool}                     → {enabled}

The hub sends telemetry.set at link time when the hello's ``telemetry`` field differs from the
organisation's entitlement, and whenever a billing admin switches it; the agent persists it. While
enabled the agent sends event ``telemetry`` {uptime, loadAverage, memory..., sentAt} periodically.
The registry proxy's bytes are metered by the hub as it serves them (hub/registry/); agents report
none (an older agent's ``registry.bytes`` event is an ordinary event, billed nothing).
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError, ValidationInfo,
                      field_validator)

PROTOCOL_VERSION = 1
LINK_PATH = "/v1/device/link"
TOKEN_HEADER = "Authorization"  # "Bearer <device token>" on the WebSocket handshake

# The largest frame either side may send, in UTF-8 bytes. ``encode`` refuses to produce a bigger one
# (FrameTooLarge), so a sender learns it before the peer closes the link; the hub closes a link that
# sends one with CLOSE_TOO_BIG and a reason naming the frame (the device then trims or drops it, and
# never sends it again). The welcome tells the device the hub's limit (``maxFrameBytes``). Frames are
# bounded by construction below this: tests/device_client/test_frame_bounds.py builds the worst case
# of each frame from the limits named in the code and checks it fits.
MAX_FRAME_BYTES = 1024 * 1024
CLOSE_TOO_BIG = 1009  # RFC 6455: message too big
FACT_MAX = 256  # characters of a hello's free-text facts (firmware, architecture): the agent cuts there
AGENT_VERSION_MAX = 64  # characters of hello.agentVersion the hub keeps (a version, not a story)
# hello.tunnelTargets the hub keeps: the first this many names (each at most TARGET_NAME_MAX characters,
# what a tunnel request may name) and ports; a device offering more is cut, and told so in its diagnosis
TUNNEL_TARGETS_MAX = 64
TARGET_NAME_MAX = 64
# A configuration's spec as JSON (UTF-8, compact, as a frame carries it): config.apply carries it beside
# the configuration's files (32 files, 512 KB in all, about 700 KB in base64 with their paths), so the
# hub refuses a larger spec when it is saved rather than meeting a frame it cannot send.
CONFIG_SPEC_MAX_BYTES = 192 * 1024


# An event kind names the event in the hub's streams (an SSE ``event:`` line): lowercase words and dots,
# never a line break or anything else a stream reader could take for framing.
EVENT_KIND_PATTERN = r"^[a-z][a-z0-9_.]{0,63}$"
EventKind = Annotated[str, StringConstraints(pattern=EVENT_KIND_PATTERN)]


def _unstorable(value: Any, where: str = "") -> str | None:
    """What in ``value`` PostgreSQL could not store (text, jsonb) and where: a string with a NUL, a number
    that is not finite (NaN, Infinity, 1e999); None when all is well. (The JSON parser already refuses
    lone surrogates.)"""
    if isinstance(value, str):
        return f"a NUL character in {where.lstrip('.') or 'the value'}" if "\x00" in value else None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"a number that is not finite in {where.lstrip('.') or 'the value'}"
    if isinstance(value, dict):
        for k, v in value.items():
            found = _unstorable(k, f"{where}.<key>") or _unstorable(v, f"{where}.{k}"[:60])
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _unstorable(v, f"{where}[{i}]")
            if found:
                return found
    return None


# The validation context of a frame received from the other side (``decode``): only then are values
# PostgreSQL cannot store refused. A sender building a frame is not refused; ``encode`` escapes instead.
_RECEIVED = {"storable": True}


def _escape_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\\x00")
    if isinstance(value, dict):
        return {_escape_nul(k): _escape_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape_nul(v) for v in value]
    return value


class _Frame(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    @field_validator("*", mode="after")
    @classmethod
    def _storable_text(cls, value: Any, info: ValidationInfo) -> Any:
        # One NUL (or NaN) from a device would make the hub's batched writes (presence, audit) fail for
        # every device: such a frame is refused here, whatever field of whatever frame holds it.
        if info.context is not _RECEIVED:
            return value
        found = _unstorable(value)
        if found:
            raise ValueError(found)
        return value


# Memory tests: the spec's enumerations (Resources → Memory test). ``phase`` takes only these; a
# sub-step the spec does not name is the status's ``step``. Older agents sent the sub-steps as phases:
# ``memtest_phase`` reads those as the spec's phase and a step.
MEMTEST_PHASES = ("idle", "preparing", "stopping_workload", "rebooting", "kernel_sweep", "testing", "confirming",
                  "retiring", "restoring", "done", "failed", "cancelled", "interrupted")
MEMTEST_VERDICTS = ("ok", "weak_cells", "data_line", "address_line", "thermal", "unknown")
MEMTEST_OUTCOMES = ("pass", "fail", "cancelled", "interrupted", "error")
_LEGACY_PHASES = {"patterns": ("testing", "patterns"), "idle_decay": ("testing", "idle_decay"),
                  "holding": ("failed", "holding"), "unknown": ("interrupted", None)}


def memtest_phase(phase: Any, step: Any = None) -> tuple[str, Any]:
    """(phase, step) with phase one of MEMTEST_PHASES (an unknown one reads as interrupted)."""
    if phase in MEMTEST_PHASES:
        return phase, step
    legacy, legacy_step = _LEGACY_PHASES.get(phase, ("interrupted", phase))
    return legacy, step if step is not None else legacy_step


def memtest_status(status: Any) -> Any:
    """A status dict with its phase read as the spec's (see memtest_phase); anything else unchanged."""
    if not isinstance(status, dict) or "phase" not in status or status["phase"] in MEMTEST_PHASES:
        return status
    phase, step = memtest_phase(status["phase"], status.get("step"))
    return {**status, "phase": phase, "step": step}


# Up to 256 errors (and pages) are kept per result; errorCount carries the full count (spec, Memory test).
RESULT_LIST_KEPT = 256


def memtest_result(result: Any) -> Any:
    """A result with a verdict the spec names (an interrupted run of an older agent had null), its
    interrupted.phase read as the spec's, ``interrupted`` only on an interrupted run, no ``source`` (the
    hub sets that as it serves the result; older agents sent what their addresses were there), and at
    most 256 errors and pages: the spec keeps up to 256 per result, errorCount the full count, so a
    device that lists more loses the rest of its list, not its result."""
    if not isinstance(result, dict):
        return result
    out = {k: v for k, v in result.items() if k != "source"}
    for key in ("errors", "pages"):
        if isinstance(out.get(key), list) and len(out[key]) > RESULT_LIST_KEPT:
            out[key] = out[key][:RESULT_LIST_KEPT]
    if out.get("verdict") not in MEMTEST_VERDICTS:
        out["verdict"] = "unknown"
    where = out.get("interrupted")
    if out.get("outcome") != "interrupted" or where is None:
        out.pop("interrupted", None)
    elif isinstance(where, dict) and "phase" in where and where["phase"] not in MEMTEST_PHASES:
        out["interrupted"] = memtest_status(where)
    return out


class MemoryTestCapabilities(_Frame):
    online: bool = False
    offline: bool = False
    offlineReason: str | None = None


class ContainerEngineCapability(_Frame):
    """The engine the agent runs containers with, as it answered at the agent's start."""
    name: Annotated[str, StringConstraints(min_length=1, max_length=64)]  # "podman"
    version: Annotated[str, StringConstraints(max_length=FACT_MAX)] = ""  # the engine's own, e.g. "4.3.1"


class Capabilities(_Frame):
    memoryTest: MemoryTestCapabilities = Field(default_factory=MemoryTestCapabilities)
    tunnel: bool = False
    reboot: bool = True
    # None: the agent runs no containers (no --containers, or the engine did not answer at start); the
    # hub then neither sends it a version with containers nor counts it eligible for a rollout of one
    containerEngine: ContainerEngineCapability | None = None


def runs_containers(facts: dict[str, Any] | None) -> bool:
    """A hello's facts (as the hub keeps them) offer a container engine: capabilities.containerEngine."""
    return bool(((facts or {}).get("capabilities") or {}).get("containerEngine"))


class TunnelTargets(_Frame):
    names: list[str] = Field(default_factory=list)  # configured target names, e.g. "ssh", "web"
    ports: list[int] = Field(default_factory=list)  # TCP ports on the device allowed as a target "<port>"
    ssh: bool = False  # whether the ssh target is enabled (the device refuses it with ssh_disabled if not)
    shell: bool = False  # whether the shell target (a PTY per channel) is enabled; refused with shell_disabled if not


def bounded_targets(targets: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A hello's tunnelTargets (as its model dumps them) cut to what the hub keeps, and what was cut
    in words (a hello once offered 50,000 targets, and every read of the device carried them)."""
    names, ports = targets.get("names") or [], targets.get("ports") or []
    notes = []
    kept_names = [n for n in names if len(n) <= TARGET_NAME_MAX]
    if len(kept_names) < len(names):
        notes.append(f"tunnelTargets.names: {len(names) - len(kept_names)} longer than {TARGET_NAME_MAX} characters, "
                     f"left out")
    kept_ports = [n for n in ports if 0 < n < 65536]
    if len(kept_ports) < len(ports):
        notes.append(f"tunnelTargets.ports: {len(ports) - len(kept_ports)} not a TCP port, left out")
    for what, kept in (("names", kept_names), ("ports", kept_ports)):
        if len(kept) > TUNNEL_TARGETS_MAX:
            notes.append(f"tunnelTargets.{what}: {len(kept)} given, the first {TUNNEL_TARGETS_MAX} kept")
    return {**targets, "names": kept_names[:TUNNEL_TARGETS_MAX], "ports": kept_ports[:TUNNEL_TARGETS_MAX]}, notes


class Hello(_Frame):
    type: Literal["hello"] = "hello"
    protocol: int = PROTOCOL_VERSION
    agentVersion: str = ""
    firmware: str = ""
    architecture: str = ""
    capabilities: Capabilities = Field(default_factory=Capabilities)
    bootReason: str = "power_on"
    deviceClock: str | None = None  # the device's own idea of now, RFC 3339
    tunnelPublicKey: str | None = None  # base64 Ed25519 public key: the device's tunnel identity
    tunnelTargets: TunnelTargets | None = None  # what the agent forwards to (hub checks targets before asking)
    configVersionApplied: str | None = None
    secretFileDigests: dict[str, str] = Field(default_factory=dict)  # path -> sha256 hex
    retiredPages: list[int] = Field(default_factory=list)
    lastMemoryTest: dict[str, Any] | None = None
    memoryTestRunning: dict[str, Any] | None = None  # Status of a memory test in progress
    maintenance: bool = False  # up in maintenance (a test boot) with the workload held
    workloadHeld: bool = False  # the workload is held (a memory test): rollouts defer this device
    pendingActions: list[str] = Field(default_factory=list)  # health_check, battery_discharging, mission_critical
    telemetry: bool | None = None  # telemetry events on (the hub's last telemetry.set); None: no telemetry module
    # systemfacts.SystemFacts, kept a plain object so the hub can cut or drop what is out of bounds and
    # keep the rest of the hello (systemfacts.checked)
    system: dict[str, Any] | None = None


class Welcome(_Frame):
    type: Literal["welcome"] = "welcome"
    deviceId: str = Field(description="the device's id: commands are addressed cmd.<deviceId>.<verb>")
    heartbeatInterval: float = Field(description="seconds between the device's heartbeat events")
    hubKeys: dict[str, str] = Field(default_factory=dict, description=(
        "key id (kid) -> the raw 32-byte Ed25519 public key in standard base64: the keys tunnel grants are "
        "signed with"))
    maxFrameBytes: int = Field(MAX_FRAME_BYTES, description="the largest frame, in UTF-8 bytes, the hub takes "
                                                            "from this device")


class Command(_Frame):
    type: Literal["command"] = "command"
    id: str
    subject: str
    payload: dict[str, Any] = Field(default_factory=dict)


class ReplyError(_Frame):
    code: str = Field(description="machine-readable: a common code (unknown_command, wrong_device, "
                                  "invalid_payload, internal) or one of the verb's own")
    message: str = Field("", description="for people: what was wrong, in words (never a secret)")


class Reply(_Frame):
    type: Literal["reply"] = "reply"
    id: str
    ok: bool
    payload: dict[str, Any] | None = None
    error: ReplyError | None = None


class Event(_Frame):
    type: Literal["event"] = "event"
    kind: EventKind
    payload: dict[str, Any] = Field(default_factory=dict)


Frame = Annotated[Union[Hello, Welcome, Command, Reply, Event], Field(discriminator="type")]
_frame_adapter: TypeAdapter[Frame] = TypeAdapter(Frame)


class ProtocolError(ValueError):
    """A frame that is not JSON, not an object, or not one of the frame types above."""


def decode(text: str | bytes) -> Hello | Welcome | Command | Reply | Event:
    """A received frame; ProtocolError (naming the field) for anything else, including a NUL in any
    string, a number that is not finite and an event kind outside ``EVENT_KIND_PATTERN``."""
    try:
        return _frame_adapter.validate_json(text, context=_RECEIVED)
    except ValidationError as exc:
        # Name the field (``hello.bootReason: ...``) so a device's operator can find what was refused.
        first = exc.errors(include_url=False, include_input=False)[0]
        loc = ".".join(str(part) for part in first["loc"])
        raise ProtocolError(f"{loc}: {first['msg']}" if loc else first["msg"]) from None
    except ValueError as exc:
        raise ProtocolError(str(exc).splitlines()[0]) from None


class FrameTooLarge(ProtocolError):
    """``encode`` would have made a frame over the limit: it was not sent (the sender trims or drops it)."""

    def __init__(self, frame: _Frame, size: int, limit: int) -> None:
        self.what = describe(frame)
        self.size, self.limit = size, limit
        super().__init__(f"{self.what} frame of {size} bytes is over the link's limit of {limit} bytes")


def describe(frame: _Frame) -> str:
    """``event memtest.result``, ``reply``, ``hello``: what a refused frame was, for logs and reasons."""
    kind = getattr(frame, "kind", None)
    return f"{frame.type} {kind}" if kind else str(getattr(frame, "type", "frame"))


def encode(frame: _Frame, limit: int = MAX_FRAME_BYTES) -> str:
    text = frame.model_dump_json(exclude_none=True)  # NaN and Infinity become null
    if "\\u0000" in text:
        # A NUL would get the frame refused by the peer (decode): send it as the visible text \x00.
        text = dumps(_escape_nul(frame.model_dump(mode="json", exclude_none=True)))
    # UTF-8 takes at most 4 bytes a character: only a frame that might be too big is measured
    if len(text) * 4 > limit:
        size = len(text.encode())
        if size > limit:
            raise FrameTooLarge(frame, size, limit)
    return text


def subject(device_id: str, verb: str) -> str:
    """The bus subject of a device command: ``cmd.<device_id>.<verb>``."""
    return f"cmd.{device_id}.{verb}"


def verb_of(subject_: str) -> str:
    """``cmd.<id>.tunnel.open`` -> ``tunnel.open``."""
    parts = subject_.split(".", 2)
    if len(parts) != 3 or parts[0] != "cmd":
        raise ProtocolError(f"not a command subject: {subject_!r}")
    return parts[2]


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
