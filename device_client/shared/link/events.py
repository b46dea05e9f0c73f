"""What a side of the link (hubside.py, deviceside.py) returns from ``receive`` and ``tick``."""

from __future__ import annotations

from dataclasses import dataclass

from .. import protocol as p


@dataclass(frozen=True)
class HelloReceived:
    """hub: the device's hello, version checked; the link is open."""
    hello: p.Hello


@dataclass(frozen=True)
class WelcomeReceived:
    """device: the hub accepted the hello; heartbeats are scheduled from now."""
    welcome: p.Welcome


@dataclass(frozen=True)
class CommandReceived:
    """device: a command to run."""
    command: p.Command


@dataclass(frozen=True)
class ReplyReceived:
    """hub: the answer to a command."""
    reply: p.Reply


@dataclass(frozen=True)
class HeartbeatReceived:
    """hub: a heartbeat event."""
    event: p.Event


@dataclass(frozen=True)
class EventReceived:
    """hub: any event other than a heartbeat."""
    event: p.Event


@dataclass(frozen=True)
class HeartbeatDue:
    """device: time to send a heartbeat (``DeviceSide.heartbeat``)."""


@dataclass(frozen=True)
class Ignored:
    """device: a frame that is not for it (undecodable, or of a type only the hub takes); logged."""
    why: str
    undecodable: bool = False


@dataclass(frozen=True)
class ProtocolViolation:
    """hub: the link must be closed with ``code`` and ``reason`` (already within 123 bytes). For a
    frame over the limit (1009) ``frame`` names it and ``size`` is its size in bytes."""
    code: int
    reason: str
    frame: str = ""
    size: int = 0


@dataclass(frozen=True)
class LinkFailed:
    """device: the hub answered, but not with a usable link (no welcome in time, another frame first)."""
    why: str
