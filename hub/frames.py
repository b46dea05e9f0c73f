"""The device link's frame limit on the hub's side: refuse a frame that is too big, say why, count it.

hypercorn itself closes a connection whose message passes ``HARD_CAP`` (1009, no reason, before our
handler sees it: hub/server.py); below that, ``receive`` measures every frame against the link's
``MAX_FRAME_BYTES`` (device_client/protocol.py) and refuses a bigger one by closing with 1009 and a
reason that names the frame and both sizes, so the device learns what was refused and can trim or
drop it (device_client/agent.py) instead of sending it again. Refusals are counted per device for
/metrics and the device's diagnosis (since this process started).
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from dataclasses import dataclass

from device_client import protocol as p

MAX_FRAME_BYTES = p.MAX_FRAME_BYTES
# What hypercorn buffers at most before closing on its own: room to read, measure and name a frame
# that is too big, without buffering without bound for a broken or hostile peer.
HARD_CAP = 4 * MAX_FRAME_BYTES
# Devices with their own refused-frames series on /metrics; past this many, refusals still count in
# the total and in each device's diagnosis.
LABELLED_DEVICES = 1000
_KIND = re.compile(r'"type"\s*:\s*"([a-z]{1,16})"(?:.{0,200}?"kind"\s*:\s*"([a-z0-9_.]{1,64})")?', re.S)


class FrameRefused(Exception):
    """The link was closed because the device sent a frame over the limit."""


@dataclass
class Refusals:
    count: int = 0
    last_at: dt.datetime | None = None
    last_frame: str = ""
    last_bytes: int = 0


def frame_size(message: str | bytes) -> int:
    if isinstance(message, bytes):
        return len(message)
    # a character is at most 4 bytes in UTF-8: only a frame that might be too big is encoded
    return len(message) if len(message) * 4 <= MAX_FRAME_BYTES else len(message.encode())


def what(message: str | bytes) -> str:
    """``event memtest.result``: from the frame's first bytes, without parsing the whole of it."""
    head = message[:400] if isinstance(message, str) else message[:400].decode(errors="replace")
    m = _KIND.search(head)
    if m is None:
        return "frame"
    return f"{m.group(1)} {m.group(2)}" if m.group(2) else m.group(1)


def reason(frame: str, size: int) -> str:
    # a close reason is at most 123 bytes
    return f"{frame} frame of {size} bytes is over the limit of {MAX_FRAME_BYTES} bytes"[:123]


async def receive(services, ws, device_id: uuid.UUID) -> str | bytes:
    """The next frame of the link; a frame over the limit closes it (1009) and raises FrameRefused."""
    message = await ws.receive()
    size = frame_size(message)
    if size <= MAX_FRAME_BYTES:
        return message
    frame = what(message)
    del message
    services.metrics.frame_refused(device_id, frame, size, services.clock.now())
    await ws.close(p.CLOSE_TOO_BIG, reason(frame, size))
    raise FrameRefused(reason(frame, size))
