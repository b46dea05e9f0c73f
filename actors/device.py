"""DeviceActor: the IO shell around the connection machine for one device.

It is the only writer of the device's live state. The device link tells it LinkUp / Heartbeat /
LinkDown; REST handlers ask it for live state and for commands (reboot). Effects the machine returns
are carried out here: presence is written behind, state changes are published to the event hub,
commands go out on the bus as ``cmd.<device_id>.<verb>`` and their outcome comes back as a message.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from actors.bus import NoResponders, RequestTimeout, Unavailable
from actors.device_delivery import DeviceDelivery
from actors.errors import BusUnavailable, Conflict, DeviceFailure, DeviceOffline, DeviceTimeout
from actors.machines import connection as cm
from actors.device_memtests import MESSAGES as MEMTEST_MESSAGES
from actors.device_memtests import DeviceMemtests
from actors.runtime import Actor, ActorCrashed
from storage.db import DatabaseUnavailable
from device_client.shared.clock import rfc3339
from device_client.shared.linkcodes import Close
from device_client.shared import systemfacts
from device_client.shared.protocol import subject

if TYPE_CHECKING:
    from actors.services import Services

log = logging.getLogger("fleethub.device")


@dataclass(frozen=True)
class Reboot:
    """Ask: reboot the device; answered once the device acknowledged (or failed to)."""


@dataclass(frozen=True)
class Send:
    """Ask: send a command that does not change the connection state (ping, later memory tests'
    status reads); answered with the device's reply payload."""
    verb: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class GetLive:
    """Ask: the live connection state."""


@dataclass(frozen=True)
class DeviceEvent:
    """Tell: an event frame from the device other than a heartbeat."""
    kind: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Hello:
    """Tell: what a (re)connected device holds: secret-file digests and the applied configuration."""
    digests: dict[str, str]
    config_version_applied: str | None
    memtest: dict[str, Any] | None = None  # lastMemoryTest and retiredPages (actors/device_memtests.py)


@dataclass(frozen=True)
class SyncFiles:
    """Tell: the device's own secret files changed in storage; push what is pending."""


@dataclass(frozen=True)
class RemoveFiles:
    """Tell: remove these paths from the device (their files were deleted)."""
    paths: tuple[str, ...]


@dataclass(frozen=True)
class ApplyConfig:
    """Tell: the device was assigned a configuration version; send it if the device is online."""


@dataclass(frozen=True)
class SendPullSettings:
    """Tell: a registry login of the organisation, or the fleet's registry proxy, changed; send the device
    its version's logins and its fleet's proxy mode."""


@dataclass(frozen=True)
class _CommandDone:
    command_id: str
    ok: bool
    payload: dict[str, Any] | None
    error: Exception | None


class DeviceHooks:
    """What the rest of the hub does with a device's link and events (billing: hub/billing/devices.py),
    passed in by whoever builds the actor. This default does nothing."""

    event_kinds: frozenset[str] = frozenset()  # DeviceEvent kinds handed to ``on_event``

    async def on_link(self, org_id: uuid.UUID, device_id: uuid.UUID, facts: dict[str, Any]) -> None:
        """The device said hello (a storage job: its failure is logged, never a crash)."""

    async def on_event(self, org_id: uuid.UUID, device_id: uuid.UUID, kind: str, payload: dict[str, Any]) -> None:
        """An event of one of ``event_kinds`` (an event job, bounded per device)."""


