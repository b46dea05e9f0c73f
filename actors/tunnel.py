"""TunnelActor: one actor per tunnel session, the IO shell around the pure TunnelMachine
(actors/machines/tunnel.py), keyed ("tunnel", sid) in the Registry.

It alone talks to the device about its session, through the device's actor (``Send``, so the command
travels the bus as ``cmd.<device_id>.tunnel.<verb>``), stores what the machine decides, meters the
session's usage when it ends and tells the session's signalling sockets it closed. After a hub restart
an actor rebuilds from its row; the hub's ``TunnelService.resume`` (hub/tunnels/sessions.py) restarts
the actors of sessions still open so their expiry fires, and closes those whose grant expired while
the hub was down. What it needs of the hub (the sessions' repository, metering, the audit of ends
nobody asked for) comes in ``services.tunnels``.

PostgreSQL down (``DatabaseUnavailable``): the effects the machine decided wait in ``_undone`` and are
carried out in order from a deadline once storage answers; a renewal not stored is not done.

Device refusals become the spec's tunnel errors (``device_failure``; the hub gives them their
statuses): target_not_configured, ssh_disabled, shell_disabled and device_unsupported are conflicts (an agent without
the tunnel verbs answers unknown_command: device_unsupported too); any other refusal is
device_rejected with the device's reason; an offline device, no answer in time or an unreachable device
actor is device_unreachable.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from actors.device import Send
from actors.errors import AskError, Conflict, DeviceRefused, DeviceUnreachable, NotFound
from actors.machines import tunnel as tm
from actors.runtime import Actor, Reply
from device_client.shared.clock import rfc3339
from storage.db import DatabaseUnavailable

if TYPE_CHECKING:
    from actors.services import Services

log = logging.getLogger("fleethub.tunnels")

DEVICE_REFUSALS = ("target_not_configured", "ssh_disabled", "shell_disabled", "device_unsupported")


def device_failure(exc: BaseException) -> AskError:
    """The tunnel error for a device command that did not succeed."""
    if isinstance(exc, DeviceRefused):
        if exc.code in DEVICE_REFUSALS:
            return Conflict(exc.message, code=exc.code)
        if exc.code == "unknown_command":
            return Conflict("the device's agent does not support tunnels", code="device_unsupported")
        return DeviceRefused(f"the device refused: {exc.message}", code="device_rejected",
                             details={"reason": exc.message, "device_code": exc.code})
    if isinstance(exc, AskError) and exc.code == "device_offline":
        return DeviceUnreachable("the device is not connected")
    if isinstance(exc, AskError):
        return DeviceUnreachable(f"the device did not answer ({exc.message})")
    return DeviceUnreachable("the device did not answer")


# -- messages -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Open:
    """Ask: hand the grant to the device; answered with the device's SDP answer."""
    payload: dict[str, Any]


@dataclass(frozen=True)
class Renew:
    """Ask: the session's grant was renewed (already checked and signed); store the new window."""
    expires_at: dt.datetime
    grant_payload: dict[str, Any]


@dataclass(frozen=True)
class Close:
    """Ask: its principal closes the session; answered once the device acknowledged or could not."""
    reason: str


@dataclass(frozen=True)
class IceRestart:
    """Ask: forward an ICE-restart offer; answered with the device's answer."""
    offer: dict[str, Any]


@dataclass(frozen=True)
class Watch:
    """Ask: a receive channel that gets {type: closed, reason} when the session ends."""


@dataclass(frozen=True)
class Ended:
    """Tell: the device's final tunnel.usage (storage already holds the end)."""
    reason: str


@dataclass(frozen=True)
class _Done:
    kind: str                 # open | close | ice
    reply: Reply | None
    payload: dict[str, Any] | None
    error: BaseException | None


