"""The hub's end of one device link, without IO.

    AWAIT_HELLO --hello (supported version)--> OPEN --close / violation--> CLOSED
         |  no hello by the deadline, a bad first frame, an unknown version: ProtocolViolation, CLOSED
    OPEN: a reply -> ReplyReceived, a heartbeat -> HeartbeatReceived, other events -> EventReceived;
          a hello, welcome or command from the device -> 4409; not a frame -> 4400
    any state: a frame over ``max_frame_bytes`` -> 1009 naming the frame and both sizes

The device's silence once OPEN is the device actor's to judge (actors/machines/connection.py: 4002),
since it outlives one link; this side owns the hello's deadline only.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from .. import protocol as p
from ..linkcodes import SUPPORTED_VERSIONS, Close, bounded_reason
from .events import EventReceived, HeartbeatReceived, HelloReceived, ProtocolViolation, ReplyReceived
from .sizes import frame_size, too_big_reason, what

HELLO_TIMEOUT = 10.0


class HubState(Enum):
    AWAIT_HELLO = "await_hello"
    OPEN = "open"
    CLOSED = "closed"


class LinkClosedError(Exception):
    """A frame was fed to, or asked of, a side whose link is closed: a bug in the shell."""


class HubSide:
    def __init__(self, now: float, *, hello_timeout: float = HELLO_TIMEOUT,
                 max_frame_bytes: int = p.MAX_FRAME_BYTES) -> None:
        self.state = HubState.AWAIT_HELLO
        self.hello_timeout = hello_timeout
        self.max_frame_bytes = max_frame_bytes
        self._hello_by = now + hello_timeout
        self.close_code: int | None = None

    def deadline(self) -> float | None:
        """When ``tick`` must be called next (the hello's deadline), or None."""
        return self._hello_by if self.state is HubState.AWAIT_HELLO else None

    def tick(self, now: float) -> list[object]:
        if self.state is HubState.AWAIT_HELLO and now >= self._hello_by:
            return [self._violation(Close.HELLO_TIMEOUT, f"no hello within {self.hello_timeout:g} s")]
        return []

    def receive(self, message: str | bytes, now: float) -> list[object]:
        if self.state is HubState.CLOSED:
            raise LinkClosedError("a frame received after the link was closed")
        expired = self.tick(now)
        if expired:
            return expired
        size = frame_size(message, self.max_frame_bytes)
        if size > self.max_frame_bytes:
            frame = what(message)
            self.state, self.close_code = HubState.CLOSED, p.CLOSE_TOO_BIG
            return [ProtocolViolation(p.CLOSE_TOO_BIG, too_big_reason(frame, size, self.max_frame_bytes), frame, size)]
        first = self.state is HubState.AWAIT_HELLO
        try:
            frame = p.decode(message)
        except p.ProtocolError as exc:
            return [self._violation(Close.BAD_FRAME, f"malformed {'hello' if first else 'frame'}: {exc}")]
        if first:
            if not isinstance(frame, p.Hello):
                return [self._violation(Close.BAD_FRAME, f"the first frame must be a hello, not {p.describe(frame)}")]
            if frame.protocol not in SUPPORTED_VERSIONS:
                return [self._violation(Close.UNKNOWN_VERSION, (
                    f"hello.protocol: version {frame.protocol} is not supported; "
                    f"this hub speaks {', '.join(map(str, SUPPORTED_VERSIONS))}"))]
            self.state = HubState.OPEN
            return [HelloReceived(frame)]
        if isinstance(frame, (p.Hello, p.Welcome, p.Command)):
            return [self._violation(Close.OUT_OF_ORDER, f"unexpected {frame.type} frame on an open link")]
        if isinstance(frame, p.Reply):
            return [ReplyReceived(frame)]
        if frame.kind == "heartbeat":
            return [HeartbeatReceived(frame)]
        return [EventReceived(frame)]

    # ---- frames to send ----

    def welcome(self, **fields: Any) -> str:
        """The welcome; its ``maxFrameBytes`` is this side's limit unless given (a test hub that
        refuses below what it announces, as a stricter proxy would)."""
        self._require_open()
        fields.setdefault("maxFrameBytes", self.max_frame_bytes)
        return p.encode(p.Welcome(**fields))

    def command(self, command: p.Command) -> str:
        """The command's text; ``protocol.FrameTooLarge`` if it is over the device's limit (the
        protocol's: never sent, the device would close the link with 1009)."""
        self._require_open()
        return p.encode(command)

    def close(self, code: int, reason: str) -> ProtocolViolation:
        """The hub ends the link (superseded, revoked, draining): the code and the reason to send."""
        return self._violation(code, reason)

    def _violation(self, code: int, reason: str) -> ProtocolViolation:
        self.state, self.close_code = HubState.CLOSED, int(code)
        return ProtocolViolation(int(code), bounded_reason(reason))

    def _require_open(self) -> None:
        if self.state is not HubState.OPEN:
            raise LinkClosedError(f"cannot send on a link that is {self.state.value}")