class DeviceActor(Actor):
    mailbox_size = 128
    # Storage work a device's own events start (file and config results, billing reports) runs at most
    # this many at a time per device. Past it the actor waits for a slot, its mailbox fills and the
    # device's link stops reading its socket (hub/api/link.py): a flooding device slows itself only.
    # Only storage-only work takes a slot: work that waits for the device's answer must not, since
    # the answer is read by that same link.
    event_jobs = 4
    # An offline device's actor ends after this long without messages; the next message restarts it.
    idle_timeout = 300.0
    # Read by on_start, which the runtime runs before anything else of the actor's (types, not None).
    org_id: uuid.UUID
    machine: cm.ConnectionMachine

    def __init__(self, device_id: uuid.UUID, services: "Services", hooks: DeviceHooks | None = None) -> None:
        super().__init__(("device", device_id))
        self.device_id = device_id
        self.services = services
        self.hooks = hooks or DeviceHooks()
        self._pending: dict[str, Any] = {}  # command id -> Reply of the asker
        self._last_activity = 0.0
        self.delivery = DeviceDelivery(self)
        self.memtests = DeviceMemtests(self)
        self.facts: dict[str, Any] | None = None  # the last hello's facts
        self._active_day: Any = None  # the UTC day this device was last metered as active
        self._event_slots_made: trio.Semaphore | None = None  # made on first use (see ``_event_slots``)

    @property
    def _event_slots(self) -> trio.Semaphore:
        """Bounds the device's storage jobs for events; made on first use (an idle online device
        never needs it: about 340 bytes a device otherwise)."""
        if self._event_slots_made is None:
            self._event_slots_made = trio.Semaphore(self.event_jobs)
        return self._event_slots_made

    async def on_start(self) -> None:
        # After a crash, commands that were in flight have lost their task: answer their askers.
        for reply in self._pending.values():
            reply.fail(ActorCrashed(f"actor {self.key} restarted while a command was in flight"))
        self._pending.clear()
        self.memtests.restart()
        s = self.services
        row = await s.stores.devices.get_any(self.device_id)
        if row is None:
            raise DeviceOffline("unknown device")
        self.org_id = row["org_id"]
        # After a restart the socket (if any) is still up and will heartbeat; start from what the
        # link table says rather than from a possibly stale database row.
        link = s.links.get(self.device_id)
        stored = cm.Conn(row["state"]) if row.get("state") in cm.Conn._value2member_map_ else cm.Conn.OFFLINE
        state: cm.Conn
        if link is not None:
            state = stored if stored in (cm.Conn.MAINTENANCE, cm.Conn.ONLINE) else cm.Conn.ONLINE
        else:
            state = cm.Conn.REBOOTING if stored is cm.Conn.REBOOTING else cm.Conn.OFFLINE
        self.machine = cm.ConnectionMachine(
            heartbeat_timeout=s.settings.heartbeat_timeout, reboot_timeout=s.settings.reboot_timeout,
            state=state, boot_reason=row["boot_reason"],
            last_seen_at=s.clock.now() if link else row["last_seen_at"])
        if state is cm.Conn.REBOOTING:
            self.machine.rebooting_since = s.clock.now()
        if link is not None:
            self.machine.conn_id = link.conn_id
        self._last_activity = trio.current_time()

    # -- messages --------------------------------------------------------------------------
    async def receive(self, msg: Any) -> Any:
        facts = msg.facts if isinstance(msg, cm.LinkUp) else self.facts
        try:
            return await self._receive(msg)
        finally:
            self._fold_memtests()
            if self.facts is not facts and self.facts is not None:
                row = self._store_facts()
                if self.facts.get("workloadHeld") and not (facts or {}).get("workloadHeld"):
                    # A hold that begins is written through, not behind: a rollout reads it from this
                    # row (this actor may be on another node), and one reading inside the write-behind
                    # gap would update a device a memory test holds. The row stays queued too, so the
                    # next flush cannot put older facts back, and so that an outage (one bounded try
                    # here: the mailbox does not wait it out) loses nothing. A hold that ends can wait.
                    with contextlib.suppress(DatabaseUnavailable):
                        await self.services.stores.devices.write_presence([row])

    def _fold_memtests(self) -> None:
        """What the memory-test half knows, in the facts others read: whether a test holds the
        workload (a rollout defers the device) and what runs."""
        if self.facts is None:
            return  # no hello yet: nothing to correct
        held, running = self.memtests.workload_held, self.memtests.running
        if bool(self.facts.get("workloadHeld")) != held or self.facts.get("memoryTestRunning") != running:
            self.facts = {**self.facts, "workloadHeld": held, "memoryTestRunning": running}

    def _take_system(self, raw: Any) -> None:
        """A telemetry sample's system facts replace the hello's, read as the link reads those
        (hub/api/link.py ``_bound_facts``): what had to be cut or left out is a protocol error."""
        system, notes = systemfacts.checked(raw)
        if notes:
            self._job(self.delivery.protocol_error, "telemetry: " + "; ".join(notes))
        if system is not None and self.facts is not None:  # no hello yet: nothing to add them to
            self.facts = {**self.facts, "system": {**system, "at": rfc3339(self.services.clock.now())}}

    def _store_facts(self) -> dict[str, Any]:
        """The facts changed after the hello (a memory test holds or frees the workload): they go to
        the presence row, which is where others (a rollout) read them; no actor reads another's."""
        m = self.machine
        row = self._epoch({"id": self.device_id, "online": m.online, "state": m.state.value, "facts": self.facts})
        self.services.presence.put(self.device_id, row)
        return row

    def _to_home_node(self, msg: object) -> None:
        """In a cluster a device offline here may be linked to another node: that node's actor does it,
        told at least once (hub/cluster/tells.py). Nobody holds it: it is done at its next hello anyway."""
        if self.device_id not in self.services.links:
            self.services.topology.tell_elsewhere(self.device_id, msg)

    def _epoch(self, row: dict[str, Any]) -> dict[str, Any]:
        """In a cluster, the presence row carries the link epoch this node claimed for the device: the
        write counts only while no other node has taken the link over (storage Devices.write_presence)."""
        epoch = self.services.topology.link_epoch(self.device_id)
        if epoch is not None:
            row["epoch"] = epoch
        return row

    async def _receive(self, msg: Any) -> Any:
        self._last_activity = trio.current_time()
        if isinstance(msg, GetLive):
            return self.live()
        if isinstance(msg, Reboot):
            if self.machine.state is cm.Conn.REBOOTING or self.machine.reboot_pending:
                raise Conflict("the device is already rebooting", code="device_rebooting")
            command_id = str(uuid.uuid4())
            try:
                self._feed(cm.RebootRequested(command_id))
            except cm.NotConnected:
                raise DeviceOffline("the device is not connected") from None
            self._pending[command_id] = self.defer_reply()
            return None
        if isinstance(msg, Send):
            # Offline here, the device may be linked to another node: a bus that could reach it there
            # finds it or answers no responders (503 device_offline) at once; one that cannot is
            # answered here.
            if not self.machine.online and not self.services.bus.may_reach(subject(str(self.device_id), msg.verb)):
                raise DeviceOffline("the device is not connected")
            command_id = str(uuid.uuid4())
            self._pending[command_id] = self.defer_reply()
            self.tasks.start_soon(self._send_command, cm.SendCommand(command_id, msg.verb, msg.payload))
            return None
        if isinstance(msg, _CommandDone):
            reply = self._pending.pop(msg.command_id, None)
            self._feed(cm.CommandSucceeded(msg.command_id) if msg.ok else cm.CommandFailed(msg.command_id))
            if reply is not None:
                reply.fail(msg.error) if msg.error else reply.set(msg.payload or {})
            return None
        if isinstance(msg, MEMTEST_MESSAGES):
            return await self.memtests.receive(msg)
        if isinstance(msg, DeviceEvent) and msg.kind.startswith("memtest."):
            self.memtests.on_event(msg.kind, msg.payload)  # published as an operation of kind memory_test
            return None
        if isinstance(msg, DeviceEvent):
            # in their own namespace: device.state, device.snapshot and device.operation are the hub's alone
            self.publish(f"device.event.{msg.kind}", msg.payload)
            if msg.kind == "telemetry":
                self._take_system(msg.payload.get("system"))
            if msg.kind == "files.result":
                await self._event_job(self.delivery.record_file_results, msg.payload)
            elif msg.kind == "config.result":
                await self._event_job(self.delivery.record_config_result, msg.payload)
            elif msg.kind in self.hooks.event_kinds:
                await self._event_job(self.hooks.on_event, self.org_id, self.device_id, msg.kind, msg.payload)
            return None
        if isinstance(msg, Hello):
            self._job(self.delivery.after_hello, msg.digests, msg.config_version_applied)
            self.memtests.on_hello(msg.memtest)
            return None
        if isinstance(msg, SyncFiles):
            if self.machine.online:
                self._job(self.delivery.sync)
            else:
                self._to_home_node(msg)
            return None
        if isinstance(msg, RemoveFiles):
            if self.machine.online:
                self._job(self.delivery.remove, list(msg.paths))
            else:
                self._to_home_node(msg)
            return None
        if isinstance(msg, ApplyConfig):
            if self.machine.online:
                self._job(self.delivery.apply_config)
            else:
                self._to_home_node(msg)
            return None
        if isinstance(msg, SendPullSettings):
            if self.machine.online:
                self._job(self.delivery.send_pull_settings)
            else:
                self._to_home_node(msg)
            return None
        if isinstance(msg, cm.LinkUp):
            # served live until the presence row is written behind; a fact the hello left out
            # (hub/api/link.py KEPT_UNLESS_SENT) keeps the value the last hello gave
            self.facts = {**(self.facts or {}), **(msg.facts or {})}
            self._job(self.hooks.on_link, self.org_id, self.device_id, msg.facts or {})
            self.memtests.on_link_up(msg.facts, rebooted=self.machine.state is cm.Conn.REBOOTING)
        if isinstance(msg, cm.LinkDown) and msg.conn_id == self.machine.conn_id:
            self.memtests.on_link_down()
        if isinstance(msg, (cm.LinkUp, cm.Heartbeat)):
            self._meter_active()
        self._feed(msg)  # LinkUp, LinkDown, Heartbeat: the machine's own events
        return None

    def _meter_active(self) -> None:
        # Billing counts a device once per UTC day it was seen connected; one metering put per day.
        day = self.services.clock.now().astimezone(dt.timezone.utc).date()
        if day != self._active_day:
            self._active_day = day
            self.services.meter.device_seen(self.org_id, self.device_id, day)

    def _job(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Delivery work in the background. Its failure is logged, not a crash: one device's bad row
        must not restart the actor in a loop and escalate to the whole hub; the next hello retries.
        A storage outage is waited out (every job converges from storage, so it may run again)."""

        async def guarded() -> None:
            try:
                await self.until_stored(fn, *args)
            except Exception:
                log.exception("device %s: %s failed", self.device_id, getattr(fn, "__name__", fn))

        self.tasks.start_soon(guarded)

    async def _event_job(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """``_job`` for storage work a device event started, bounded by ``event_jobs`` (waits for a slot)."""
        await self._event_slots.acquire()

        async def release_after() -> None:
            try:
                await fn(*args)
            finally:
                self._event_slots.release()

        release_after.__name__ = getattr(fn, "__name__", "job")  # what _job's log names
        self._job(release_after)

    def live(self) -> dict[str, Any]:
        m = self.machine
        return {"state": m.state.value, "online": m.online, "bootReason": m.boot_reason,
                "lastSeenAt": m.last_seen_at, "connectedAt": m.connected_at, "facts": self.facts}

    def next_deadline(self) -> float:
        d = self.machine.next_deadline()
        machine_at = self.services.clock.deadline_for(d) if d is not None else math.inf
        idle_at = self._last_activity + self.idle_timeout if self.machine.state is cm.Conn.OFFLINE else math.inf
        return min(machine_at, idle_at)

    async def on_deadline(self) -> None:
        self._feed(cm.Tick())

    def should_stop(self) -> bool:
        return (self.machine.state is cm.Conn.OFFLINE and not self._pending
                and trio.current_time() >= self._last_activity + self.idle_timeout)

    def on_given_up(self) -> None:
        # Its link would go on feeding an actor that is gone: closed, the device reconnects and its
        # hello starts a fresh actor from storage (what a restart would have done, minus the loop).
        link = self.services.links.get(self.device_id)
        if link is not None:
            link.close(Close.INTERNAL_ERROR, "the hub restarts this device's state: reconnect")

    # -- effects -----------------------------------------------------------------------------
    def _feed(self, event: object) -> None:
        for effect in self.machine.handle(event, self.services.clock.now()):
            self._carry_out(effect)

    def _carry_out(self, effect: object) -> None:
        s = self.services
        if isinstance(effect, cm.Persist):
            row = {"id": self.device_id, "online": effect.online, "state": effect.state.value,
                   "boot_reason": effect.boot_reason, "last_seen_at": effect.last_seen_at,
                   "connected_at": effect.connected_at}
            if effect.facts is not None:
                row.update(firmware=effect.facts.get("firmware"), architecture=effect.facts.get("architecture"),
                           tunnel_public_key=effect.facts.get("tunnelPublicKey"), facts=effect.facts)
            s.presence.put(self.device_id, self._epoch(row))
        elif isinstance(effect, cm.Publish):
            self.publish(effect.kind, effect.payload)
        elif isinstance(effect, cm.SendCommand):
            self.tasks.start_soon(self._send_command, effect)
        elif isinstance(effect, cm.DropLink):
            link = s.links.get(self.device_id)
            if link is not None and link.conn_id == effect.conn_id:
                # the machine drops a link only when its heartbeats stopped (a newer link closes the
                # older one itself, hub/api/link.py)
                link.close(Close.HEARTBEAT_TIMEOUT,
                           f"no heartbeat for {s.settings.heartbeat_timeout:g} s (3 heartbeat intervals)")

    def publish(self, kind: str, payload: dict[str, Any]) -> None:
        """An event on the device's and its organisation's streams (the halves publish through it)."""
        event = {"kind": kind, "deviceId": str(self.device_id), "at": rfc3339(self.services.clock.now()),
                 "payload": payload}
        # the event log appends it, then publishes it on both topics (hub/eventlog.py)
        self.services.journal.record(self.org_id, event)

    async def _send_command(self, effect: cm.SendCommand) -> None:
        s = self.services
        try:
            payload = await s.bus.request(subject(str(self.device_id), effect.verb), effect.payload,
                                          timeout=s.settings.command_timeout)
            done = _CommandDone(effect.command_id, True, payload, None)
        except NoResponders:
            done = _CommandDone(effect.command_id, False, None, DeviceOffline("the device is not connected"))
        except RequestTimeout:
            done = _CommandDone(effect.command_id, False, None,
                                DeviceTimeout("the device did not answer in time"))
        except Unavailable:
            done = _CommandDone(effect.command_id, False, None, BusUnavailable("the device's hub node cannot be reached now (the cluster's NATS is down or stalled)"))
        except DeviceFailure as exc:
            # the device's answer (refused) or the link's (it closed before the reply: offline): an
            # outcome of the command, for its caller, not a fault of this actor
            done = _CommandDone(effect.command_id, False, None, exc)
        except Exception:
            # A bug, not the device's answer: the actor crashes (and restarts), but the asker hears
            # about it now instead of waiting out its timeout.
            reply = self._pending.pop(effect.command_id, None)
            if reply is not None:
                reply.fail(ActorCrashed(f"actor {self.key} crashed while sending {effect.verb}"))
            raise
        await self.post(done)  # wait for mailbox space: this outcome must reach the machine
