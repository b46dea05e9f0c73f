"""The device link's machine-readable contract, and the tables of docs/device-protocol.md, made from
the code's own models (protocol.py frames, verbs.py verbs and events, linkcodes.py close codes).

``document()`` is the JSON Schema document the hub serves at ``GET /v1/device/protocol.json``.
``tables()`` renders the generated blocks of docs/device-protocol.md; tests/device_client/
test_protocol_doc.py fails when the file's blocks differ, so the prose cannot drift from the code.
Regenerate the blocks with ``python -m device_client.shared.protocol_schema docs/device-protocol.md``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from . import linkcodes, protocol, verbs
from .memtest_members import MemtestResult, MemtestStatus
from .systemfacts import MAX_IP_ADDRESSES, SystemFacts

FRAMES: dict[str, type[BaseModel]] = {"hello": protocol.Hello, "welcome": protocol.Welcome,
                                      "command": protocol.Command, "reply": protocol.Reply,
                                      "event": protocol.Event}
LIMITS: dict[str, tuple[Any, str]] = {
    "maxFrameBytes": (protocol.MAX_FRAME_BYTES, "UTF-8 bytes of one frame, either way (welcome.maxFrameBytes)"),
    "helloTimeoutSeconds": (10, "the hello must arrive this soon after the handshake"),
    "heartbeatTimeoutIntervals": (3, "the hub drops a link silent for this many heartbeat intervals"),
    "closeReasonBytes": (linkcodes.REASON_MAX_BYTES, "a close reason is at most this long (RFC 6455)"),
    "factMaxChars": (protocol.FACT_MAX, "hello.firmware and hello.architecture are cut here"),
    "agentVersionMaxChars": (protocol.AGENT_VERSION_MAX, "the hub keeps this much of hello.agentVersion"),
    "ipAddressesMax": (MAX_IP_ADDRESSES, "addresses of system.ipAddresses the hub keeps (the first ones)"),
    "tunnelTargetsMax": (protocol.TUNNEL_TARGETS_MAX, "names, and ports, of hello.tunnelTargets the hub keeps (the "
                                                      "first ones)"),
    "targetNameMaxChars": (protocol.TARGET_NAME_MAX, "a longer tunnel target name is left out"),
    "secretFileMaxBytes": (64 * 1024, "decoded contents of one secret file"),
    "configSpecMaxBytes": (protocol.CONFIG_SPEC_MAX_BYTES,
                           "a config.apply spec as compact UTF-8 JSON (the hub refuses a larger one when saved)"),
    "eventKindPattern": (protocol.EVENT_KIND_PATTERN, "what an event kind may look like"),
    "repliesRemembered": (256, "the newest command ids a device keeps replies for (at least)"),
    "supersededBackoffSeconds": (linkcodes.SUPERSEDED_BACKOFF, "least wait after close 4001"),
    "tunnelUsageInFlight": (2, "tunnel.usage events the hub works on at once per link; past it, it stops reading"),
}
# What each hello field means (protocol.py keeps its models terse): a field without a note here fails
# tests/device_client/test_protocol_doc.py, so a new hello field cannot go undocumented.
HELLO_NOTES: dict[str, str] = {
    "type": "\"hello\"",
    "protocol": "the protocol version the device speaks; absent means 1 (see Versions)",
    "agentVersion": f"the device software's version, free text; the hub keeps the first {protocol.AGENT_VERSION_MAX} "
                    "characters (absent: the hub keeps what it had)",
    "firmware": f"free text, at most {protocol.FACT_MAX} characters; absent: the hub keeps what it had",
    "architecture": f"e.g. armv7l, aarch64, x86_64 (rollouts match it), at most {protocol.FACT_MAX} characters; "
                    "absent: the hub keeps what it had",
    "capabilities": "what the device can do (memory tests, tunnels, reboot)",
    "bootReason": "why the device last booted: power_on, reboot, or the reboot command's reason",
    "deviceClock": "the device's own idea of now, RFC 3339 (shown, never trusted for schedules)",
    "tunnelPublicKey": "base64 Ed25519 public key: the device's tunnel identity",
    "tunnelTargets": f"what a tunnel may reach on the device (the hub refuses other targets); the hub keeps the first "
                     f"{protocol.TUNNEL_TARGETS_MAX} names of at most {protocol.TARGET_NAME_MAX} characters and the "
                     f"first {protocol.TUNNEL_TARGETS_MAX} ports (1-65535), and counts a cut like one of system's",
    "configVersionApplied": "the versionId the device runs and has verified, or null (none ever applied). A "
                            "version being verified is never named: after a rejected apply it is rolledBackTo (the "
                            "previous version, or null); an apply a power loss interrupted is rolled back at boot, "
                            "so the previous one; an overridden file and files.wipe leave it unchanged",
    "secretFileDigests": "path -> hex sha256 of every file the hub put there and the device still holds: files.put "
                         "files and a configuration's files alike (empty after files.wipe); where a configuration "
                         "file was overridden, the path shows the device file's digest",
    "retiredPages": "physical addresses of memory pages the device retired",
    "lastMemoryTest": "the newest memory-test result, a MemtestResult (the models below; the hub checks it: a "
                      "malformed one is a protocol error and is ignored)",
    "memoryTestRunning": "the MemtestStatus of a memory test in progress, or null: nothing runs (after a reboot an "
                         "online test never does: it ended interrupted). Checked like lastMemoryTest",
    "maintenance": "up in maintenance (a test boot), workload held",
    "workloadHeld": "the workload is held (a memory test): rollouts defer the device",
    "pendingActions": "health_check, battery_discharging, mission_critical",
    "telemetry": "whether telemetry events are on (the hub's last telemetry.set); null: no telemetry",
    "system": "a SystemFacts: uptime, addresses, CPU, memory and disk use (also in every telemetry sample). The hub "
              "keeps what is within bounds: a member out of bounds is left out, addresses past the limit are cut, "
              "and each is counted as a protocol error for the device's diagnosis and logged (a telemetry sample's "
              "is also told to the device, link.notice); the rest of the frame stands",
}
NESTED = (protocol.Capabilities, protocol.MemoryTestCapabilities, protocol.TunnelTargets)
# Members a frame's model keeps as plain objects, so that the hub can refuse a malformed one and keep
# the rest of the frame (actors/device_memtests.py checks them with these models): typed here, in the
# schema and the document, so a device maker reads the same types the hub checks.
TYPED_MEMBERS: dict[type[BaseModel], dict[str, type[BaseModel]]] = {
    protocol.Hello: {"lastMemoryTest": MemtestResult, "memoryTestRunning": MemtestStatus, "system": SystemFacts}}
BLOCK = re.compile(r"(<!-- generated:(?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema, with its TYPED_MEMBERS as references to their models."""
    schema = model.model_json_schema()
    for name, member in TYPED_MEMBERS.get(model, {}).items():
        sub = member.model_json_schema()
        defs = schema.setdefault("$defs", {})
        defs.update(sub.pop("$defs", {}))
        defs[member.__name__] = sub
        kept = {k: v for k, v in schema["properties"][name].items() if k in ("default", "description", "title")}
        schema["properties"][name] = {"anyOf": [{"$ref": f"#/$defs/{member.__name__}"}, {"type": "null"}], **kept}
    return schema


