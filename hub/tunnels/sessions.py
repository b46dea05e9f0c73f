"""The tunnel sessions' service: what the hub keeps for all sessions (the session actors are
actors/tunnel.py).

``TunnelService`` is built once in Services: the signing key's two uses (grants, tunnel JWTs), the
repository, the session actors by id, metering and the audit of ends no request caused, and what the
device link routes here (tunnel.usage events, recorded off the link's task and kept while PostgreSQL
is away, in an outbox: storage/behind.py, /metrics kind ``tunnel_usage``). The TunnelActor reaches
these through ``services.tunnels``.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from dataclasses import dataclass, replace
from decimal import Decimal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from actors.errors import ActorError, AskError
from actors.tunnel import Ended, TunnelActor
from device_client.shared.backoff import Backoff
from hub.tunnels.grants import GrantSigner
from hub.tunnels.tokens import TunnelTokens
from storage.behind import WriteBehind
from storage.db import DatabaseUnavailable
from storage.tunnels import Tunnels

from actors.services import Services as ActorServices

if TYPE_CHECKING:
    from hub.auth.access import Access
    from storage.db import Database


class TunnelHost(ActorServices, Protocol):
    """What the tunnel sessions use of the process: the actors' port (each session is an actor given
    it), and beside it the signing keys, the database, the audit outbox and background work."""

    @property
    def access(self) -> "Access": ...
    @property
    def db(self) -> "Database": ...
    @property
    def audit_log(self) -> WriteBehind: ...
    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> bool: ...

log = logging.getLogger("fleethub.tunnels")

# Sessions whose tunnel.usage waits for PostgreSQL to come back; past this (a device naming made-up
# sessions during an outage) new sessions' reports are dropped, counted and logged (/metrics
# fleethub_write_behind_dropped_total{kind="tunnel_usage"}).
UNRECORDED_MAX = 1000


class TunnelService:
    """Built once in Services: the signing key's two uses (grants, tunnel JWTs), the repository,
    the session actors, and what the device link routes here (tunnel.usage events)."""

    def __init__(self, services: TunnelHost) -> None:
        self.services = services
        self.grants = GrantSigner(services.access.signing_keys)  # the ring Services reloads after a rotation
        self.tokens = TunnelTokens(services.access.signing_keys)
        self.store = Tunnels(services.db)
        # tunnel.usage reports that arrived while storage was unreachable, newest totals per
        # (session, device), with the instant they arrived; one task records them when it is back.
        # Totals are cumulative, so a report recorded twice changes nothing: no batch ids. One report
        # a statement (record_usage is per session); when full the reports already kept stay.
        self.unrecorded = WriteBehind(self._record, max_batch=1, max_pending=UNRECORDED_MAX,
                                      name="unrecorded tunnel usage", merge=_Usage.merged,
                                      when_full="refuse_new")
        self._recording = False

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
        if not self.services.spawn(self._usage_in_slot, slots, device_id, payload, name="tunnel usage"):
            slots.release()  # shutting down: the device reports its totals again at its next link

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
        report = _Usage(sid, device_id, usage, final, reason, s.clock.now())
        try:
            grown = await self.store.record_usage(sid, device_id, usage, report.at, final=final, reason=reason)
        except DatabaseUnavailable:
            self._keep_unrecorded(sid, device_id, report)
            return
        except Exception:
            log.exception("device %s: recording tunnel usage of %s failed", device_id, sid)
            return
        self._recorded(sid, device_id, grown, final, reason)

    def _keep_unrecorded(self, sid: uuid.UUID, device_id: uuid.UUID, report: "_Usage") -> None:
        self.unrecorded.put((sid, device_id), report)
        if not self._recording:
            self._recording = self.services.spawn(self._record_unrecorded, name="unrecorded tunnel usage")

    async def _record_unrecorded(self) -> None:
        """Record what waited, once storage answers (backoff 0.1 s doubling to 5 s)."""
        try:
            await self.unrecorded.drain(Backoff(0.1, 5.0, jitter=False))  # one process: nothing to spread
        finally:
            self._recording = False

    async def _record(self, reports: list[_Usage]) -> None:
        for report in reports:
            grown = await self.store.record_usage(report.sid, report.device_id, report.usage, report.at,
                                                  final=report.final, reason=report.reason)
            self._recorded(report.sid, report.device_id, grown, report.final, report.reason)

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
            except AskError:
                log.warning("tunnel session %s could not be resumed", sid)


@dataclass(frozen=True)
class _Usage:
    """A tunnel.usage report waiting for storage."""
    sid: uuid.UUID
    device_id: uuid.UUID
    usage: dict[str, float]
    final: bool
    reason: str
    at: dt.datetime  # when it arrived: a final one closes the session then, not when storage is back

    def merged(self, newer: "_Usage") -> "_Usage":
        usage = {k: max(v, newer.usage.get(k, 0)) for k, v in self.usage.items()}
        if self.final and not newer.final:
            return replace(self, usage=usage)
        return replace(newer, usage=usage)


def _number(value: Any) -> float:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        raise ValueError("not a non-negative number")
    return value