class TunnelActor(Actor):
    mailbox_size = 32
    # Made by on_start, which the runtime runs before anything else of the actor's (a type, not None).
    machine: tm.TunnelMachine

    def __init__(self, sid: uuid.UUID, services: "Services") -> None:
        super().__init__(("tunnel", sid))
        self.sid = sid
        self.services = services
        self.row: dict[str, Any] = {}
        self.watchers: list[trio.MemorySendChannel] = []
        self._close_replies: list[Reply] = []
        self._over = False
        # Effects the machine decided, carried out in order; one that needs storage while PostgreSQL
        # is unreachable stays here, with those after it, until a deadline carries them out.
        self._undone: list[object] = []

    async def on_start(self) -> None:
        self._undone.clear()  # a restart rebuilds from the row
        row = await self.services.tunnels.store.get(self.sid)
        if row is None:
            raise NotFound("tunnel session not found", code="not_found")
        self.row = row
        state = tm.State(row["state"]) if row["state"] in tm.State._value2member_map_ else tm.State.CLOSED
        self.machine = tm.TunnelMachine(row["expires_at"], state)
        self._over = state in tm.FINAL

    # -- messages ----------------------------------------------------------------------------
    async def receive(self, msg: Any) -> Any:
        s = self.services
        if isinstance(msg, Watch):
            send, recv = trio.open_memory_channel(4)
            if self.machine.state in tm.FINAL:
                send.send_nowait({"type": "closed", "reason": self.machine.close_reason or self.row.get("close_reason")
                                  or "closed"})
                send.close()
            else:
                self.watchers.append(send)
            return recv
        if isinstance(msg, Open):
            if self.machine.state is not tm.State.OPENING:
                raise Conflict("the session is not opening", code="conflict")
            self.tasks.start_soon(self._device, "open", "tunnel.open", msg.payload, self.defer_reply())
            return None
        if isinstance(msg, Renew):
            expires_at = self.machine.expires_at
            try:
                await self._feed(tm.Renewed(msg.expires_at))
            except tm.IllegalTransition:
                raise NotFound("the tunnel session has ended", code="not_found") from None
            try:
                await s.tunnels.store.renew(self.sid, msg.grant_payload, msg.expires_at, s.clock.now())
            except DatabaseUnavailable:
                # Not stored, so not renewed: the client gets 503 and no new grant, so the session
                # keeps its old end here too.
                self.machine.expires_at = expires_at
                raise
            return None
        if isinstance(msg, Close):
            if self.machine.state in tm.FINAL:
                raise NotFound("tunnel session not found", code="not_found")
            self._close_replies.append(self.defer_reply())
            if self.machine.state is not tm.State.CLOSING:
                await self._feed(tm.CloseRequested(msg.reason))
            return None
        if isinstance(msg, IceRestart):
            if self.machine.state is not tm.State.OPEN:
                raise Conflict("the session is not open", code="session_not_open")
            self.tasks.start_soon(self._device, "ice", "tunnel.ice_restart",
                                  {"sessionId": str(self.sid), "offer": msg.offer}, self.defer_reply())
            return None
        if isinstance(msg, Ended):
            await self._feed(tm.DeviceEnded(msg.reason))
            return None
        if isinstance(msg, _Done):
            return await self._done(msg)
        raise TypeError(f"TunnelActor does not handle {type(msg).__name__}")

    async def _done(self, msg: _Done) -> None:
        if msg.kind == "open":
            assert msg.reply is not None  # an open's and an ice's _Done carry their ask's reply
            if msg.error is None:
                try:
                    await self._feed(tm.Answered())
                except tm.IllegalTransition:
                    # Closed or expired while the device answered: the caller gets no session.
                    msg.reply.fail(NotFound("the tunnel session ended while opening", code="not_found"))
                    return
                msg.reply.set(msg.payload or {})
            else:
                error = msg.error if isinstance(msg.error, DatabaseUnavailable) else device_failure(msg.error)
                if self.machine.state is tm.State.OPENING:
                    await self._feed(tm.Refused(error.code))
                msg.reply.fail(error)
        elif msg.kind == "close":
            acknowledged = msg.error is None
            await self._feed(tm.CloseDone())
            for reply in self._close_replies:
                reply.set({"device_acknowledged": acknowledged})
            self._close_replies.clear()
        elif msg.kind == "ice":
            assert msg.reply is not None
            if msg.error is None:
                msg.reply.set(msg.payload or {})
            else:
                msg.reply.fail(msg.error if isinstance(msg.error, DatabaseUnavailable) else device_failure(msg.error))

    async def _device(self, kind: str, verb: str, payload: dict[str, Any], reply: Reply | None) -> None:
        s = self.services
        try:
            device = await s.device_actor(self.row["device_id"])
            answer = await device.ask(Send(verb, payload), timeout=s.settings.command_timeout + 5)
            done = _Done(kind, reply, answer, None)
        except (AskError, DatabaseUnavailable) as exc:
            # DatabaseUnavailable: the device's actor could not start from storage (an outage).
            done = _Done(kind, reply, None, exc)
        await self.post(done)  # the outcome must reach the machine

    # -- the machine and its effects -------------------------------------------------------------
    async def _feed(self, event: object) -> None:
        """Hand the machine ``event`` and carry out its effects. What the machine decided stands
        even while storage is unreachable: the rest of the effects wait for a deadline then."""
        self._undone.extend(self.machine.handle(event, self.services.clock.now()))
        try:
            await self._carry_out_undone()
        except DatabaseUnavailable:
            self.storage_unavailable(type(event).__name__)

    async def _carry_out_undone(self) -> None:
        while self._undone:
            await self._carry_out(self._undone[0])  # storage effects raise before any side effect
            self._undone.pop(0)

    async def _carry_out(self, effect: object) -> None:
        s = self.services
        if isinstance(effect, tm.MarkOpen):
            await s.tunnels.store.set_open(self.sid, s.clock.now())
            self._record("open")
        elif isinstance(effect, tm.SendClose):
            self.tasks.start_soon(self._device, "close", "tunnel.close",
                                  {"sessionId": str(self.sid), "reason": effect.reason}, None)
        elif isinstance(effect, tm.Finish):
            grown = await s.tunnels.store.finish(self.sid, effect.state.value, effect.reason, s.clock.now())
            s.tunnels.meter(grown)
            self._record(effect.state.value, effect.reason)
            if grown is not None and grown["closed"] and effect.state is tm.State.CLOSED and effect.reason == "expired":
                s.tunnels.audit_end(self.row, "tunnel.expire", effect.reason)
        elif isinstance(effect, tm.NotifyClosed):
            for send in self.watchers:
                try:
                    send.send_nowait({"type": "closed", "reason": effect.reason})
                except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                    pass  # a socket that stopped reading is closed anyway below
                send.close()
            self.watchers.clear()
        elif isinstance(effect, tm.Stop):
            self._over = True

    def _record(self, state: str, reason: str | None = None) -> None:
        """The session's change as an event of its device (``tunnel.session``, docs/events.md): who
        opened it and to what, never its grant or keys. The machine ends a session once, so each
        state is recorded once (an effect retried after an outage records after its write only)."""
        row = self.row
        payload = {"sessionId": str(self.sid), "state": state, "target": row["target"],
                   "principalKind": row["principal_kind"], "principalId": str(row["principal_id"])}
        if reason is not None:
            payload["reason"] = reason
        self.services.journal.record(row["org_id"], {"kind": "tunnel.session", "deviceId": str(row["device_id"]),
                                                     "at": rfc3339(self.services.clock.now()), "payload": payload})

    def next_deadline(self) -> float:
        if self._undone:
            return trio.current_time()  # the runtime holds this back while storage is unreachable
        at = self.machine.next_deadline() if self.machine else None
        return self.services.clock.deadline_for(at) if at is not None else math.inf

    async def on_deadline(self) -> None:
        await self._carry_out_undone()  # DatabaseUnavailable: the runtime retries after a backoff
        await self._feed(tm.Tick())

    def should_stop(self) -> bool:
        # Outstanding device commands (a close in flight) keep the actor until they report back.
        # handled > 0: an actor started on an ended session's row lives until the ask that started it.
        return (self._over and self.handled > 0 and not self._close_replies and not self._undone
                and len(self.tasks.child_tasks) == 0)
