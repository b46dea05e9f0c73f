"""RolloutActor: the IO shell around the rollout machine of one rollout.

Why an actor per rollout rather than the FleetActor (DESIGN.md names the FleetActor): the batched
request form spans several fleets, and one rollout must have exactly one owner of its state. Each
fleet still has at most one active rollout (storage refuses a second).

The actor rebuilds from storage (so a hub restarted mid-rollout continues where it was), ticks while
devices are in flight (one storage crossing per tick for all its devices), sleeps until the next
window opening when only queued devices remain, and ends once the rollout is settled.

PostgreSQL down or restarting (``DatabaseUnavailable``) is waited out, not a crash: a tick that cannot
read its devices changes nothing and is retried with the runtime's backoff; what the machine already
decided but storage has not taken (assignments, steps, the rollout row, and the events announcing
them) waits in memory and is written, in order, before the next tick. An operator's pause, resume or
cancel is only done once stored: otherwise it answers 503 and the rollout stays as it was.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from actors.device import ApplyConfig
from actors.device_delivery import APPLY_TIMEOUT
from actors.errors import Conflict, NotFound
from actors.machines import rollout as rm
from actors.machines.window import UpdateWindow, WindowError, is_open, next_start_after
from actors.runtime import Actor
from device_client.shared.clock import rfc3339
from storage.db import DatabaseUnavailable
from storage.events import new_event
from storage.leases import Fence, LeaseLost

if TYPE_CHECKING:
    from actors.services import Services

log = logging.getLogger("fleethub.rollout")

POLL_INTERVAL = 0.25  # seconds between ticks while devices are waiting or updating


@dataclass(frozen=True)
class Control:
    """Ask: pause, resume or cancel."""
    event: object


@dataclass(frozen=True)
class Status:
    """Ask: the rollout's live state."""


@dataclass(frozen=True)
class ReloadWindows:
    """Tell: a fleet's update window changed; read the windows again."""


