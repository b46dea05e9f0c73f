"""RolloutActor: the IO shell around the rollout machine of one rollout.

Why an actor per rollout rather than the FleetActor (DESIGN.md names the FleetActor): the batched
request form spans several fleets, and one rollout must have exactly one owner of its state. Each
fleet still has at most one active rollout (storage refuses a second).

The actor rebuilds from storage (so a hub restarted mid-rollout continues where it was), ticks while
devices are in flight (one storage crossing per tick for all its devices), sleeps until the next
window opening when only queued devices remain, and ends once the rollout is settled.
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
from actors.machines import rollout as rm
from actors.machines.connection import Conn
from actors.machines.window import UpdateWindow, WindowError, is_open, next_start_after
from actors.runtime import Actor
from device_client.clock import rfc3339
from hub.errors import Conflict, NotFound

if TYPE_CHECKING:
    from hub.services import Services

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
    def __init__(self, rollout_id: uuid.UUID, services: "Services") -> None:
        super().__init__(("rollout", rollout_id))
        self.rollout_id = rollout_id
        self.services = services
        self.row: dict[str, Any] = {}
        self.machine: rm.RolloutMachine | None = None
        self.windows: dict[str, UpdateWindow | None] = {}
        self._tick_now = False

    async def on_start(self) -> None:
        s = self.services
        found = await s.rollouts.get_any(self.rollout_id)
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
            accepted_failures=self.row["accepted_failures"], accepted_batch=self.row["accepted_batch"])
        if self.machine.state is rm.RolloutState.PENDING:
            await self._carry_out(self.machine.handle(rm.Start(), s.clock.now()))
        self._tick_now = True  # look at the devices at once after a (re)start

    async def _load_windows(self) -> None:
        windows: dict[str, UpdateWindow | None] = {}
        stored = await self.services.windows.get_many(self.row["org_id"], self.row["fleet_ids"])
        for fleet_id, raw in stored.items():
            try:
                windows[str(fleet_id)] = UpdateWindow.parse(raw) if raw else None
            except WindowError:
                log.warning("fleet %s has an unreadable update window; treating it as none", fleet_id)
                windows[str(fleet_id)] = None
        self.windows = windows

    def _window_open(self, fleet_id: str, instant: dt.datetime) -> bool:
        w = self.windows.get(fleet_id)
        return w is None or is_open(w, instant)

    def _next_window(self, fleet_id: str, instant: dt.datetime) -> dt.datetime | None:
        w = self.windows.get(fleet_id)
        return next_start_after(w, instant) if w is not None else None

    # -- messages ----------------------------------------------------------------------------------
    async def receive(self, msg: Any) -> Any:
        if isinstance(msg, Control):
            try:
                effects = self.machine.handle(msg.event, self.services.clock.now())
            except rm.IllegalTransition as exc:
                raise Conflict(str(exc), code="invalid_state") from None
            await self._carry_out(effects)
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
        if m.state in (rm.RolloutState.RUNNING, rm.RolloutState.PAUSED):
            return True
        return m.state is rm.RolloutState.CANCELLED and m.has_in_flight()

    def next_deadline(self) -> float:
        if not self._active():
            return math.inf
        if self._tick_now:
            return trio.current_time()
        m = self.machine
        waiting_online = any(st.step in (rm.Step.PENDING, rm.Step.DEFERRED_MEMORY_TEST) and st.batch <= m.current_batch
                             for st in m.steps.values())
        if m.has_in_flight() or (m.state is rm.RolloutState.RUNNING and waiting_online):
            return trio.current_time() + POLL_INTERVAL
        window = m.next_deadline(self.services.clock.now())
        return self.services.clock.deadline_for(window) if window is not None else math.inf

    async def on_deadline(self) -> None:
        self._tick_now = False
        views = await self._views()
        await self._carry_out(self.machine.handle(rm.Tick(views), self.services.clock.now()))

    def should_stop(self) -> bool:
        return not self._active()

    async def _views(self) -> dict[str, rm.DeviceView]:
        s = self.services
        version = self.row["version_id"]
        # Only batches already reached and the next one (which may start in this very tick): later
        # ones cannot start yet, and reading them cost 1,000 rows a tick.
        upto = self.machine.current_batch + 1
        ids = [uuid.UUID(d) for d, st in self.machine.steps.items()
               if st.step not in rm.TERMINAL and st.batch <= upto]
        rows = {str(r["id"]): r for r in await s.rollouts.device_views(version, ids)} if ids else {}
        views = {}
        for device_id in map(str, ids):
            row = rows.get(device_id)
            if row is None:
                continue  # the device was removed: it waits; its step stays visible
            actor = s.registry.lookup(("device", uuid.UUID(device_id)))
            machine = getattr(actor, "machine", None)
            online = machine is not None and machine.online
            facts = getattr(actor, "facts", None) or {}
            held = bool(machine is not None and machine.state is Conn.MAINTENANCE) or bool(facts.get("workloadHeld"))
            ours = row["config_version_id"] == version
            result = None
            if ours and row["config_status"] == "applied" and row["applied_version_id"] == version:
                result = "applied"
            elif ours and row["config_status"] == "rejected":
                result = "rejected"
            views[device_id] = rm.DeviceView(online=online, held=held,
                                             applying=ours and row["config_status"] == "applying",
                                             result=result, error=row["config_error"])
        return views

    # -- effects -----------------------------------------------------------------------------------
    async def _carry_out(self, effects: list[object]) -> None:
        s = self.services
        now = s.clock.now()
        steps: dict[str, rm.DeviceStep] = {}
        save: rm.SaveRollout | None = None
        starting = [uuid.UUID(e.device_id) for e in effects if isinstance(e, rm.Update)]
        if starting:
            await self._update(starting, now)
        for effect in effects:
            if isinstance(effect, rm.SaveSteps):
                steps.update({st.device_id: st for st in effect.steps})
            elif isinstance(effect, rm.SaveRollout):
                save = effect
            elif isinstance(effect, rm.Publish):
                event = {"kind": effect.kind, "rolloutId": str(self.rollout_id), "at": rfc3339(now),
                         "payload": effect.payload}
                s.events.publish(("rollout", self.rollout_id), event)
                s.events.publish(("org", self.row["org_id"]), event)
        if steps or save is not None:
            m = self.machine
            await s.rollouts.save(
                self.rollout_id, now, state=m.state.value, current_batch=m.current_batch, reason=m.reason,
                accepted_failures=m.accepted_failures, accepted_batch=m.accepted_batch,
                steps=[(uuid.UUID(st.device_id), st.step.value, st.error, st.updated_at or now)
                       for st in steps.values()])

    async def _update(self, device_ids: list[uuid.UUID], now: dt.datetime) -> None:
        """Assign the rollout's version to the devices starting now, in one storage crossing; each
        DeviceActor sends it (now, or when its device next connects) and the result comes back
        through storage at a later tick."""
        s = self.services
        await s.rollouts.assign(device_ids, self.row["config_id"], self.row["version_id"], now)
        for device_id in device_ids:
            actor = await s.device_actor(device_id)
            actor.tell(ApplyConfig())
