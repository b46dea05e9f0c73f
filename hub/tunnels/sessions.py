"""The tunnel session actors and the service that owns them.

Each session is a TunnelActor (actors/runtime.py) around the pure TunnelMachine
(actors/machines/tunnel.py), keyed ("tunnel", sid) in the Registry. It alone talks to the device
about its session, through the device's actor (``Send``, so the command travels the bus as
``cmd.<device_id>.tunnel.<verb>``), stores what the machine decides, meters the session's usage when
it ends and tells the session's signalling sockets it closed. After a hub restart an actor rebuilds
from its row; ``TunnelService.resume`` restarts the actors of sessions still open so their expiry
fires, and closes those whose grant expired while the hub was down.

Device refusals map to the spec's tunnel error codes (``device_failure``): target_not_configured,
ssh_disabled and device_unsupported are 409 (an agent without the tunnel verbs answers
unknown_command: device_unsupported too); any other refusal is 502 device_rejected with the device's
reason; an offline device, no answer in time or an unreachable device actor is 504
device_unreachable.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import trio

from actors.device import Send
from actors.machines import tunnel as tm
from actors.runtime import Actor, ActorError, Reply
from hub.errors import Conflict, DeviceError, FleethubError, NotFound
from hub.tunnels.grants import GrantSigner
from hub.tunnels.tokens import TunnelTokens
from storage.db import DatabaseUnavailable
from storage.tunnels import Tunnels

if TYPE_CHECKING:
    from hub.services import Services

log = logging.getLogger("fleethub.tunnels")

DEVICE_REFUSALS = ("target_not_configured", "ssh_disabled", "device_unsupported")
# Sessions whose tunnel.usage waits for PostgreSQL to come back; past this (a device naming made-up
# sessions during an outage) reports are dropped, counted and logged.
UNRECORDED_MAX = 1000


def device_failure(exc: BaseException) -> FleethubError:
    """The tunnel error for a device command that did not succeed."""
    if isinstance(exc, DeviceError):
        if exc.code in DEVICE_REFUSALS:
            return Conflict(exc.message, code=exc.code)
        if exc.code == "unknown_command":
            return Conflict("the device's agent does not support tunnels", code="device_unsupported")
        return FleethubError(f"the device refused: {exc.message}", code="device_rejected", status=502,
                             details={"reason": exc.message, "device_code": exc.code})
    if isinstance(exc, FleethubError) and exc.code == "device_offline":
        return FleethubError("the device is not connected", code="device_unreachable", status=504)
    if isinstance(exc, FleethubError):
        return FleethubError(f"the device did not answer ({exc.message})", code="device_unreachable", status=504)
    return FleethubError("the device did not answer", code="device_unreachable", status=504)


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

    def __init__(self, sid: uuid.UUID, services: "Services") -> None:
        super().__init__(("tunnel", sid))
        self.sid = sid
        self.services = services
        self.row: dict[str, Any] = {}
        self.machine: tm.TunnelMachine | None = None
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
        except (FleethubError, ActorError, DatabaseUnavailable) as exc:
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
        elif isinstance(effect, tm.SendClose):
            self.tasks.start_soon(self._device, "close", "tunnel.close",
                                  {"sessionId": str(self.sid), "reason": effect.reason}, None)
        elif isinstance(effect, tm.Finish):
            grown = await s.tunnels.store.finish(self.sid, effect.state.value, effect.reason, s.clock.now())
            s.tunnels.meter(grown)
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


class TunnelService:
    """Built once in Services: the signing key's two uses (grants, tunnel JWTs), the repository,
    the session actors, and what the device link routes here (tunnel.usage events)."""

    def __init__(self, services: "Services") -> None:
        self.services = services
        self.grants = GrantSigner(services.signing_keys)  # the ring Services reloads after a rotation
        self.tokens = TunnelTokens(services.signing_keys)
        self.store = Tunnels(services.db)
        # tunnel.usage reports that arrived while storage was unreachable, newest totals per
        # (session, device), with the instant they arrived; one task records them when it is back.
        self._unrecorded: dict[tuple[uuid.UUID, uuid.UUID], _Usage] = {}
        self._recording = False
        self.usage_dropped = 0

    async def actor(self, sid: uuid.UUID) -> TunnelActor:
        return await self.services.registry.get(("tunnel", sid), lambda: TunnelActor(sid, self.services))

    def meter(self, grown: dict | None) -> None:
        """Meter what a session's usage grew by: minutes, direct bytes, relayed bytes."""
        if not grown:
            return
        s = self.services
        day = s.clock.now().astimezone(dt.timezone.utc).date()
        org = grown["org_id"]
        if grown["seconds"] > 0:
            s.meter.add(org, "tunnel_minutes", Decimal(grown["seconds"]) / 60, day=day)
        relayed = max(0, grown["relayed"])
        # bytesIn + bytesOut count every byte the session carried; the relayed ones are billed apart.
        direct = max(0, grown["bytes"] - relayed)
        s.meter.add(org, "tunnel_bytes", direct, day=day)
        s.meter.add(org, "tunnel_relayed_bytes", relayed, day=day)

    def audit_end(self, row: dict, operation: str, reason: str) -> None:
        """An end no HTTP request caused (expiry, the device dropping it) is audited here."""
        s = self.services
        s.audit_log.append({
            "id": uuid.uuid4(), "org_id": row["org_id"], "at": s.clock.now(), "actor_type": "system",
            "actor_id": None, "actor_user_id": None, "credential_kind": None, "method": "EVENT",
            "path": f"/v1/cli/tunnel/session/{row['id']}", "query": None, "status": 200, "request_id": str(uuid.uuid4()),
            "client_addr": None, "duration_ms": None, "action": operation, "target": None,
            "details": {"operation": operation, "sessionId": str(row["id"]), "deviceId": str(row["device_id"]),
                        "reason": reason}})

    async def on_usage(self, device_id: uuid.UUID, payload: dict[str, Any], slots: trio.Semaphore) -> None:
        """The device link's tunnel.usage event: record and meter it off the link's task. ``slots`` is
        the link's own bound on records in flight: a device flooding usage events waits here, so its
        link stops reading its socket, instead of adding tasks to the hub without end."""
        await slots.acquire()
        self.services.nursery.start_soon(self._usage_in_slot, slots, device_id, payload)

    async def _usage_in_slot(self, slots: trio.Semaphore, device_id: uuid.UUID, payload: dict[str, Any]) -> None:
        try:
            await self._usage(device_id, payload)
        finally:
            slots.release()

    async def _usage(self, device_id: uuid.UUID, payload: dict[str, Any]) -> None:
        s = self.services
        try:
            sid = uuid.UUID(str(payload.get("sessionId")))
            usage = {k: _number(payload.get(k)) for k in ("bytesIn", "bytesOut", "relayedBytes", "durationSeconds")}
        except (ValueError, TypeError):
            log.info("device %s sent a malformed tunnel.usage event", device_id)
            return
        final = bool(payload.get("final"))
        reason = str(payload.get("reason") or "closed by the device")[:200]
        report = _Usage(usage, final, reason, s.clock.now())
        try:
            grown = await self.store.record_usage(sid, device_id, usage, report.at, final=final, reason=reason)
        except DatabaseUnavailable:
            self._keep_unrecorded(sid, device_id, report)
            return
        except Exception:
            log.exception("device %s: recording tunnel usage of %s failed", device_id, sid)
            return
        self._recorded(sid, device_id, grown, final, reason)

    def usage_unrecorded(self) -> int:
        """Sessions whose usage waits for storage (for /metrics)."""
        return len(self._unrecorded)

    def _keep_unrecorded(self, sid: uuid.UUID, device_id: uuid.UUID, report: "_Usage") -> None:
        key = (sid, device_id)
        old = self._unrecorded.get(key)
        if old is None and len(self._unrecorded) >= UNRECORDED_MAX:
            self.usage_dropped += 1
            log.warning("device %s: tunnel usage of %s dropped: %d sessions already wait for storage",
                        device_id, sid, UNRECORDED_MAX)
            return
        self._unrecorded[key] = report if old is None else old.merged(report)
        if not self._recording:
            self._recording = True
            self.services.nursery.start_soon(self._record_unrecorded)

    async def _record_unrecorded(self) -> None:
        """Record what waited, once storage answers (backoff 0.1 s doubling to 5 s); totals are
        cumulative, so a report recorded twice changes nothing."""
        delay = 0.1
        try:
            while self._unrecorded:
                await trio.sleep(delay)
                for key, report in list(self._unrecorded.items()):
                    sid, device_id = key
                    try:
                        grown = await self.store.record_usage(sid, device_id, report.usage, report.at,
                                                              final=report.final, reason=report.reason)
                    except DatabaseUnavailable:
                        delay = min(delay * 2, 5.0)
                        break
                    except Exception:
                        log.exception("device %s: recording tunnel usage of %s failed", device_id, sid)
                        grown = None
                    if self._unrecorded.get(key) is report:  # else a newer report waits its turn
                        del self._unrecorded[key]
                    self._recorded(sid, device_id, grown, report.final, report.reason)
                else:
                    delay = 0.1
        finally:
            self._recording = False

    def _recorded(self, sid: uuid.UUID, device_id: uuid.UUID, grown: dict | None, final: bool, reason: str) -> None:
        s = self.services
        if grown is None:
            return  # not this device's session (or none): nothing recorded
        self.meter(grown)
        if final:
            actor = s.registry.lookup(("tunnel", sid))
            if actor is not None:
                try:
                    actor.tell(Ended(reason))
                except ActorError:
                    pass  # the actor is ending anyway
            if grown["closed"]:
                row = {"id": sid, "org_id": grown["org_id"], "device_id": device_id}
                self.audit_end(row, "tunnel.device_closed", reason)

    async def resume(self) -> None:
        """At start: restart the actors of sessions still open, so their expiry fires on time."""
        for sid in await self.store.open_ids():
            try:
                await self.actor(sid)
            except FleethubError:
                log.warning("tunnel session %s could not be resumed", sid)


@dataclass(frozen=True)
class _Usage:
    """A tunnel.usage report waiting for storage."""
    usage: dict[str, float]
    final: bool
    reason: str
    at: dt.datetime  # when it arrived: a final one closes the session then, not when storage is back

    def merged(self, newer: "_Usage") -> "_Usage":
        usage = {k: max(v, newer.usage.get(k, 0)) for k, v in self.usage.items()}
        if self.final and not newer.final:
            return _Usage(usage, True, self.reason, self.at)
        return _Usage(usage, newer.final, newer.reason, newer.at)


def _number(value: Any) -> float:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        raise ValueError("not a non-negative number")
    return value