class RolloutActor(Actor):
    # Made by on_start, which the runtime runs before anything else of the actor's (a type, not None).
    machine: rm.RolloutMachine

    def __init__(self, rollout_id: uuid.UUID, services: "Services") -> None:
        super().__init__(("rollout", rollout_id))
        self.rollout_id = rollout_id
        self.services = services
        self.row: dict[str, Any] = {}
        self.windows: dict[str, UpdateWindow | None] = {}
        self._tick_now = False
        self._windows_stale = False  # a reload was asked for while storage was unreachable
        self._windows_seen = 0  # services.window_changes when the windows were last read
        self._bus_down = False  # the last tick could not reach the bus: it started nothing, so look again
        # In a cluster: the lease this node holds (storage/leases.py), checked by every write; once
        # another node has taken it over this actor writes nothing more and stops (``lost``).
        self.fence: Fence | None = None
        self.lost = False
        self._clear_unwritten()

    def _clear_unwritten(self) -> None:
        # Decided by the machine, not yet in storage: carried out in this order by _write().
        self._assign: list[uuid.UUID] = []   # devices to assign the version to
        self._apply: list[uuid.UUID] = []    # assigned; their DeviceActor not told yet
        self._steps: dict[str, rm.DeviceStep] = {}
        self._save = False                   # the rollout row changed
        self._release = False                # cancelled: its devices get back what they run
        self._events: list[dict[str, Any]] = []  # published once what they announce is stored

    def _unwritten(self) -> bool:
        return bool(self._assign or self._apply or self._steps or self._save or self._events or self._release)

    async def on_start(self) -> None:
        s = self.services
        self._clear_unwritten()  # a restart rebuilds from storage: what it holds is the truth
        self.fence = s.topology.rollout_fence(self.rollout_id)
        found = await s.stores.rollouts.get_any(self.rollout_id)
        if found is None:
            raise NotFound("rollout not found")
        self.row, steps = found
        await self._load_windows()
        self.machine = rm.RolloutMachine(
            steps=[rm.DeviceStep(str(st["device_id"]), str(st["fleet_id"]), st["batch"], rm.Step(st["step"]),
                                 st["error"], st["updated_at"]) for st in steps],
            force=self.row["force"], window_open=self._window_open, next_window=self._next_window,
            success_threshold=self.row["success_threshold"], failure_threshold=self.row["failure_threshold"],
            state=rm.RolloutState(self.row["state"]), current_batch=self.row["current_batch"], reason=self.row["reason"],
            accepted_failures=self.row["accepted_failures"], accepted_batch=self.row["accepted_batch"],
            resend_after=dt.timedelta(seconds=s.settings.rollout_resend_after),
            applying_after=dt.timedelta(seconds=APPLY_TIMEOUT + s.settings.rollout_resend_after))
        if self.machine.state is rm.RolloutState.PENDING:
            await self._carry_out(self.machine.handle(rm.Start(), s.clock.now()))
        self._tick_now = True  # look at the devices at once after a (re)start

    async def _load_windows(self) -> None:
        self._windows_stale = True  # until read: a tick retries it if storage is unreachable now
        self._windows_seen = self.services.window_changes
        windows: dict[str, UpdateWindow | None] = {}
        stored = await self.services.stores.windows.get_many(self.row["org_id"], self.row["fleet_ids"])
        for fleet_id, raw in stored.items():
            try:
                windows[str(fleet_id)] = UpdateWindow.parse(raw) if raw else None
            except WindowError:
                log.warning("fleet %s has an unreadable update window; treating it as none", fleet_id)
                windows[str(fleet_id)] = None
        self.windows = windows
        self._windows_stale = False

    def _window_open(self, fleet_id: str, instant: dt.datetime) -> bool:
        w = self.windows.get(fleet_id)
        return w is None or is_open(w, instant)

    def _next_window(self, fleet_id: str, instant: dt.datetime) -> dt.datetime | None:
        w = self.windows.get(fleet_id)
        return next_start_after(w, instant) if w is not None else None

    # -- messages ----------------------------------------------------------------------------------
    async def receive(self, msg: Any) -> Any:
        if isinstance(msg, Control):
            await self._write()  # an outage's leftovers first (if still down: 503, nothing changed)
            m = self.machine
            before = (m.state, m.reason, m.current_batch, m.accepted_failures, m.accepted_batch)
            try:
                effects = m.handle(msg.event, self.services.clock.now())
            except rm.IllegalTransition as exc:
                raise Conflict(str(exc), code="invalid_state") from None
            # A cancel also gives the devices back what they run, before the row says cancelled.
            self._release = m.state is rm.RolloutState.CANCELLED and before[0] is not rm.RolloutState.CANCELLED
            try:
                await self._carry_out(effects)
            except DatabaseUnavailable:
                # Not stored, so not done: the operator hears 503 and may try again. Pause and
                # resume only change the rollout row, so this undoes them whole; a cancel's release
                # may be stored already (devices and their steps, in one transaction: steps pending
                # in storage and in the machine alike), and a running rollout assigns them again.
                m.state, m.reason, m.current_batch, m.accepted_failures, m.accepted_batch = before
                self._clear_unwritten()
                raise
            if self.lost:
                raise Conflict("another hub node runs this rollout now; try again", code="rollout_moved")
            self._tick_now = True
            return self.snapshot()
        if isinstance(msg, Status):
            return self.snapshot()
        if isinstance(msg, ReloadWindows):
            await self._load_windows()
            return None
        return await super().receive(msg)

    def snapshot(self) -> dict[str, Any]:
        m = self.machine
        return {"state": m.state.value, "reason": m.reason, "current_batch": m.current_batch,
                "counts": m.counts()}

    # -- ticking -----------------------------------------------------------------------------------
    def _active(self) -> bool:
        m = self.machine
        if self.lost:
            return False
        if m.state in (rm.RolloutState.RUNNING, rm.RolloutState.PAUSED):
            return True
        return m.state is rm.RolloutState.CANCELLED and m.has_in_flight()

    def next_deadline(self) -> float:
        if self._unwritten():
            return trio.current_time()  # the runtime holds this back while storage is unreachable
        if not self._active():
            return math.inf
        if self._tick_now or self._windows_stale:
            return trio.current_time()
        if self._bus_down:
            return trio.current_time() + POLL_INTERVAL
        m = self.machine
        waiting_online = any(st.step in (rm.Step.PENDING, rm.Step.DEFERRED_MEMORY_TEST) and st.batch <= m.current_batch
                             for st in m.steps.values())
        if m.has_in_flight() or (m.state is rm.RolloutState.RUNNING and waiting_online):
            return trio.current_time() + POLL_INTERVAL
        window = m.next_deadline(self.services.clock.now())
        return self.services.clock.deadline_for(window) if window is not None else math.inf

    async def on_deadline(self) -> None:
        # Each step raises DatabaseUnavailable before changing anything it has not stored.
        await self._write()
        if self.lost:
            return
        if self._windows_stale or self._windows_seen != self.services.window_changes:
            # a window changed while this actor started: fleet_changed told only registered actors
            await self._load_windows()
        views = await self._views()
        self._tick_now = False
        # A node cut off from NATS starts nobody: its tells to devices linked elsewhere would be lost.
        bus_up = self.services.bus.connected
        self._bus_down = not bus_up
        effects = self.machine.handle(rm.Tick(views, bus_up=bus_up), self.services.clock.now())
        if effects and self.machine.state is rm.RolloutState.CANCELLED:
            # A device that was applying at the cancel has finished: if it does not run the version
            # (rejected, or failed by the hub's verdict) it gets back what it runs, as the others did.
            self._release = True
        await self._carry_out(effects)

    def should_stop(self) -> bool:
        return not self._active() and not self._unwritten()

    async def _views(self) -> dict[str, rm.DeviceView]:
        s = self.services
        version = self.row["version_id"]
        # Only batches already reached and the next one (which may start in this very tick): later
        # ones cannot start yet, and reading them cost 1,000 rows a tick.
        upto = self.machine.current_batch + 1
        ids = [uuid.UUID(d) for d, st in self.machine.steps.items()
               if st.step not in rm.TERMINAL and st.batch <= upto]
        rows = {str(r["id"]): r for r in await s.stores.rollouts.device_views(version, ids)} if ids else {}
        views = {}
        for device_id in map(str, ids):
            row = rows.get(device_id)
            if row is None:
                continue  # the device was removed: it waits; its step stays visible
            # What each DeviceActor wrote (presence, written behind within a second), never the
            # actor itself: the device's actor may live in another process.
            online = bool(row["online"])
            held = row["state"] == "maintenance" or bool(row["workload_held"])
            ours = row["config_version_id"] == version
            result = None
            if ours and row["config_status"] == "applied" and row["applied_version_id"] == version:
                result = "applied"
            elif ours and row["config_status"] in ("rejected", "failed"):
                result = row["config_status"]  # failed: unanswered or malformed, the hub's verdict
            views[device_id] = rm.DeviceView(online=online, held=held,
                                             applying=ours and row["config_status"] == "applying",
                                             result=result, error=row["config_error"])
        return views

    # -- effects -----------------------------------------------------------------------------------
    async def _carry_out(self, effects: list[object]) -> None:
        """Queue the effects behind anything still unwritten, then write them all (``_write``)."""
        now = self.services.clock.now()
        for effect in effects:
            if isinstance(effect, rm.Update):
                self._assign.append(uuid.UUID(effect.device_id))
            elif isinstance(effect, rm.Resend):
                self._apply.append(uuid.UUID(effect.device_id))  # assigned already: told again
            elif isinstance(effect, rm.SaveSteps):
                self._steps.update({st.device_id: st for st in effect.steps})
            elif isinstance(effect, rm.SaveRollout):
                self._save = True
            elif isinstance(effect, rm.Publish):
                self._events.append({"kind": effect.kind, "rolloutId": str(self.rollout_id), "at": rfc3339(now),
                                     "payload": effect.payload})
        await self._write()

    async def _write(self) -> None:
        """Carry out what is unwritten, in order; each part is dropped once done, so after a
        ``DatabaseUnavailable`` the next call goes on from there. Assigning the version to devices
        starting now is one crossing; each DeviceActor then sends it (now, or when its device next
        connects) and the result comes back through storage at a later tick."""
        if self.lost:
            self._clear_unwritten()
            return
        try:
            await self._write_fenced()
        except LeaseLost as exc:
            # Another node runs this rollout now and continues from what storage holds; nothing of
            # ours after its takeover was written (each write checked the epoch in its transaction).
            log.warning("%s; this node stops running it", exc)
            self.lost = True
            self._clear_unwritten()

    async def _write_fenced(self) -> None:
        s = self.services
        now = s.clock.now()
        if self._assign:
            await s.stores.rollouts.assign(self._assign, self.row["config_id"], self.row["version_id"], now,
                                    fence=self.fence)
            self._apply += self._assign
            self._assign = []
        while self._apply:
            actor = await s.device_actor(self._apply[0])  # a passivated one starts from storage
            actor.tell(ApplyConfig())
            self._apply.pop(0)
        if self._release:
            released = await s.stores.rollouts.release(self.rollout_id, self.row["version_id"], now, fence=self.fence)
            self._steps.update({st.device_id: st for st in self.machine.released([str(d) for d in released], now)})
            self._release = False
        # The events go into the event log in the transaction that stores what they announce.
        org_id = self.row["org_id"]
        logged = [new_event(org_id, e, tuple(self.row.get("fleet_ids", ())))
                  for e in self._events] if s.journal.enabled else []
        if self._steps or self._save:
            m = self.machine
            await s.stores.rollouts.save(
                self.rollout_id, now, state=m.state.value, current_batch=m.current_batch, reason=m.reason,
                accepted_failures=m.accepted_failures, accepted_batch=m.accepted_batch,
                steps=[(uuid.UUID(st.device_id), st.step.value, st.error, st.updated_at or now)
                       for st in self._steps.values()], fence=self.fence, events=logged)
            self._steps, self._save = {}, False
        elif logged:
            await s.stores.rollouts.record(logged, fence=self.fence)
        events, self._events = self._events, []
        for event in events:
            s.events.publish(("rollout", self.rollout_id), event)
            s.events.publish(("org", org_id), event)
