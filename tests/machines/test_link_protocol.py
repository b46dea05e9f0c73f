"""The device link's protocol without IO (device_client/shared/link/): text frames and instants in, events
and frames out. Every (state, input) pair of both sides is a row of one table."""

from __future__ import annotations

import json

import pytest

from device_client.shared import protocol as p
from device_client.shared.link import (CommandReceived, DeviceSide, DeviceState, EventReceived, HeartbeatDue,
                                HeartbeatReceived, HelloReceived, HubSide, HubState, Ignored, LinkFailed,
                                ProtocolViolation, ReplyMemory, ReplyReceived, WelcomeReceived)
from device_client.shared.link.hubside import LinkClosedError
from device_client.shared.linkcodes import Close

T0 = 1000.0
LIMIT = 4096
HELLO = json.dumps({"type": "hello", "agentVersion": "1", "bootReason": "power_on"})
HELLO_V2 = json.dumps({"type": "hello", "protocol": 2})
WELCOME = json.dumps({"type": "welcome", "deviceId": "d1", "heartbeatInterval": 30})
COMMAND = json.dumps({"type": "command", "id": "c1", "subject": "cmd.d1.ping", "payload": {}})
REPLY = json.dumps({"type": "reply", "id": "c1", "ok": True, "payload": {}})
HEARTBEAT = json.dumps({"type": "event", "kind": "heartbeat", "payload": {}})
EVENT = json.dumps({"type": "event", "kind": "files.result", "payload": {"results": []}})
NOT_JSON = "{nope"
NOT_A_FRAME = json.dumps({"type": "telegram"})
HUGE = json.dumps({"type": "event", "kind": "memtest.result", "payload": {"x": "y" * LIMIT}})
FRAMES = {"hello": HELLO, "hello_v2": HELLO_V2, "welcome": WELCOME, "command": COMMAND, "reply": REPLY,
          "heartbeat": HEARTBEAT, "event": EVENT, "not_json": NOT_JSON, "not_a_frame": NOT_A_FRAME, "huge": HUGE}


def hub_in(state: HubState) -> HubSide:
    side = HubSide(T0, hello_timeout=10.0, max_frame_bytes=LIMIT)
    if state is not HubState.AWAIT_HELLO:
        side.receive(HELLO, T0 + 1)
    if state is HubState.CLOSED:
        side.close(Close.SUPERSEDED, "taken over")
    return side


# (state, frame) -> (event type, close code or None, next state)
HUB_TABLE = {
    (HubState.AWAIT_HELLO, "hello"): (HelloReceived, None, HubState.OPEN),
    (HubState.AWAIT_HELLO, "hello_v2"): (ProtocolViolation, Close.UNKNOWN_VERSION, HubState.CLOSED),
    (HubState.AWAIT_HELLO, "welcome"): (ProtocolViolation, Close.BAD_FRAME, HubState.CLOSED),
    (HubState.AWAIT_HELLO, "command"): (ProtocolViolation, Close.BAD_FRAME, HubState.CLOSED),
    (HubState.AWAIT_HELLO, "reply"): (ProtocolViolation, Close.BAD_FRAME, HubState.CLOSED),
    (HubState.AWAIT_HELLO, "heartbeat"): (ProtocolViolation, Close.BAD_FRAME, HubState.CLOSED),
    (HubState.AWAIT_HELLO, "event"): (ProtocolViolation, Close.BAD_FRAME, HubState.CLOSED),
    (HubState.AWAIT_HELLO, "not_json"): (ProtocolViolation, Close.BAD_FRAME, HubState.CLOSED),
    (HubState.AWAIT_HELLO, "not_a_frame"): (ProtocolViolation, Close.BAD_FRAME, HubState.CLOSED),
    (HubState.AWAIT_HELLO, "huge"): (ProtocolViolation, Close.TOO_BIG, HubState.CLOSED),
    (HubState.OPEN, "hello"): (ProtocolViolation, Close.OUT_OF_ORDER, HubState.CLOSED),
    (HubState.OPEN, "hello_v2"): (ProtocolViolation, Close.OUT_OF_ORDER, HubState.CLOSED),
    (HubState.OPEN, "welcome"): (ProtocolViolation, Close.OUT_OF_ORDER, HubState.CLOSED),
    (HubState.OPEN, "command"): (ProtocolViolation, Close.OUT_OF_ORDER, HubState.CLOSED),
    (HubState.OPEN, "reply"): (ReplyReceived, None, HubState.OPEN),
    (HubState.OPEN, "heartbeat"): (HeartbeatReceived, None, HubState.OPEN),
    (HubState.OPEN, "event"): (EventReceived, None, HubState.OPEN),
    (HubState.OPEN, "not_json"): (ProtocolViolation, Close.BAD_FRAME, HubState.CLOSED),
    (HubState.OPEN, "not_a_frame"): (ProtocolViolation, Close.BAD_FRAME, HubState.CLOSED),
    (HubState.OPEN, "huge"): (ProtocolViolation, Close.TOO_BIG, HubState.CLOSED),
}


