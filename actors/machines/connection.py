"""The device connection machine: is the device reachable, and why did it last boot.

Pure: no trio, storage or quart. Time comes in as ``now`` (aware UTC); ``next_deadline()`` tells the
actor when to wake it with ``Tick``. Links are identified by ``conn_id`` so that when a device
reconnects before its old socket is noticed dead, the newest connection wins and the old one's
``LinkDown`` changes nothing.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Conn(Enum):
    OFFLINE = "offline"          #: no link to the device
    ONLINE = "online"            #: link up, hello received, heartbeats arriving
    REBOOTING = "rebooting"      #: the device accepted a reboot; waiting for it to come back
    MAINTENANCE = "maintenance"  #: link up, but the device reports it is in maintenance (test boot)


# -- events -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinkUp:
    conn_id: str
    boot_reason: str
    facts: dict[str, Any] = field(default_factory=dict)  # firmware, architecture, tunnel key, ...
    maintenance: bool = False


@dataclass(frozen=True)
class LinkDown:
    conn_id: str


@dataclass(frozen=True)
class Heartbeat:
    conn_id: str


@dataclass(frozen=True)
class RebootRequested:
    command_id: str


@dataclass(frozen=True)
class CommandSucceeded:
    command_id: str


@dataclass(frozen=True)
class CommandFailed:
    command_id: str


@dataclass(frozen=True)
class Tick:
    """The deadline from ``next_deadline()`` passed."""


# -- effects ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Persist:
    """Write the presence row (coalesced, written behind)."""
    state: Conn
    online: bool
    boot_reason: str | None
    last_seen_at: dt.datetime | None
    connected_at: dt.datetime | None = None
    facts: dict[str, Any] | None = None


@dataclass(frozen=True)
class Publish:
    """Tell event subscribers (SSE) about a change."""
    kind: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class SendCommand:
    command_id: str
    verb: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class DropLink:
    """Close a link the hub considers dead (no heartbeat)."""
    conn_id: str


class IllegalTransition(Exception):
    def __init__(self, state: Conn, event: object) -> None:
        super().__init__(f"{type(event).__name__} is not allowed in state {state.value}")
        self.state, self.event = state, event


class NotConnected(IllegalTransition):
    """A command was asked of a device with no link."""


_UP = (Conn.ONLINE, Conn.MAINTENANCE)

# Which events each state accepts. Events absent from a state's row are illegal there.
TRANSITIONS: dict[Conn, dict[type, str]] = {
    Conn.OFFLINE: {LinkUp: "_link_up", LinkDown: "_ignore", Heartbeat: "_ignore", Tick: "_ignore",
                   CommandFailed: "_command_failed", CommandSucceeded: "_ignore"},
    Conn.ONLINE: {LinkUp: "_link_up", LinkDown: "_link_down", Heartbeat: "_heartbeat", Tick: "_tick",
                  RebootRequested: "_reboot", CommandSucceeded: "_command_succeeded",
                  CommandFailed: "_command_failed"},
    Conn.MAINTENANCE: {LinkUp: "_link_up", LinkDown: "_link_down", Heartbeat: "_heartbeat", Tick: "_tick",
                       RebootRequested: "_reboot", CommandSucceeded: "_command_succeeded",
                       CommandFailed: "_command_failed"},
    Conn.REBOOTING: {LinkUp: "_link_up", LinkDown: "_ignore", Heartbeat: "_ignore", Tick: "_tick",
                     CommandSucceeded: "_ignore", CommandFailed: "_ignore"},
}


class ConnectionMachine:
    def __init__(self, *, heartbeat_timeout: float, reboot_timeout: float,
                 state: Conn = Conn.OFFLINE, boot_reason: str | None = None,
                 last_seen_at: dt.datetime | None = None) -> None:
        self.heartbeat_timeout = dt.timedelta(seconds=heartbeat_timeout)
        self.reboot_timeout = dt.timedelta(seconds=reboot_timeout)
        self.state = state
        self.boot_reason = boot_reason
        self.last_seen_at = last_seen_at
        self.connected_at: dt.datetime | None = None
        self.conn_id: str | None = None
        self.reboot_pending: str | None = None  # command id of a reboot sent, not yet acknowledged
        self.rebooting_since: dt.datetime | None = None

    @property
    def online(self) -> bool:
        return self.state in _UP

    def handle(self, event: object, now: dt.datetime) -> list[object]:
        method = TRANSITIONS[self.state].get(type(event))
        if method is None:
            if isinstance(event, RebootRequested):
                raise NotConnected(self.state, event)
            raise IllegalTransition(self.state, event)
        return getattr(self, method)(event, now)

    def next_deadline(self) -> dt.datetime | None:
        if self.state in _UP and self.last_seen_at is not None:
            return self.last_seen_at + self.heartbeat_timeout
        if self.state is Conn.REBOOTING and self.rebooting_since is not None:
            return self.rebooting_since + self.reboot_timeout
        return None

    # -- transitions (each computes effects, then commits) -------------------------------------
    def _persist(self, facts: dict[str, Any] | None = None) -> Persist:
        return Persist(self.state, self.online, self.boot_reason, self.last_seen_at, self.connected_at, facts)

    def _publish(self) -> Publish:
        return Publish("device.state", {"state": self.state.value, "online": self.online,
                                        "bootReason": self.boot_reason})

    def _ignore(self, event: object, now: dt.datetime) -> list[object]:
        return []

    def _link_up(self, event: LinkUp, now: dt.datetime) -> list[object]:
        effects: list[object] = []
        if self.conn_id is not None and self.conn_id != event.conn_id and self.state in _UP:
            effects.append(DropLink(self.conn_id))  # the newest connection wins
        self.conn_id = event.conn_id
        self.state = Conn.MAINTENANCE if event.maintenance else Conn.ONLINE
        self.boot_reason = event.boot_reason
        self.last_seen_at = self.connected_at = now
        self.reboot_pending = None
        self.rebooting_since = None
        return [*effects, self._persist(event.facts), self._publish()]

    def _link_down(self, event: LinkDown, now: dt.datetime) -> list[object]:
        if event.conn_id != self.conn_id:
            return []  # an older link closing after a newer one took over
        self.conn_id = None
        if self.reboot_pending is not None:
            # The device dropped the link while its reboot reply was in flight: it is rebooting.
            self.state, self.rebooting_since, self.reboot_pending = Conn.REBOOTING, now, None
        else:
            self.state = Conn.OFFLINE
        return [self._persist(), self._publish()]

    def _heartbeat(self, event: Heartbeat, now: dt.datetime) -> list[object]:
        if event.conn_id != self.conn_id:
            return []
        self.last_seen_at = now
        return [self._persist()]

    def _tick(self, event: Tick, now: dt.datetime) -> list[object]:
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return []
        effects: list[object] = [DropLink(self.conn_id)] if self.conn_id else []
        self.state, self.conn_id, self.rebooting_since, self.reboot_pending = Conn.OFFLINE, None, None, None
        return [*effects, self._persist(), self._publish()]

    def _reboot(self, event: RebootRequested, now: dt.datetime) -> list[object]:
        self.reboot_pending = event.command_id
        return [SendCommand(event.command_id, "reboot", {})]

    def _command_succeeded(self, event: CommandSucceeded, now: dt.datetime) -> list[object]:
        if event.command_id != self.reboot_pending:
            return []
        self.state, self.rebooting_since, self.reboot_pending = Conn.REBOOTING, now, None
        return [self._persist(), self._publish()]

    def _command_failed(self, event: CommandFailed, now: dt.datetime) -> list[object]:
        if event.command_id == self.reboot_pending:
            self.reboot_pending = None
        return []
