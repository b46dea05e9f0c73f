"""Device frames the hub could not store or stream are refused when decoded, naming the field: a NUL
anywhere in a string and a number that is not finite (PostgreSQL refuses both, in text and jsonb
alike) and an event kind outside ``EVENT_KIND_PATTERN`` (it becomes an SSE event name)."""

from __future__ import annotations

import json

import pytest

from device_client.shared import protocol as p


@pytest.mark.parametrize("kind", ["heartbeat", "files.result", "tunnel.usage", "memtest.progress", "registry.bytes",
                                  "telemetry", "a" * 64, "x9_y.z"])
def test_the_kinds_agents_send_are_accepted(kind):
    assert p.decode(json.dumps({"type": "event", "kind": kind})).kind == kind


@pytest.mark.parametrize("kind", ["x\nevent: device.state", "heartbeat\n", "heartbeat\r", "", "Heartbeat",
                                  "9lives", "a" * 65, "a b", "a:b", "ä"])
def test_other_kinds_are_refused_naming_the_field(kind):
    with pytest.raises(p.ProtocolError, match="^event.kind: "):
        p.decode(json.dumps({"type": "event", "kind": kind}))


@pytest.mark.parametrize("frame, where", [
    ({"type": "hello", "bootReason": "power\x00on"}, "hello.bootReason: "),
    ({"type": "hello", "capabilities": {"memoryTest": {"offlineReason": "\x00"}}},
     "hello.capabilities.memoryTest.offlineReason: "),
    ({"type": "hello", "secretFileDigests": {"/etc/a\x00": "ab"}}, "hello.secretFileDigests: .*<key>"),
    ({"type": "hello", "lastMemoryTest": {"runId": "r", "errors": [{"note": "x\x00"}]}},
     r"hello.lastMemoryTest: .*errors\[0\].note"),
    ({"type": "event", "kind": "files.result", "payload": {"results": [{"error": "disk\x00"}]}},
     r"event.payload: .*results\[0\].error"),
    ({"type": "reply", "id": "1", "ok": True, "payload": {"deviceClock": "\x00"}}, "reply.payload: "),
    ({"type": "reply", "id": "1\x00", "ok": True}, "reply.id: "),
])
def test_a_nul_in_any_string_of_a_frame_is_refused_naming_the_field(frame, where):
    with pytest.raises(p.ProtocolError, match="^" + where):
        p.decode(json.dumps(frame))


@pytest.mark.parametrize("text, where", [
    ('{"type": "event", "kind": "tunnel.usage", "payload": {"bytesIn": Infinity}}', "event.payload: .*not finite in bytesIn"),
    ('{"type": "event", "kind": "telemetry", "payload": {"load": [0.5, NaN]}}', r"event.payload: .*not finite in load\[1\]"),
    ('{"type": "hello", "lastMemoryTest": {"tempC": 1e999}}', "hello.lastMemoryTest: .*not finite in tempC"),
])
def test_a_number_postgresql_cannot_store_is_refused_naming_the_field(text, where):
    with pytest.raises(p.ProtocolError, match="^" + where):
        p.decode(text)


def test_finite_numbers_pass():
    assert p.decode('{"type": "event", "kind": "telemetry", "payload": {"load": [0.5, 1e300, -2]}}').payload == {
        "load": [0.5, 1e300, -2]}


def test_the_escaped_text_of_a_nul_is_ordinary_text():
    frame = p.decode(json.dumps({"type": "hello", "bootReason": "\\u0000 is how JSON writes NUL"}))
    assert frame.bootReason == "\\u0000 is how JSON writes NUL"


def test_a_lone_surrogate_never_gets_through():
    with pytest.raises(p.ProtocolError):
        p.decode('{"type": "hello", "bootReason": "\\ud800"}')


def test_a_sender_is_never_refused_its_own_nul_or_nan_it_sends_them_storable():
    """An agent whose text holds a NUL (an error message, a file name) or whose numbers overflow must
    not have its link closed again and again: encode sends the NUL as the text \\x00 and NaN as null."""
    event = p.Event(kind="files.result", payload={"results": [{"error": "bad\x00name", "load": float("nan")}],
                                                 "k\x00": float("inf")})
    frame = p.decode(p.encode(event))
    assert frame.payload == {"results": [{"error": "bad\\x00name", "load": None}], "k\\x00": None}
    hello = p.decode(p.encode(p.Hello(bootReason="power\x00on", firmware="\\u0000 stays as it is")))
    assert hello.bootReason == "power\\x00on" and hello.firmware == "\\u0000 stays as it is"
