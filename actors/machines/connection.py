"""The device connection machine: is the device reachable, and why did it last boot.

Pure: no trio, storage or quart. Time comes in as ``now`` (aware UTC); ``next_deadline()`` tells the
actor when to wake it with ``Tick``. The next state comes from one table, ``TRANSITIONS[state][key]``,
where the key is the event's type refined by what the event says (``key()``: a stale link, a due
deadline, the pending reboot); the actions only compute effects. Links are identified by ``conn_id`` so that when a device
reconnects before its old socket is noticed dead, the newest connection wins and the old one's
``LinkDown`` changes nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
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

# What an event says beyond its type, read off the event and the machine's own data (which link is
# current, which reboot is pending, whether the deadline passed) — never a choice of state. A key is
# the event type alone or (type, guard), as h11 keys (Response, _SWITCH_UPGRADE).
MAINTENANCE_HELLO = "maintenance"  # LinkUp of a device in maintenance (a test boot)
STALE = "stale"                    # LinkDown/Heartbeat of a link that is not the current one
REBOOT_PENDING = "reboot_pending"  # LinkDown of the current link while a reboot reply is in flight
DUE = "due"                        # Tick at or after next_deadline()
THE_REBOOT = "the_reboot"          # CommandSucceeded/CommandFailed of the pending reboot

Key = type | tuple[type, str]

# The next state for each (state, key): the one place a state is chosen. A key absent from a state's
# row is illegal there (an event type with no key at all in the row raises; see handle()).
TRANSITIONS: dict[Conn, dict[Key, Conn]] = {
    Conn.OFFLINE: {
        LinkUp: Conn.ONLINE, (LinkUp, MAINTENANCE_HELLO): Conn.MAINTENANCE,
        (LinkDown, STALE): Conn.OFFLINE, (Heartbeat, STALE): Conn.OFFLINE, Tick: Conn.OFFLINE,
        CommandSucceeded: Conn.OFFLINE, CommandFailed: Conn.OFFLINE,
    },
    Conn.ONLINE: {
        LinkUp: Conn.ONLINE, (LinkUp, MAINTENANCE_HELLO): Conn.MAINTENANCE,
        LinkDown: Conn.OFFLINE, (LinkDown, REBOOT_PENDING): Conn.REBOOTING, (LinkDown, STALE): Conn.ONLINE,
        Heartbeat: Conn.ONLINE, (Heartbeat, STALE): Conn.ONLINE,
        Tick: Conn.ONLINE, (Tick, DUE): Conn.OFFLINE,
        RebootRequested: Conn.ONLINE,
        CommandSucceeded: Conn.ONLINE, (CommandSucceeded, THE_REBOOT): Conn.REBOOTING,
        CommandFailed: Conn.ONLINE, (CommandFailed, THE_REBOOT): Conn.ONLINE,
    },
    Conn.MAINTENANCE: {
        LinkUp: Conn.ONLINE, (LinkUp, MAINTENANCE_HELLO): Conn.MAINTENANCE,
        LinkDown: Conn.OFFLINE, (LinkDown, REBOOT_PENDING): Conn.REBOOTING, (LinkDown, STALE): Conn.MAINTENANCE,
        Heartbeat: Conn.MAINTENANCE, (Heartbeat, STALE): Conn.MAINTENANCE,
        Tick: Conn.MAINTENANCE, (Tick, DUE): Conn.OFFLINE,
        RebootRequested: Conn.MAINTENANCE,
        CommandSucceeded: Conn.MAINTENANCE, (CommandSucceeded, THE_REBOOT): Conn.REBOOTING,
        CommandFailed: Conn.MAINTENANCE, (CommandFailed, THE_REBOOT): Conn.MAINTENANCE,
    },
    Conn.REBOOTING: {
        LinkUp: Conn.ONLINE, (LinkUp, MAINTENANCE_HELLO): Conn.MAINTENANCE,
        # the old socket may still report in while the device reboots: nothing changes
        LinkDown: Conn.REBOOTING, (LinkDown, STALE): Conn.REBOOTING,
        Heartbeat: Conn.REBOOTING, (Heartbeat, STALE): Conn.REBOOTING,
        Tick: Conn.REBOOTING, (Tick, DUE): Conn.OFFLINE,
        CommandSucceeded: Conn.REBOOTING, CommandFailed: Conn.REBOOTING,
    },
}


def event_type(key: Key) -> type:
    return key[0] if isinstance(key, tuple) else key


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

    def key(self, event: object, now: dt.datetime) -> Key:
        """The event's key in TRANSITIONS: its type, refined by what it says (see the guards above)."""
        kind = type(event)
        if isinstance(event, LinkUp):
            return (LinkUp, MAINTENANCE_HELLO) if event.maintenance else LinkUp
        if isinstance(event, (LinkDown, Heartbeat)):
            if event.conn_id != self.conn_id:
                return (kind, STALE)
            if isinstance(event, LinkDown) and self.reboot_pending is not None:
                return (LinkDown, REBOOT_PENDING)
            return kind
        if isinstance(event, Tick):
            deadline = self.next_deadline()
            return (Tick, DUE) if deadline is not None and now >= deadline else Tick
        if isinstance(event, (CommandSucceeded, CommandFailed)):
            pending = self.reboot_pending is not None and event.command_id == self.reboot_pending
            return (kind, THE_REBOOT) if pending else kind
        return kind

    def handle(self, event: object, now: dt.datetime) -> list[object]:
        key = self.key(event, now)
        new = TRANSITIONS[self.state].get(key)
        if new is None:
            if isinstance(event, RebootRequested):
                raise NotConnected(self.state, event)
            raise IllegalTransition(self.state, event)
        old, self.state = self.state, new
        return _ACTIONS[event_type(key)](self, event, now, key, old)

    def next_deadline(self) -> dt.datetime | None:
        if self.state in _UP and self.last_seen_at is not None:
            return self.last_seen_at + self.heartbeat_timeout
        if self.state is Conn.REBOOTING and self.rebooting_since is not None:
            return self.rebooting_since + self.reboot_timeout
        return None

    # -- actions: the effects and data of a transition TRANSITIONS already chose ---------------
    # Each runs after the new state is set; ``old`` is the state the event found.
    def _persist(self, facts: dict[str, Any] | None = None) -> Persist:
        return Persist(self.state, self.online, self.boot_reason, self.last_seen_at, self.connected_at, facts)

    def _publish(self) -> Publish:
        return Publish("device.state", {"state": self.state.value, "online": self.online,
                                        "bootReason": self.boot_reason})

    def _link_up(self, event: LinkUp, now: dt.datetime, key: Key, old: Conn) -> list[object]:
        effects: list[object] = []
        if self.conn_id is not None and self.conn_id != event.conn_id and old in _UP:
            effects.append(DropLink(self.conn_id))  # the newest connection wins
        self.conn_id = event.conn_id
        self.boot_reason = event.boot_reason
        self.last_seen_at = self.connected_at = now
        self.reboot_pending = None
        self.rebooting_since = None
        return [*effects, self._persist(event.facts), self._publish()]

    def _link_down(self, event: LinkDown, now: dt.datetime, key: Key, old: Conn) -> list[object]:
        if self.state is old:
            return []  # an older link closing after a newer one took over, or the old socket of a reboot
        self.conn_id = None
        if key == (LinkDown, REBOOT_PENDING):
            # The device dropped the link while its reboot reply was in flight: it is rebooting.
            self.rebooting_since, self.reboot_pending = now, None
        return [self._persist(), self._publish()]

    def _heartbeat(self, event: Heartbeat, now: dt.datetime, key: Key, old: Conn) -> list[object]:
        if key != Heartbeat or self.state not in _UP:
            return []  # an old socket's heartbeat, or one arriving while the device reboots
        self.last_seen_at = now
        return [self._persist()]

    def _tick(self, event: Tick, now: dt.datetime, key: Key, old: Conn) -> list[object]:
        if key != (Tick, DUE):
            return []
        effects: list[object] = [DropLink(self.conn_id)] if self.conn_id else []
        self.conn_id, self.rebooting_since, self.reboot_pending = None, None, None
        return [*effects, self._persist(), self._publish()]

    def _reboot(self, event: RebootRequested, now: dt.datetime, key: Key, old: Conn) -> list[object]:
        self.reboot_pending = event.command_id
        return [SendCommand(event.command_id, "reboot", {})]

    def _command_succeeded(self, event: CommandSucceeded, now: dt.datetime, key: Key, old: Conn) -> list[object]:
        if key != (CommandSucceeded, THE_REBOOT):
            return []
        self.rebooting_since, self.reboot_pending = now, None
        return [self._persist(), self._publish()]

    def _command_failed(self, event: CommandFailed, now: dt.datetime, key: Key, old: Conn) -> list[object]:
        if key == (CommandFailed, THE_REBOOT):
            self.reboot_pending = None
        return []


# Each action takes its own event type: typed by what handle() calls them with.
_ACTIONS: dict[type, Callable[[ConnectionMachine, Any, dt.datetime, Key, Conn], list[object]]] = {
    LinkUp: ConnectionMachine._link_up, LinkDown: ConnectionMachine._link_down,
    Heartbeat: ConnectionMachine._heartbeat, Tick: ConnectionMachine._tick,
    RebootRequested: ConnectionMachine._reboot, CommandSucceeded: ConnectionMachine._command_succeeded,
    CommandFailed: ConnectionMachine._command_failed,
}