def document() -> dict[str, Any]:
    """JSON Schema of every frame, every verb's payload and reply, every event's payload."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "fleethub device link",
        "description": "WebSocket GET /v1/device/link, JSON text frames; docs/device-protocol.md",
        "protocolVersion": protocol.PROTOCOL_VERSION,
        "supportedVersions": list(linkcodes.SUPPORTED_VERSIONS),
        "frames": {name: schema_of(model) for name, model in FRAMES.items()},
        "verbs": {v.name: {"summary": v.summary, "optional": v.optional, "strict": v.strict,
                           "errors": [*verbs.COMMON_ERRORS, *v.errors],
                           "payload": v.payload.model_json_schema(), "reply": v.reply.model_json_schema()}
                  for v in verbs.VERBS.values()},
        "events": {e.kind: {"summary": e.summary, "strict": e.strict, "payload": e.payload.model_json_schema()}
                   for e in verbs.EVENTS.values()},
        "closeCodes": [{"code": int(r.code), "name": r.code.name, "by": r.by, "meaning": r.meaning,
                        "deviceShould": r.device_should} for r in linkcodes.CLOSE_RULES],
        "limits": {name: value for name, (value, _) in LIMITS.items()},
    }


# ---- markdown ---------------------------------------------------------------------------------------

def _type(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in prop:
        kinds = [_type(p) for p in prop["anyOf"] if p.get("type") != "null"]
        nullable = any(p.get("type") == "null" for p in prop["anyOf"])
        return " \\| ".join(kinds) + (" \\| null" if nullable else "")
    if "enum" in prop:
        return " \\| ".join(f'"{v}"' for v in prop["enum"])
    if "const" in prop:
        return f"{prop['const']!r}".replace("True", "true")
    kind = prop.get("type", "any")
    if kind == "array":
        return f"[{_type(prop.get('items', {}))}]"
    if kind == "object" and "additionalProperties" in prop and isinstance(prop["additionalProperties"], dict):
        return f"{{str: {_type(prop['additionalProperties'])}}}"
    return {"integer": "int", "number": "number", "string": "str", "boolean": "bool", "object": "object"}.get(kind, kind)


def _fields(model: type[BaseModel]) -> list[tuple[str, str, bool, str]]:
    schema = schema_of(model)
    required = set(schema.get("required", []))
    out = []
    for name, prop in schema.get("properties", {}).items():
        note = prop.get("description", "")
        if name not in required and "default" in prop and prop["default"] not in (None, [], {}):
            note = (note + "; " if note else "") + f"default {prop['default']!r}".replace("True", "true").replace(
                "False", "false")
        out.append((name, _type(prop), name in required, note))
    return out


def _shape(model: type[BaseModel]) -> str:
    fields = _fields(model)
    if not fields:
        return "{}"
    return "{" + ", ".join(f"{n}{'' if req else '?'}: {t}" for n, t, req, _ in fields) + "}"


def _row(*cells: str) -> str:
    return "| " + " | ".join(c.replace("\n", " ") for c in cells) + " |"


def _model_table(model: type[BaseModel], notes: dict[str, str] | None = None) -> list[str]:
    lines = [_row("field", "type", "required", "meaning"), _row("---", "---", "---", "---")]
    for n, t, req, note in _fields(model):
        if notes is not None:
            default = note.rpartition("default ")[2] if "default " in note else ""
            note = notes.get(n, "") + (f"; default {default}" if default else "")
        lines.append(_row(f"`{n}`", t, "yes" if req else "no", note))
    return lines


def _named_models() -> list[type[BaseModel]]:
    """Models the verb and event tables refer to by name, in order of first use."""
    seen: list[type[BaseModel]] = []
    for model in [*(m for v in verbs.VERBS.values() for m in (v.payload, v.reply)),
                  *(e.payload for e in verbs.EVENTS.values())]:
        for ref in model.model_json_schema().get("$defs", {}):
            nested = getattr(verbs, ref, None)
            if nested is not None and nested not in seen:
                seen.append(nested)
    return seen


def tables() -> dict[str, str]:
    """The generated blocks of docs/device-protocol.md, by name."""
    hello = _model_table(protocol.Hello, HELLO_NOTES)
    for model in NESTED:
        hello += ["", f"**{model.__name__}**", "", *_model_table(model)]
    welcome = _model_table(protocol.Welcome)
    reply_error = _model_table(protocol.ReplyError)  # rendered where error replies are described
    verb_rows = [_row("verb", "payload", "reply payload", "error codes (besides the common ones)", "required"),
                 _row("---", "---", "---", "---", "---")]
    for v in verbs.VERBS.values():
        verb_rows.append(_row(f"`{v.name}`", f"`{_shape(v.payload)}`", f"`{_shape(v.reply)}`",
                              ", ".join(f"`{e}`" for e in v.errors) or "—", "no" if v.optional else "yes")
                         + "")
    verb_rows += ["", "What each verb does:", ""] + [f"- `{v.name}`: {v.summary}." for v in verbs.VERBS.values()]
    verb_rows += ["", "Common error codes, any verb: " + ", ".join(f"`{e}`" for e in verbs.COMMON_ERRORS) + "."]
    models: list[str] = []
    for model in _named_models():
        models += [f"**{model.__name__}**", "", *_model_table(model), ""]
    event_rows = [_row("kind", "payload", "when"), _row("---", "---", "---")]
    event_rows += [_row(f"`{e.kind}`", f"`{_shape(e.payload)}`", e.summary) for e in verbs.EVENTS.values()]
    closes = [_row("code", "name", "sent by", "meaning", "what the device does next"), _row(*["---"] * 5)]
    closes += [_row(str(int(r.code)), r.code.name, r.by, r.meaning, r.device_should) for r in linkcodes.CLOSE_RULES]
    limits = [_row("limit", "value", "meaning"), _row("---", "---", "---")]
    limits += [_row(f"`{name}`", f"`{value}`", note) for name, (value, note) in LIMITS.items()]
    from ..qualify.rules import RULES

    rules = [_row("rule", "section", "the device…"), _row("---", "---", "---")]
    rules += [_row(r.id, r.section, r.text) for r in RULES]
    return {"rules": "\n".join(rules), "hello": "\n".join(hello), "welcome": "\n".join(welcome),
            "reply-error": "\n".join(reply_error), "verbs": "\n".join(verb_rows),
            "models": "\n".join(models).rstrip(), "events": "\n".join(event_rows),
            "close-codes": "\n".join(closes), "limits": "\n".join(limits)}


def render(text: str) -> str:
    """``text`` (the document) with every generated block replaced by what the code says now."""
    blocks = tables()

    def fill(m: re.Match[str]) -> str:
        return m.group(1) + blocks[m.group("name")] + "\n" + m.group(4)

    return BLOCK.sub(fill, text)


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/device-protocol.md")
    before = path.read_text()
    after = render(before)
    if after != before:
        path.write_text(after)
        print(f"{path}: generated blocks updated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
