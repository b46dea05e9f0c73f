"""The device link's frame limit on the hub's side: how big, and the count of refusals.

hypercorn itself closes a connection whose message passes ``HARD_CAP`` (1009, no reason, before our
handler sees it: hub/server.py); below that, the link's protocol (device_client/shared/link/hubside.py)
measures every frame against ``MAX_FRAME_BYTES`` and refuses a bigger one with 1009 and a reason
that names the frame and both sizes, so the device learns what was refused and can trim or drop it
(device_client/linkframes.py) instead of sending it again. Refusals are counted per device for
/metrics and the device's diagnosis (since this process started; hub/metrics.py).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from device_client.shared import protocol as p

MAX_FRAME_BYTES = p.MAX_FRAME_BYTES
# What hypercorn buffers at most before closing on its own: room to read, measure and name a frame
# that is too big, without buffering without bound for a broken or hostile peer.
HARD_CAP = 4 * MAX_FRAME_BYTES
# Devices with their own refused-frames series on /metrics; past this many, refusals still count in
# the total and in each device's diagnosis.
LABELLED_DEVICES = 1000


@dataclass
class Refusals:
    count: int = 0
    last_at: dt.datetime | None = None
    last_frame: str = ""
    last_bytes: int = 0
