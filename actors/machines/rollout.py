"""The rollout machine: one configuration version to the devices of one or more fleets, in batches.

Pure: no trio, storage or quart. Time and the devices' situation come in with each event.

Rollout states (DESIGN.md section 12):

    PENDING ──Start──► RUNNING ──all devices settled──► COMPLETED (none failed) | FAILED (some failed)
                        │  ▲
                  Pause │  │ Resume            Cancel from PENDING, RUNNING or PAUSED ──► CANCELLED
                        ▼  │
                       PAUSED   (also entered by itself: canary failure, a batch below the success
                                 threshold, failures above the failure threshold)

Device steps follow the spec's table under a maintenance window:

    PENDING ──window open (or force)──► UPDATING ──device started applying──► VERIFYING
       │                                     └───────────── result ──────────────┴──► SUCCEEDED | FAILED
       ├──window closed, force false──► QUEUED_MAINTENANCE ──window opens──► UPDATING
       └──workload held for a memory test──► DEFERRED_MEMORY_TEST ──test ends──► (as PENDING)
    INELIGIBLE: offline, other architecture or missing fleet tags when the rollout was created.

Batches: with ``force`` every device is one batch and updates at once (window bypassed, health checks
still run). Otherwise the first batch is a canary (5% of the devices, at least one, at most
``batch_size``); the next batch starts only when every device of the current one settled
(succeeded, failed, or deferred for a memory test — deferred devices are not counted as failed and
get the update when their test ends) and its success ratio met ``success_threshold``. A canary
failure pauses; so does the failed share of all attempted devices passing ``failure_threshold``.
Pause stops devices from starting; devices already updating finish.

Partial failure (issue 38): the version reaches a device by a tell (the DeviceActor, maybe on another
node over NATS), and a tell may be lost. So a device whose step sits in ``updating`` past
``resend_after`` while it is online and neither applying nor answered is sent its assignment again
(``Resend``; the DeviceActor works from storage and the same version id, so a second send is harmless),
and so is one whose "applying" outlived ``applying_after`` (the apply that said so was lost with its node).
A device that is offline or unreachable is not failed: it waits (its next hello sends the version).
And while the owner cannot reach the bus (``Tick.bus_up`` false) no device starts and no batch begins:
what it would send could be lost, and a device it cannot reach is no verdict on the version.

The next state is decided in one place, ``TRANSITIONS[state][key]``: a Tick's key says what it found
(canary failed, failures over the threshold, a batch below the success threshold, settled); the
actions only move device steps and compute effects.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class RolloutState(Enum):
    PENDING = "pending"      #: created, not started yet
    RUNNING = "running"      #: devices are being updated batch by batch
    PAUSED = "paused"        #: no new device starts; in-flight ones finish
    COMPLETED = "completed"  #: every eligible device succeeded
    FAILED = "failed"        #: settled, with at least one device failed
    CANCELLED = "cancelled"  #: stopped by an operator; in-flight devices finish


class Step(Enum):
    # The one step the spec names keeps the spec's spelling on the wire and in storage
    # (migration 0011); the others are ours (DESIGN.md section 12) and lower case.
    PENDING = "pending"                            #: waiting for its batch
    QUEUED_MAINTENANCE = "QUEUED_MAINTENANCE"      #: its fleet's window is closed; starts when it opens
    UPDATING = "updating"                          #: the version was assigned and is being sent
    VERIFYING = "verifying"                        #: the device is applying it and checking health
    SUCCEEDED = "succeeded"                        #: applied and healthy
    FAILED = "failed"                              #: rejected or rolled back by the device
    DEFERRED_MEMORY_TEST = "deferred_memory_test"  #: workload held for a memory test; not a failure
    INELIGIBLE = "ineligible"                      #: left out when the rollout was created


TERMINAL = {Step.SUCCEEDED, Step.FAILED, Step.INELIGIBLE}
IN_FLIGHT = {Step.UPDATING, Step.VERIFYING}
WAITING = {Step.PENDING, Step.QUEUED_MAINTENANCE, Step.DEFERRED_MEMORY_TEST}
SETTLED_FOR_BATCH = TERMINAL | {Step.DEFERRED_MEMORY_TEST}
CANARY_SHARE = 0.05
# An assignment unanswered this long is sent again: longer than a tell takes to reach a device and the
# device to say "applying" (well under a second, a few under a forced rollout's storage queue).
RESEND_AFTER = dt.timedelta(seconds=15)
# A device whose row has said "applying" this long is sent its assignment again too: past the hub's own
# bound on an apply (actors/device_delivery.py APPLY_TIMEOUT, 120 s) a live apply has ended in a
# verdict, so the one that said "applying" is gone (its node died) and its result with it. The device
# answers a second send of the version it runs at once, and one it still applies after the first.
APPLYING_AFTER = dt.timedelta(seconds=120) + RESEND_AFTER

# A device's configuration result for the rollout's version -> its step, with the error shown when the
# device gave none. "failed" is the hub's own verdict (the apply went unanswered past its time or the
# device's result was malformed): the version did not take, so it counts against the failure threshold
# exactly like a rejection; were it left in flight, the rollout would wait on it forever.
RESULT_STEPS: dict[str, tuple[Step, str | None]] = {
    "applied": (Step.SUCCEEDED, None),
    "rejected": (Step.FAILED, "the device rejected the version"),
    "failed": (Step.FAILED, "the version was not applied"),
}


@dataclass
class DeviceStep:
    device_id: str
    fleet_id: str
    batch: int
    step: Step
    error: str | None = None
    updated_at: dt.datetime | None = None


@dataclass(frozen=True)
class DeviceView:
    """What the rollout needs to know about a device at a tick."""
    online: bool
    held: bool = False                  # workload held for a memory test
    applying: bool = False              # the device received the version and is verifying it
    result: str | None = None           # a key of RESULT_STEPS for the rollout's version, or None
    error: str | None = None


# -- events ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Start:
    pass


@dataclass(frozen=True)
class Tick:
    views: dict[str, DeviceView]
    bus_up: bool = True  # the owner reaches the bus (NATS) now: tells can arrive


@dataclass(frozen=True)
class Pause:
    reason: str = "paused by an operator"


@dataclass(frozen=True)
class Resume:
    pass


@dataclass(frozen=True)
class Cancel:
    pass


# -- effects ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Update:
    device_id: str


@dataclass(frozen=True)
class Resend:
    """Tell the device again to apply what storage assigns it (the assignment stands)."""
    device_id: str


@dataclass(frozen=True)
class SaveSteps:
    steps: tuple[DeviceStep, ...]


@dataclass(frozen=True)
class SaveRollout:
    state: RolloutState
    current_batch: int
    reason: str | None
    accepted_failures: int
    accepted_batch: int


@dataclass(frozen=True)
class Publish:
    kind: str
    payload: dict


class IllegalTransition(Exception):
    def __init__(self, state: RolloutState, event: object) -> None:
        super().__init__(f"{type(event).__name__} is not allowed when the rollout is {state.value}")
        self.state, self.event = state, event


# What a Tick found while the rollout runs (read off its devices' steps, never a choice of state); a
# key is the event type alone or (Tick, finding), as h11 keys (Response, _SWITCH_UPGRADE).
CANARY_FAILED = "canary_failed"                      # a canary device failed (and none was accepted)
FAILURES_OVER_THRESHOLD = "failures_over_threshold"  # failed share of updated devices above the threshold
BATCH_BELOW_THRESHOLD = "batch_below_threshold"      # a settled batch's success ratio below the threshold
SETTLED = "settled"                                  # every device terminal, none failed
SETTLED_WITH_FAILURES = "settled_with_failures"      # every device terminal, some failed

Key = type | tuple[type, str]

# The next state for each (state, key): the one place a state is chosen. An event type with no key in
# its state's row is illegal there and changes nothing.
TRANSITIONS: dict[RolloutState, dict[Key, RolloutState]] = {
    RolloutState.PENDING: {Start: RolloutState.RUNNING, Cancel: RolloutState.CANCELLED, Tick: RolloutState.PENDING},
    RolloutState.RUNNING: {
        Tick: RolloutState.RUNNING,
        (Tick, CANARY_FAILED): RolloutState.PAUSED,
        (Tick, FAILURES_OVER_THRESHOLD): RolloutState.PAUSED,
        (Tick, BATCH_BELOW_THRESHOLD): RolloutState.PAUSED,
        (Tick, SETTLED): RolloutState.COMPLETED,
        (Tick, SETTLED_WITH_FAILURES): RolloutState.FAILED,
        Pause: RolloutState.PAUSED, Cancel: RolloutState.CANCELLED,
    },
    RolloutState.PAUSED: {Tick: RolloutState.PAUSED, Resume: RolloutState.RUNNING, Cancel: RolloutState.CANCELLED,
                          Pause: RolloutState.PAUSED},
    RolloutState.COMPLETED: {Tick: RolloutState.COMPLETED},
    RolloutState.FAILED: {Tick: RolloutState.FAILED},
    RolloutState.CANCELLED: {Tick: RolloutState.CANCELLED},  # devices already updating still report in
}


def event_type(key: Key) -> type:
    return key[0] if isinstance(key, tuple) else key


def plan_batches(device_ids: list[str], *, batch_size: int | None, force: bool) -> list[list[str]]:
    """Canary first, then batches of ``batch_size``; one batch for a forced rollout."""
    if not device_ids:
        return []
    if force or not batch_size:
        return [list(device_ids)]
    canary = max(1, min(batch_size, math.ceil(len(device_ids) * CANARY_SHARE)))
    rest = device_ids[canary:]
    return [device_ids[:canary]] + [rest[i:i + batch_size] for i in range(0, len(rest), batch_size)]


class RolloutMachine:
    def __init__(self, *, steps: list[DeviceStep], force: bool, window_open: Callable[[str, dt.datetime], bool],
                 next_window: Callable[[str, dt.datetime], dt.datetime | None],
                 success_threshold: float = 0.9, failure_threshold: float = 0.1,
                 state: RolloutState = RolloutState.PENDING, current_batch: int = 0, reason: str | None = None,
                 accepted_failures: int = 0, accepted_batch: int = -1, resend_after: dt.timedelta = RESEND_AFTER,
                 applying_after: dt.timedelta = APPLYING_AFTER):
        self.steps = {s.device_id: s for s in steps}
        self.force = force
        self.window_open = window_open      # (fleet_id, instant) -> bool: the fleet's update window
        self.next_window = next_window      # (fleet_id, instant) -> next window start or None
        self.success_threshold = success_threshold
        self.failure_threshold = failure_threshold
        self.state = state
        self.current_batch = current_batch
        self.reason = reason
        self.batch_count = 1 + max((s.batch for s in steps), default=0)
        # What an operator accepted by resuming: failures up to this count and batches up to this one
        # no longer pause the rollout (else a resume would pause again on the same failure at once).
        self.accepted_failures = accepted_failures
        self.accepted_batch = accepted_batch
        self.resend_after = resend_after
        self.applying_after = applying_after

    # -- queries -----------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Step}
        for st in self.steps.values():
            out[st.step.value] += 1
        return out

    def in_batch(self, batch: int) -> list[DeviceStep]:
        return [s for s in self.steps.values() if s.batch == batch]

    def has_in_flight(self) -> bool:
        return any(s.step in IN_FLIGHT for s in self.steps.values())

    def next_deadline(self, now: dt.datetime) -> dt.datetime | None:
        """The next window opening a queued device waits for (the actor also polls while in flight)."""
        if self.state is not RolloutState.RUNNING:
            return None
        fleets = {s.fleet_id for s in self.steps.values() if s.step is Step.QUEUED_MAINTENANCE}
        if any(self.window_open(f, now) for f in fleets):
            return now  # a window opened (or changed) while devices queue: go now
        starts = [t for t in (self.next_window(f, now) for f in fleets) if t is not None]
        return min(starts, default=None)

    # -- handling ----------------------------------------------------------------------------------
    def handle(self, event: object, now: dt.datetime) -> list[object]:
        row = TRANSITIONS[self.state]
        if not any(event_type(key) is type(event) for key in row):
            raise IllegalTransition(self.state, event)
        key, reason, effects = _ACTIONS[type(event)](self, event, now)
        new = row[key]
        if new is not self.state:
            self.state, self.reason = new, reason
            effects.append(self._save())
            effects.append(Publish("rollout.state", {"state": new.value, "reason": reason,
                                                     "currentBatch": self.current_batch, "counts": self.counts()}))
        return effects

    # -- actions: each returns (key, the reason a new state would carry, effects) ------------------
    def _start(self, event: Start, now: dt.datetime) -> tuple[Key, str | None, list[object]]:
        return Start, None, []

    def _pause(self, event: Pause, now: dt.datetime) -> tuple[Key, str | None, list[object]]:
        return Pause, event.reason, []

    def _resume(self, event: Resume, now: dt.datetime) -> tuple[Key, str | None, list[object]]:
        # What the operator accepts by resuming: the failures so far and the batch reached.
        self.accepted_failures = self._failed_count()
        self.accepted_batch = self.current_batch
        return Resume, None, []

    def _cancel(self, event: Cancel, now: dt.datetime) -> tuple[Key, str | None, list[object]]:
        return Cancel, "cancelled by an operator", []

    def released(self, device_ids: list[str], now: dt.datetime) -> list[DeviceStep]:
        """After a cancel, storage gave these devices back the version they run
        (storage/rollouts.py ``release``): those the rollout still waited on were never updated, so
        they are pending again (else a cancelled rollout would wait on them forever). Returns the
        steps changed."""
        changed: list[DeviceStep] = []
        for device_id in device_ids:
            st = self.steps.get(device_id)
            if st is not None and st.step in IN_FLIGHT:
                self._move(st, Step.PENDING, now, changed)
        return changed

    def _save(self) -> SaveRollout:
        return SaveRollout(self.state, self.current_batch, self.reason, self.accepted_failures, self.accepted_batch)

    def _failed_count(self) -> int:
        return sum(1 for s in self.steps.values() if s.step is Step.FAILED)

    def _move(self, st: DeviceStep, step: Step, now: dt.datetime, changed: list[DeviceStep],
              error: str | None = None) -> None:
        if st.step is step and st.error == error:
            return
        st.step, st.error, st.updated_at = step, error, now
        changed.append(st)

    def _collect(self, views: dict[str, DeviceView], now: dt.datetime, changed: list[DeviceStep]) -> None:
        """Results and progress of devices already updating (also while paused or cancelled)."""
        for st in self.steps.values():
            if st.step not in IN_FLIGHT:
                continue
            view = views.get(st.device_id)
            if view is None:
                continue
            if view.result in RESULT_STEPS:
                step, default_error = RESULT_STEPS[view.result]
                self._move(st, step, now, changed, (view.error or default_error) if step is Step.FAILED else None)
            elif view.applying and st.step is Step.UPDATING:
                self._move(st, Step.VERIFYING, now, changed)

    def _tick(self, event: Tick, now: dt.datetime) -> tuple[Key, str | None, list[object]]:
        changed: list[DeviceStep] = []
        effects: list[object] = []
        key: Key = Tick
        reason: str | None = None
        self._collect(event.views, now, changed)  # nothing is in flight while pending or settled
        if self.state is RolloutState.CANCELLED:
            # nothing is sent again: the cancel gives its devices back what they run
            return key, reason, [SaveSteps(tuple(changed))] if changed else []
        if event.bus_up:
            self._resend_stuck(event.views, now, changed, effects)
        if self.state is RolloutState.RUNNING:
            finding, reason = self._threshold_breach()
            if finding is None and not event.bus_up:
                finding, reason = self._settled()  # nothing starts; a rollout already settled still ends
            elif finding is None:
                # Devices of batches already reached (a deferred one may sit in an earlier batch).
                for st in self.steps.values():
                    if st.batch <= self.current_batch and st.step in WAITING:
                        self._start_device(st, event.views.get(st.device_id), now, changed, effects)
                finding, reason = self._advance(event.views, now, changed, effects)
            if finding is not None:
                key = (Tick, finding)
        if changed:
            effects.insert(0, SaveSteps(tuple(changed)))
            effects.append(Publish("rollout.progress", {"counts": self.counts(), "currentBatch": self.current_batch,
                                                        "devices": [{"deviceId": s.device_id, "step": s.step.value,
                                                                     "error": s.error} for s in changed]}))
        return key, reason, effects

    def _resend_stuck(self, views: dict[str, DeviceView], now: dt.datetime, changed: list[DeviceStep],
                      effects: list[object]) -> None:
        """In-flight devices whose assignment got no sign of life within ``resend_after``, or whose
        "applying" outlived ``applying_after``: sent again. A device back to "not applying" after it
        was verifying (its apply never reached it) is updating again. Offline ones wait for their
        hello, which sends the version anyway."""
        for st in self.steps.values():
            view = views.get(st.device_id)
            if (st.step not in IN_FLIGHT or view is None or not view.online or view.result is not None
                    or st.updated_at is None
                    or now - st.updated_at < (self.applying_after if view.applying else self.resend_after)):
                continue
            st.step, st.error, st.updated_at = Step.UPDATING, None, now  # the bound counts from this send
            changed.append(st)
            effects.append(Resend(st.device_id))

    def _start_device(self, st: DeviceStep, view: DeviceView | None, now: dt.datetime, changed: list[DeviceStep],
                      effects: list[object]) -> None:
        if view is None or not view.online:
            return  # waits where it is until the device is back
        if view.held:
            self._move(st, Step.DEFERRED_MEMORY_TEST, now, changed)
            return
        if not self.force and not self.window_open(st.fleet_id, now):
            self._move(st, Step.QUEUED_MAINTENANCE, now, changed)
            return
        self._move(st, Step.UPDATING, now, changed)
        effects.append(Update(st.device_id))

    def _threshold_breach(self) -> tuple[str | None, str | None]:
        """A failure finding (and its reason) the operator has not accepted yet, or (None, None)."""
        if self.force:
            return None, None  # one batch, all at once: nothing left to hold back
        attempted = [s for s in self.steps.values() if s.step in (Step.SUCCEEDED, Step.FAILED)]
        failed = sum(1 for s in attempted if s.step is Step.FAILED)
        if failed <= self.accepted_failures:
            return None, None
        canary = self.in_batch(0)
        if self.batch_count > 1 and any(s.step is Step.FAILED for s in canary) and self.accepted_batch < 0:
            return CANARY_FAILED, "the canary batch failed"
        if failed / len(attempted) > self.failure_threshold:
            return FAILURES_OVER_THRESHOLD, (f"{failed} of {len(attempted)} updated devices failed, "
                                             f"above the failure threshold")
        return None, None

    def _settled(self) -> tuple[str | None, str | None]:
        """SETTLED or SETTLED_WITH_FAILURES once every device is terminal and the last batch was reached."""
        if self.current_batch + 1 < self.batch_count or any(s.step not in TERMINAL for s in self.steps.values()):
            return None, None
        failed = any(s.step is Step.FAILED for s in self.steps.values())
        return (SETTLED_WITH_FAILURES if failed else SETTLED), None

    def _advance(self, views: dict[str, DeviceView], now: dt.datetime, changed: list[DeviceStep],
                 effects: list[object]) -> tuple[str | None, str | None]:
        """Start the next batches while the current one settled well; a finding when it did not, or
        when the whole rollout settled."""
        while True:
            batch = self.in_batch(self.current_batch)
            if any(s.step not in SETTLED_FOR_BATCH for s in batch):
                return None, None
            counted = [s for s in batch if s.step in (Step.SUCCEEDED, Step.FAILED)]
            ok = sum(1 for s in counted if s.step is Step.SUCCEEDED)
            if (counted and 0 < self.current_batch and self.current_batch > self.accepted_batch
                    and ok / len(counted) < self.success_threshold):
                return BATCH_BELOW_THRESHOLD, f"batch {self.current_batch} is below the success threshold"
            if self.current_batch + 1 >= self.batch_count:
                return self._settled()
            self.current_batch += 1
            effects.append(self._save())
            for st in self.in_batch(self.current_batch):
                if st.step in WAITING:
                    self._start_device(st, views.get(st.device_id), now, changed, effects)


# Each action takes its own event type: typed by what handle() calls them with.
_ACTIONS: dict[type, Callable[[RolloutMachine, Any, dt.datetime], tuple[Key, str | None, list[object]]]] = {
    Start: RolloutMachine._start, Pause: RolloutMachine._pause, Resume: RolloutMachine._resume,
            Cancel: RolloutMachine._cancel, Tick: RolloutMachine._tick}
