"""The one writer of server-sent event frames (hub/events.py ``sse_frame``) and its users: no event
name with a line break is ever written, and every line of data is its own ``data:`` line, so nothing
a device, a tenant or an upstream model says can forge a field or an event in a stream."""

from __future__ import annotations

import pytest

from hub.api.sse import _frame_or_skip, sse
from hub.assistant import stream as assistant_stream
from hub.events import UnsafeEventName, sse_frame


def parse(frames: bytes) -> list[dict]:
    """A reader of the SSE grammar (WHATWG): lines end with CRLF, LF or CR; a blank line ends an event."""
    events, current = [], {"event": None, "data": []}
    for line in frames.decode().replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line == "":
            if current["data"] or current["event"]:
                events.append({"event": current["event"], "data": "\n".join(current["data"])})
            current = {"event": None, "data": []}
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            current["event"] = value
        elif field == "data":
            current["data"].append(value)
    return events


@pytest.mark.parametrize("name", ["x\nevent: device.state", "x\r\ndata: forged", "x\rid: 9", "\n", "a\r"])
def test_an_event_name_with_a_line_break_is_refused(name):
    with pytest.raises(UnsafeEventName):
        sse_frame("{}", event=name)


@pytest.mark.parametrize("data", ["one", "two\nlines", "cr\ronly", "crlf\r\nhere", "\n\nevent: forged\ndata: x\n\n",
                                  "", "trailing\n"])
def test_every_line_of_data_is_framed_and_read_back_whole(data):
    frame = sse_frame(data, event="device.state")
    lines = frame.decode().split("\n")
    assert lines[-2:] == ["", ""]  # ends with exactly one blank line
    assert all(line.startswith(("event: ", "data: ")) for line in lines[:-2]), lines
    assert b"\r" not in frame
    # a reader sees one event with the data exactly as given (line ends normalised to LF)
    expected = data.replace("\r\n", "\n").replace("\r", "\n")
    assert parse(frame) == [{"event": "device.state", "data": expected}]


def test_a_device_event_record_cannot_forge_an_event():
    forged = {"kind": "device.x\nevent: device.state", "deviceId": "d", "payload": {}}
    with pytest.raises(UnsafeEventName):
        sse(forged)
    assert _frame_or_skip(forged) == b""  # left out of the stream, logged, never written raw
    ok = {"kind": "device.files.result", "deviceId": "d", "payload": {"text": "a\nevent: forged"}}
    assert [e["event"] for e in parse(sse(ok))] == ["device.files.result"]


def test_the_assistant_stream_frames_through_the_same_writer():
    assert assistant_stream.DONE == b"data: [DONE]\n\n"
    assert parse(assistant_stream.raw('{"a":1}\r\nevent: forged\ndata: {"b":2}')) == [
        {"event": None, "data": '{"a":1}\nevent: forged\ndata: {"b":2}'}]
    assert parse(assistant_stream.event({"text": "a\nb"})) == [{"event": None, "data": '{"text":"a\\nb"}'}]
