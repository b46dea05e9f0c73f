"""The device's end of one link, without IO.

    AWAIT_WELCOME --welcome--> OPEN --closed()--> CLOSED
         |  no welcome by the deadline, another frame first: LinkFailed, CLOSED
    OPEN: a command -> CommandReceived; anything else (undecodable, a frame only the hub takes) ->
          Ignored, the link stays up; at each ``deadline()`` ``tick`` says HeartbeatDue (and so does
          ``receive`` when a heartbeat is due: a busy link must not starve its heartbeats)

Heartbeats keep a fixed schedule from the welcome (interval after interval, never drifting by the
time a send takes; after a stall the next is due at once, then the schedule resumes from then),
at least ``MIN_HEARTBEAT`` apart whatever the hub says.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from .. import protocol as p
from .events import CommandReceived, HeartbeatDue, Ignored, LinkFailed, WelcomeReceived
from .hubside import LinkClosedError

HANDSHAKE_TIMEOUT = 10.0
MIN_HEARTBEAT = 0.05  # a hub sending 0 must not turn the agent into a busy loop


class DeviceState(Enum):
    AWAIT_WELCOME = "await_welcome"
    OPEN = "open"
    CLOSED = "closed"


class DeviceSide:
    def __init__(self, now: float, *, handshake_timeout: float = HANDSHAKE_TIMEOUT) -> None:
        """The hello has been sent at ``now`` (its text comes from linkframes.FrameGuard, which keeps
        it within the hub's limit)."""
        self.state = DeviceState.AWAIT_WELCOME
        self.handshake_timeout = handshake_timeout
        self._welcome_by = now + handshake_timeout
        self.interval: float | None = None
        self._next_heartbeat: float | None = None

    def deadline(self) -> float | None:
        if self.state is DeviceState.AWAIT_WELCOME:
            return self._welcome_by
        if self.state is DeviceState.OPEN:
            return self._next_heartbeat
        return None

    def tick(self, now: float) -> list[object]:
        if self.state is DeviceState.AWAIT_WELCOME and now >= self._welcome_by:
            return [self._fail(f"no welcome within {self.handshake_timeout:g}s")]
        if self.state is DeviceState.OPEN and now >= self._next_heartbeat:  # type: ignore[operator]
            return [HeartbeatDue()]
        return []

    def receive(self, message: str | bytes, now: float) -> list[object]:
        if self.state is DeviceState.CLOSED:
            raise LinkClosedError("a frame received after the link was closed")
        if self.state is DeviceState.AWAIT_WELCOME:
            if now >= self._welcome_by:
                return self.tick(now)
            try:
                frame = p.decode(message)
            except p.ProtocolError as exc:
                return [self._fail(f"the hub's first frame is not a welcome: {exc}")]
            if not isinstance(frame, p.Welcome):
                return [self._fail(f"expected a welcome, the hub sent {frame.type!r}")]
            self.state = DeviceState.OPEN
            self.interval = max(frame.heartbeatInterval, MIN_HEARTBEAT)
            self._next_heartbeat = now + self.interval
            return [WelcomeReceived(frame)]
        try:
            frame = p.decode(message)
        except p.ProtocolError as exc:
            return self.tick(now) + [Ignored(f"an undecodable frame: {exc}", undecodable=True)]
        if isinstance(frame, p.Command):
            return self.tick(now) + [CommandReceived(frame)]
        return self.tick(now) + [Ignored(f"a {frame.type} frame")]

    def heartbeat(self, payload: dict[str, Any], now: float) -> str:
        """The heartbeat's text; the next one is due an interval after this one was due (or after
        ``now``, when the link stalled past it)."""
        if self.state is not DeviceState.OPEN:
            raise LinkClosedError(f"no heartbeat on a link that is {self.state.value}")
        self._next_heartbeat = max(self._next_heartbeat + self.interval, now)  # type: ignore[operator]
        return p.encode(p.Event(kind="heartbeat", payload=payload))

    def closed(self) -> None:
        """The socket closed (either end): nothing more comes or goes."""
        self.state = DeviceState.CLOSED

    def _fail(self, why: str) -> LinkFailed:
        self.state = DeviceState.CLOSED
        return LinkFailed(why)