def test_the_hub_table_covers_every_live_state_and_frame():
    assert set(HUB_TABLE) == {(s, f) for s in (HubState.AWAIT_HELLO, HubState.OPEN) for f in FRAMES}


@pytest.mark.parametrize(("state", "frame"), list(HUB_TABLE), ids=[f"{s.name}-{f}" for s, f in HUB_TABLE])
def test_hub_side(state, frame):
    side = hub_in(state)
    kind, code, after = HUB_TABLE[(state, frame)]
    [event] = side.receive(FRAMES[frame], T0 + 2)
    assert type(event) is kind
    if code is not None:
        assert event.code == code and side.close_code == code
        assert 0 < len(event.reason.encode()) <= 123
    assert side.state is after
    assert side.deadline() is None  # only a link waiting for its hello has one


@pytest.mark.parametrize("frame", list(FRAMES))
def test_a_closed_hub_side_takes_no_frame(frame):
    side = hub_in(HubState.CLOSED)
    with pytest.raises(LinkClosedError):
        side.receive(FRAMES[frame], T0 + 2)
    with pytest.raises(LinkClosedError):
        side.welcome(deviceId="d1", heartbeatInterval=30)
    assert side.tick(T0 + 100) == []


def test_the_hub_reasons_name_what_was_refused():
    assert hub_in(HubState.AWAIT_HELLO).receive(HELLO_V2, T0)[0].reason == (
        "hello.protocol: version 2 is not supported; this hub speaks 1")
    assert hub_in(HubState.AWAIT_HELLO).receive(REPLY, T0)[0].reason.startswith("the first frame must be a hello")
    assert hub_in(HubState.AWAIT_HELLO).receive(NOT_JSON, T0)[0].reason.startswith("malformed hello: ")
    assert hub_in(HubState.OPEN).receive(NOT_JSON, T0)[0].reason.startswith("malformed frame: ")
    assert hub_in(HubState.OPEN).receive(COMMAND, T0)[0].reason == "unexpected command frame on an open link"
    huge = hub_in(HubState.OPEN).receive(HUGE, T0)[0]
    assert (huge.frame, huge.size) == ("event memtest.result", len(HUGE))
    assert huge.reason == f"event memtest.result frame of {len(HUGE)} bytes is over the limit of {LIMIT} bytes"


def test_the_hello_deadline_is_exact():
    side = hub_in(HubState.AWAIT_HELLO)
    assert side.deadline() == T0 + 10
    assert side.tick(T0 + 9.999) == [] and side.state is HubState.AWAIT_HELLO
    [late] = side.tick(T0 + 10)
    assert (late.code, late.reason) == (Close.HELLO_TIMEOUT, "no hello within 10 s")
    assert side.state is HubState.CLOSED and side.deadline() is None


def test_a_hello_after_its_deadline_is_refused_even_before_a_tick():
    [late] = hub_in(HubState.AWAIT_HELLO).receive(HELLO, T0 + 10)
    assert late.code == Close.HELLO_TIMEOUT


