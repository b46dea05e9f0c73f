"""The errors an actor answers an asker with: one tree, no HTTP in it (hub/errors.py maps it).

    AskError                   the actor refused or could not do it; the asker hears, the actor goes on
    ├── Refused                the request does not fit the entity's state or rules (the asker's side)
    │   ├── Invalid            malformed for this entity (a plan the device refused)
    │   ├── NotFound           no such entity (rollout, tunnel session, device row)
    │   ├── Conflict           the state forbids it now (already rebooting, test busy, session not open)
    │   ├── Unsupported        the device cannot do this at all (no memory tester, no tunnel verbs)
    │   └── TooSoon            a rate rule; ``retry_after`` seconds
    ├── DeviceFailure          the device's side (the peer's fault, as h11 tells Local from Remote)
    │   ├── DeviceRefused      the device answered with an error (``code`` keeps the device's)
    │   ├── DeviceOffline      no link to the device (the bus has no responder)
    │   ├── DeviceTimeout      the device did not answer in time
    │   └── DeviceUnreachable  offline or silent, not told apart (tunnel sessions report it so)
    ├── BusUnavailable         the hub's own bus (NATS) cannot carry the command now: the device may be up
    └── ActorError             ours: the actor machinery itself (actors/runtime.py)
        ├── MailboxFull        the mailbox is full; the message was not queued
        ├── AskTimeout         no answer within the ask's timeout
        ├── ActorStopped       the actor stopped before it handled the message
        └── ActorCrashed       the actor crashed while handling it; it is being restarted

Every error carries ``code`` (machine-readable: the class default, or the reason the actor knows, such
as ``device_rebooting`` or the device's own code), ``message`` (for people; never a secret) and
``details`` (structured, optional). Which HTTP status and body a caller sees is the hub's decision
(``hub.errors.from_actor``), so an actor never needs to know it is behind HTTP.

Anything else an actor raises is a crash (the supervisor restarts it); ``storage.db.DatabaseUnavailable``
is the one other expected condition (actors/_runtime/actor.py).
"""

from __future__ import annotations

from typing import Any


class AskError(Exception):
    code = "internal"

    def __init__(self, message: str = "", *, code: str | None = None, details: Any = None) -> None:
        text = message or (self.__class__.__doc__ or self.code).strip()
        super().__init__(text)
        self.message = text
        if code is not None:
            self.code = code
        self.details = details


class Refused(AskError):
    """The request was refused."""
    code = "invalid_request"


class Invalid(Refused):
    """The request is invalid."""
    code = "invalid_request"


class NotFound(Refused):
    """Not found."""
    code = "not_found"


class Conflict(Refused):
    """The request conflicts with the current state."""
    code = "conflict"


class Unsupported(Refused):
    """The device does not support this."""
    code = "unsupported"


class TooSoon(Refused):
    """Too soon; try again later."""
    code = "rate_limited"

    def __init__(self, message: str = "", *, retry_after: float = 1.0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class DeviceFailure(AskError):
    """The device could not do it."""
    code = "device_error"


class DeviceRefused(DeviceFailure):
    """The device failed to handle the request."""
    code = "device_error"


class DeviceOffline(DeviceFailure):
    """The device is not connected."""
    code = "device_offline"


class DeviceTimeout(DeviceFailure):
    """The device did not answer in time."""
    code = "device_timeout"


class DeviceUnreachable(DeviceFailure):
    """The device could not be reached."""
    code = "device_unreachable"


class BusUnavailable(AskError):
    """The hub cannot reach the device's hub node now; try again shortly."""
    code = "bus_unavailable"


class ActorError(AskError):
    """The actor could not take or answer the message."""
    code = "internal"


class MailboxFull(ActorError):
    """The actor's mailbox is full; the message was not queued."""
    code = "busy"


class AskTimeout(ActorError):
    """The actor did not answer within the timeout."""
    code = "timeout"


class ActorStopped(ActorError):
    """The actor stopped before it handled the message."""


class ActorCrashed(ActorError):
    """The actor crashed while handling the message; it is being restarted."""
