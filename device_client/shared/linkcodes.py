"""How the device link ends: the close codes either side uses, what a device does after each, and
the reason text that comes with them.

Each cause has its own code, so a device (and the person reading its log) can tell a link that was
taken over by another holder of its token from one the hub dropped for silence or one refused for a
bad frame. 4000-4999 are the application's (RFC 6455 section 7.4.2); 1001, 1009 and 1011 are RFC 6455's own.
The table is rendered into docs/device-protocol.md (device_client/shared/protocol_schema.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum

# Protocol versions this code speaks. A hello without ``protocol`` is version 1 (every agent before
# versions existed); a hello naming another version is closed with UNKNOWN_VERSION.
SUPPORTED_VERSIONS = (1,)
REASON_MAX_BYTES = 123  # RFC 6455: a close frame's reason is at most 123 bytes of UTF-8

# After SUPERSEDED a device waits at least this long (plus jitter) before it connects again: a
# second holder of the same token must not knock the first off in a tight loop.
SUPERSEDED_BACKOFF = 30.0

# 4004's reason states the drain window; a device that cannot read it uses this (docs/device-protocol.md).
DRAIN_WINDOW_DEFAULT = 10.0
_DRAIN_WINDOW = re.compile(r"reconnect within (\d+(?:\.\d+)?) s")


def draining_reason(window: float) -> str:
    """The reason of a 4004 close: what the hub says and ``drain_window`` reads back."""
    return f"the hub is shutting down; reconnect within {window:.0f} s"


def drain_window(reason: str | None) -> float:
    """The window a 4004 reason states, else the default; never more than an hour."""
    found = _DRAIN_WINDOW.search(reason or "")
    return min(float(found.group(1)), 3600.0) if found else DRAIN_WINDOW_DEFAULT


class Close(IntEnum):
    GOING_AWAY = 1001  #: the device leaves (drained, shutting down)
    TOO_BIG = 1009  #: a frame over the receiver's limit
    INTERNAL_ERROR = 1011  #: the hub could not serve the link (its database unreachable, an error of its own)
    SUPERSEDED = 4001  #: a newer connection with this device's token took over
    HEARTBEAT_TIMEOUT = 4002  #: no heartbeat for 3 intervals
    CREDENTIAL_REVOKED = 4003  #: the device's token was revoked or the device removed
    DRAINING = 4004  #: the hub is shutting down
    BAD_FRAME = 4400  #: not JSON, not a frame, a field of the wrong type, a value the hub cannot store
    HELLO_TIMEOUT = 4408  #: no hello within 10 s of the handshake
    OUT_OF_ORDER = 4409  #: a frame that cannot come now (a second hello, a command or welcome from the device)
    UNKNOWN_VERSION = 4426  #: the hello's protocol version is not one the hub speaks


@dataclass(frozen=True)
class CloseRule:
    code: Close
    by: str  # "hub", "device" or "either"
    meaning: str
    device_should: str


CLOSE_RULES: tuple[CloseRule, ...] = (
    CloseRule(Close.GOING_AWAY, "device", "the device leaves on purpose (after link.drain, at shutdown)",
              "(sender)"),
    CloseRule(Close.TOO_BIG, "either", "a frame was over the receiver's limit; the reason names the frame",
              "never send that frame again: trim it or drop it, then reconnect with backoff"),
    CloseRule(Close.INTERNAL_ERROR, "hub", "the hub could not serve this link now (its database was not reachable, "
              "or an error of its own); the reason says which", "reconnect with backoff"),
    CloseRule(Close.SUPERSEDED, "hub", "another connection with this device's token took over",
              f"wait at least {SUPERSEDED_BACKOFF:.0f} s (plus jitter) before reconnecting; if it happens "
              "again, two devices share one token: tell the operator"),
    CloseRule(Close.HEARTBEAT_TIMEOUT, "hub", "no heartbeat for 3 heartbeat intervals",
              "reconnect with backoff; check the heartbeat schedule"),
    CloseRule(Close.CREDENTIAL_REVOKED, "hub", "the token was revoked or the device removed",
              "stop using the token; reconnect only with the slowest backoff (the handshake will be 401)"),
    CloseRule(Close.DRAINING, "hub", "the hub is shutting down (devices that did not leave on link.drain)",
              "reconnect at a random moment within the drain window"),
    CloseRule(Close.BAD_FRAME, "hub", "a frame the hub could not take; the reason names the field",
              "fix or drop that frame, then reconnect with backoff"),
    CloseRule(Close.HELLO_TIMEOUT, "hub", "no hello within 10 s", "send the hello first, at once"),
    CloseRule(Close.OUT_OF_ORDER, "hub", "a frame that cannot come now; the reason names it",
              "reconnect with backoff and send hello only once per link"),
    CloseRule(Close.UNKNOWN_VERSION, "hub", "the hello's protocol version is not supported; the reason lists "
              "the supported ones", "reconnect with a supported version, or with the slowest backoff"),
)


def bounded_reason(text: str, limit: int = REASON_MAX_BYTES) -> str:
    """``text`` within a close frame's ``limit`` bytes: cut at a word boundary with an ellipsis, never
    in the middle of a word or of a UTF-8 sequence."""
    if len(text.encode()) <= limit:
        return text
    room = limit - len("…".encode())
    cut = text.encode()[:room].decode(errors="ignore")
    space = cut.rfind(" ")
    if space > room // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.") + "…"