def test_a_frame_exactly_at_the_limit_passes_and_one_byte_more_does_not():
    pad = LIMIT - len(json.dumps({"type": "event", "kind": "x", "payload": {"p": ""}}))
    exact = json.dumps({"type": "event", "kind": "x", "payload": {"p": "a" * pad}})
    assert len(exact) == LIMIT
    assert type(hub_in(HubState.OPEN).receive(exact, T0)[0]) is EventReceived
    over = exact.replace('"a', '"aa', 1)
    assert hub_in(HubState.OPEN).receive(over, T0)[0].code == Close.TOO_BIG
    # bytes, not characters: 1100 four-byte characters are 4400 bytes
    wide = json.dumps({"type": "event", "kind": "x", "payload": {"p": "😀" * 1100}}, ensure_ascii=False)
    assert len(wide) < LIMIT < len(wide.encode())
    assert hub_in(HubState.OPEN).receive(wide, T0)[0].code == Close.TOO_BIG


def test_the_hub_sends_welcome_and_commands_within_its_limit():
    side = hub_in(HubState.OPEN)
    welcome = p.decode(side.welcome(deviceId="d1", heartbeatInterval=30, hubKeys={}))
    assert isinstance(welcome, p.Welcome) and welcome.maxFrameBytes == LIMIT
    assert p.decode(side.welcome(deviceId="d1", heartbeatInterval=30, maxFrameBytes=9000)).maxFrameBytes == 9000
    assert isinstance(p.decode(side.command(p.Command(id="c", subject="cmd.d1.ping", payload={}))), p.Command)
    side.command(p.Command(id="c", subject="cmd.d1.x", payload={"x": "y" * LIMIT}))  # the device takes 1 MiB
    with pytest.raises(p.FrameTooLarge):
        side.command(p.Command(id="c", subject="cmd.d1.x", payload={"x": "y" * p.MAX_FRAME_BYTES}))
    with pytest.raises(LinkClosedError):
        hub_in(HubState.AWAIT_HELLO).command(p.Command(id="c", subject="cmd.d1.ping", payload={}))


def test_the_hub_closing_bounds_its_reason():
    side = hub_in(HubState.OPEN)
    closing = side.close(Close.DRAINING, "word " * 60)
    assert closing.code == Close.DRAINING and len(closing.reason.encode()) <= 123 and closing.reason.endswith("…")
    assert side.state is HubState.CLOSED


# ---- the device's side ----

def device_in(state: DeviceState) -> DeviceSide:
    side = DeviceSide(T0, handshake_timeout=10.0)
    if state is not DeviceState.AWAIT_WELCOME:
        side.receive(WELCOME, T0 + 1)
    if state is DeviceState.CLOSED:
        side.closed()
    return side


DEVICE_TABLE = {
    (DeviceState.AWAIT_WELCOME, "welcome"): (WelcomeReceived, DeviceState.OPEN),
    **{(DeviceState.AWAIT_WELCOME, f): (LinkFailed, DeviceState.CLOSED) for f in FRAMES if f != "welcome"},
    (DeviceState.OPEN, "command"): (CommandReceived, DeviceState.OPEN),
    **{(DeviceState.OPEN, f): (Ignored, DeviceState.OPEN) for f in FRAMES if f not in ("command", "huge")},
    # a frame over our limit never reaches the side: the WebSocket library closes with 1009
    (DeviceState.OPEN, "huge"): (Ignored, DeviceState.OPEN),
}


@pytest.mark.parametrize(("state", "frame"), list(DEVICE_TABLE), ids=[f"{s.name}-{f}" for s, f in DEVICE_TABLE])
def test_device_side(state, frame):
    side = device_in(state)
    kind, after = DEVICE_TABLE[(state, frame)]
    [event] = side.receive(FRAMES[frame], T0 + 2)
    assert type(event) is kind
    assert side.state is after


