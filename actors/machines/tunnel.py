"""The tunnel session machine: one session from the grant handed to the device until it ends.

Pure: no trio, no storage. Time comes in as ``now``; ``next_deadline()`` is the instant the current
grant expires, when the actor feeds ``Tick``. A session not renewed by then is over: the device
closes it on its own (it checks the grant), and the hub stops counting it.

    OPENING --Answered--> OPEN --Renewed--> OPEN
       |                   |
       |                   +--CloseRequested--> CLOSING --CloseDone--> CLOSED
       +--Refused--> FAILED                        |
    OPENING/OPEN/CLOSING --DeviceEnded (final usage)--> CLOSED
    OPENING/OPEN --Tick at or after expiry--> CLOSED (reason "expired")
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import Enum


class State(Enum):
    OPENING = "opening"  #: grant sent with cmd.<device>.tunnel.open; waiting for the device's answer
    OPEN = "open"        #: the device answered with its SDP; the session lives until its grant expires
    CLOSING = "closing"  #: its principal closed it; cmd.<device>.tunnel.close sent, waiting for the device
    CLOSED = "closed"    #: over (closed, device ended it, or expired); final
    FAILED = "failed"    #: the device refused or never answered the open; final


FINAL = (State.CLOSED, State.FAILED)


class IllegalTransition(Exception):
    def __init__(self, state: State, event: object) -> None:
        super().__init__(f"{type(event).__name__} in state {state.value}")
        self.state, self.event = state, event


# -- events -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Answered:
    """The device accepted the grant and answered the offer."""


@dataclass(frozen=True)
class Refused:
    """The device refused the open, or never answered."""
    reason: str


@dataclass(frozen=True)
class Renewed:
    expires_at: dt.datetime


@dataclass(frozen=True)
class CloseRequested:
    reason: str


@dataclass(frozen=True)
class CloseDone:
    """The device answered tunnel.close, or could not be reached: the hub forgets the session either way."""


@dataclass(frozen=True)
class DeviceEnded:
    """The device's final tunnel.usage: it dropped the session."""
    reason: str


@dataclass(frozen=True)
class Tick:
    """The deadline from ``next_deadline()`` passed."""


# -- effects ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MarkOpen:
    """Store state open."""


@dataclass(frozen=True)
class Extend:
    """Store the renewed grant's window."""
    expires_at: dt.datetime


@dataclass(frozen=True)
class SendClose:
    """Send cmd.<device>.tunnel.close."""
    reason: str


@dataclass(frozen=True)
class Finish:
    """Store the end (state, reason, duration at least as long as the hub saw it open) and meter it."""
    state: State
    reason: str


@dataclass(frozen=True)
class NotifyClosed:
    """Push {type: closed, reason} to the session's signalling sockets."""
    reason: str


@dataclass(frozen=True)
class Stop:
    """The session is over: its actor ends."""


TRANSITIONS: dict[State, dict[type, State]] = {
    State.OPENING: {Answered: State.OPEN, Refused: State.FAILED, CloseRequested: State.CLOSING,
                    DeviceEnded: State.CLOSED, Tick: State.CLOSED},
    State.OPEN: {Renewed: State.OPEN, CloseRequested: State.CLOSING, DeviceEnded: State.CLOSED,
                 Tick: State.CLOSED},
    State.CLOSING: {CloseDone: State.CLOSED, DeviceEnded: State.CLOSED, Tick: State.CLOSING},
    # A close the device confirms after its final usage event already ended the session changes nothing.
    State.CLOSED: {CloseDone: State.CLOSED, DeviceEnded: State.CLOSED, Tick: State.CLOSED},
    State.FAILED: {Tick: State.FAILED},
}


class TunnelMachine:
    def __init__(self, expires_at: dt.datetime, state: State = State.OPENING) -> None:
        self.state = state
        self.expires_at = expires_at
        self.close_reason: str | None = None

    def handle(self, event: object, now: dt.datetime) -> list[object]:
        new = TRANSITIONS[self.state].get(type(event))
        if new is None:
            raise IllegalTransition(self.state, event)  # state unchanged
        old = self.state
        effects: list[object] = []
        if isinstance(event, Tick):
            if old not in (State.OPENING, State.OPEN) or now < self.expires_at:
                return []
            effects = [Finish(State.CLOSED, "expired"), NotifyClosed("expired"), Stop()]
            self.close_reason = "expired"
        elif isinstance(event, Answered):
            effects = [MarkOpen()]
        elif isinstance(event, Refused):
            effects = [Finish(State.FAILED, event.reason), Stop()]
            self.close_reason = event.reason
        elif isinstance(event, Renewed):
            if event.expires_at <= self.expires_at:
                raise IllegalTransition(self.state, event)  # a renewal never shortens the session
            self.expires_at = event.expires_at
            effects = [Extend(event.expires_at)]
        elif isinstance(event, CloseRequested):
            effects = [SendClose(event.reason)]
            self.close_reason = event.reason
        elif isinstance(event, (CloseDone, DeviceEnded)):
            if old in FINAL:
                return []
            reason = self.close_reason or getattr(event, "reason", None) or "closed"
            self.close_reason = reason
            effects = [Finish(State.CLOSED, reason), NotifyClosed(reason), Stop()]
        self.state = new
        return effects

    def next_deadline(self) -> dt.datetime | None:
        return self.expires_at if self.state in (State.OPENING, State.OPEN) else None
