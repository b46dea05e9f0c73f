"""The device link's protocol without IO, written once for both ends (DESIGN.md section 11, the
h11/wsproto way): a side object takes the text frames its socket received and the current time, and
returns events; it encodes the frames to send and says when it must be woken next (``deadline()``,
then ``tick(now)``). No sockets, no trio, no clock inside: the hub's handler (hub/api/link.py) and the
agent (device_client/agent.py) are the IO shells around it.

    hubside.HubSide       the hub's end: hello (deadline, version check), frame size, order, close codes
    deviceside.DeviceSide the device's end: welcome (deadline), commands, heartbeat schedule
    replies.ReplyMemory   a command id answered once: the device's bounded reply memory
    events                what either side returns

Close codes and reasons are device_client/shared/linkcodes.py's; the wire models device_client/shared/protocol.py's.
"""

from .deviceside import DeviceSide, DeviceState
from .events import (CommandReceived, EventReceived, HeartbeatDue, HeartbeatReceived, HelloReceived,
                     Ignored, LinkFailed, ProtocolViolation, ReplyReceived, WelcomeReceived)
from .hubside import HubSide, HubState
from .replies import ReplyMemory

__all__ = ["CommandReceived", "DeviceSide", "DeviceState", "EventReceived", "HeartbeatDue", "HeartbeatReceived",
           "HelloReceived", "HubSide", "HubState", "Ignored", "LinkFailed", "ProtocolViolation", "ReplyMemory",
           "ReplyReceived", "WelcomeReceived"]