@pytest.mark.parametrize("frame", list(FRAMES))
def test_a_closed_device_side_takes_no_frame(frame):
    side = device_in(DeviceState.CLOSED)
    with pytest.raises(LinkClosedError):
        side.receive(FRAMES[frame], T0 + 2)
    with pytest.raises(LinkClosedError):
        side.heartbeat({}, T0 + 2)
    assert side.tick(T0 + 100) == [] and side.deadline() is None


def test_no_welcome_by_the_deadline_fails_the_link():
    side = device_in(DeviceState.AWAIT_WELCOME)
    assert side.deadline() == T0 + 10 and side.tick(T0 + 9.9) == []
    [failed] = side.tick(T0 + 10)
    assert failed == LinkFailed("no welcome within 10s") and side.state is DeviceState.CLOSED
    assert type(device_in(DeviceState.AWAIT_WELCOME).receive(WELCOME, T0 + 10)[0]) is LinkFailed


def test_heartbeats_keep_a_fixed_schedule_from_the_welcome():
    side = DeviceSide(T0)
    side.receive(WELCOME, T0 + 1)  # interval 30
    assert side.deadline() == T0 + 31 and side.tick(T0 + 30.9) == []
    assert side.tick(T0 + 31) == [HeartbeatDue()]
    sent = p.decode(side.heartbeat({"uptime": 1.0}, T0 + 31.4))  # the send took 0.4 s: no drift
    assert (sent.type, sent.kind, sent.payload) == ("event", "heartbeat", {"uptime": 1.0})
    assert side.deadline() == T0 + 61
    side.heartbeat({}, T0 + 200)  # stalled past several: the next is due at once, then every 30 s
    assert side.deadline() == T0 + 200
    side.heartbeat({}, T0 + 200)
    assert side.deadline() == T0 + 230


def test_a_busy_link_still_says_when_a_heartbeat_is_due():
    side = device_in(DeviceState.OPEN)  # welcomed at T0 + 1, interval 30
    assert side.receive(COMMAND, T0 + 30)[0] == CommandReceived(p.decode(COMMAND))
    assert side.receive(COMMAND, T0 + 31) == [HeartbeatDue(), CommandReceived(p.decode(COMMAND))]
    assert side.receive(NOT_JSON, T0 + 31)[0] == HeartbeatDue()  # until the shell sends it
    side.heartbeat({}, T0 + 31)
    [ignored] = side.receive(NOT_JSON, T0 + 32)
    assert ignored.undecodable and not side.receive(REPLY, T0 + 32)[0].undecodable


def test_a_hub_asking_for_no_interval_gets_the_minimum():
    side = DeviceSide(T0)
    side.receive(json.dumps({"type": "welcome", "deviceId": "d1", "heartbeatInterval": 0}), T0)
    assert side.interval == 0.05 and side.deadline() == T0 + 0.05


def test_heartbeat_before_the_welcome_is_a_bug():
    with pytest.raises(LinkClosedError):
        DeviceSide(T0).heartbeat({}, T0)


# ---- idempotency by command id ----

def reply(cid: str) -> p.Reply:
    return p.Reply(id=cid, ok=True, payload={"n": cid})


def test_a_repeated_command_id_gets_the_first_reply_and_is_counted():
    memory = ReplyMemory(2)
    assert memory.repeat("a") is None and memory.duplicates == 0
    memory.remember("a", reply("a"))
    assert memory.repeat("a") == reply("a") and memory.duplicates == 1
    assert memory.stored("a") == reply("a") and memory.duplicates == 1  # looking is not a repeat


def test_the_reply_memory_is_bounded_and_a_repeat_counts_as_use():
    memory = ReplyMemory(2)
    memory.remember("a", reply("a"))
    memory.remember("b", reply("b"))
    memory.repeat("a")  # a is now the newest
    memory.remember("c", reply("c"))
    assert len(memory) == 2 and memory.stored("b") is None and memory.stored("a") == reply("a")
    memory.forget()
    assert len(memory) == 0 and memory.repeat("a") is None
    with pytest.raises(ValueError):
        ReplyMemory(0)
