"""The hub's memory-test machine for one device: what runs and what may start.

Pure: no trio, storage or quart. Time comes in as ``now`` (aware UTC). ``MemtestMachine`` is fed by
the DeviceActor's memory-test half. It knows whether a test runs (from the hub's own start, the
device's progress, its hello and status reads), refuses a second start (``Busy``, carrying the
running test's status), a start within 5 s of an accepted one (``TooSoon``) and a mode the device
cannot run (``Unsupported``), and says what to send, publish and persist. The start request's plan
is actors/machines/memtest_plan.py; what results mean (MemoryFault, diagnosis) is
actors/machines/memory_fault.py.

The device is the authority on what runs: the machine answers from its own knowledge when it has
it, and otherwise forwards and lets the device's answer (busy, not_running) decide.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import Enum
from collections.abc import Callable
from typing import Any, TypeGuard

RATE_LIMIT = dt.timedelta(seconds=5)  # a device accepts one start every 5 seconds
TEST_BOOT_UNSUPPORTED = "test boot is not supported by this board's bootloader yet"
NO_MEMORY_TEST = "this device's firmware has no memory test"
TERMINAL_PHASES = frozenset({"idle", "done", "failed", "cancelled", "interrupted"})


# -- the machine ------------------------------------------------------------------------------------
class RunState(Enum):
    IDLE = "idle"          #: no test known to run on the device
    STARTING = "starting"  #: a start was sent; waiting for the device's answer
    RUNNING = "running"    #: the device runs a test; ``status`` is its last known state


# events
@dataclass(frozen=True)
class Start:
    """A caller asks for a test. ``capabilities``: the hello's capabilities.memoryTest."""
    run_id: str
    plan: dict[str, Any]
    capabilities: dict[str, Any]


@dataclass(frozen=True)
class StartAccepted:
    status: dict[str, Any]


@dataclass(frozen=True)
class StartRefused:
    """The device refused; ``running`` is the status it reported when it said busy."""
    running: dict[str, Any] | None = None


@dataclass(frozen=True)
class Cancel:
    run_id: str | None = None


@dataclass(frozen=True)
class Progress:
    """A memtest.progress event, or the status in a start or cancel reply."""
    status: dict[str, Any]


@dataclass(frozen=True)
class Observed:
    """What the device says runs (a status read, the hello's memoryTestRunning); None: nothing.
    ``rebooted``: a hello after a reboot the device accepted, where an online test cannot still run."""
    status: dict[str, Any] | None
    rebooted: bool = False


@dataclass(frozen=True)
class Finished:
    """A memtest.result (or the hello's lastMemoryTest)."""
    result: dict[str, Any]


@dataclass(frozen=True)
class Reset:
    """The actor restarted: a start in flight lost its task and its answer."""


# effects
@dataclass(frozen=True)
class SendStart:
    run_id: str
    plan: dict[str, Any]


@dataclass(frozen=True)
class SendCancel:
    run_id: str | None


@dataclass(frozen=True)
class Publish:
    """An operation of kind memory_test on the device state stream."""
    payload: dict[str, Any]


@dataclass(frozen=True)
class SaveStatus:
    """Persist the current or last run's status (what a stored read shows)."""
    status: dict[str, Any]


@dataclass(frozen=True)
class StoreResult:
    """Store the result (idempotent by runId), then acknowledge it to the device."""
    result: dict[str, Any]


# refusals: raised, the state is unchanged
class Refused(Exception):
    pass


class Busy(Refused):
    def __init__(self, status: dict[str, Any] | None) -> None:
        super().__init__("a memory test is already running on this device")
        self.status = status


class NotRunning(Refused):
    def __init__(self, message: str = "no memory test is running on this device") -> None:
        super().__init__(message)


class TooSoon(Refused):
    def __init__(self, retry_after: float) -> None:
        super().__init__("a memory test was started on this device less than 5 seconds ago")
        self.retry_after = retry_after


class Unsupported(Refused):
    pass


class IllegalTransition(Exception):
    def __init__(self, state: RunState, event: object) -> None:
        super().__init__(f"{type(event).__name__} is not allowed in state {state.value}")


# What an event says beyond its type, read off the event and the machine's own data (never a choice
# of state); a key is the event type alone or (type, guard), as h11 keys (Response, _SWITCH_UPGRADE).
ENDED = "ended"              # the status it carries has a terminal phase
STALE = "stale"              # progress of the last run from before its end, arriving after it
BUSY = "busy"                # a refusal carrying the device's running test
BUSY_ENDED = "busy_ended"    # a refusal carrying a test whose phase is terminal
OTHER_RUN = "other_run"      # names a run that is not the one the machine holds
NOTHING = "nothing"          # a status read or hello: nothing runs
UNSUPPORTED = "unsupported"  # a start of a mode the device's capabilities rule out
TOO_SOON = "too_soon"        # a start within RATE_LIMIT of the last accepted one

Key = type | tuple[type, str]
S = RunState

# The next state for each (state, key): the one place a state is chosen. Device-sent events are legal
# everywhere (the device may report at any moment); a start's acceptance may arrive after the run's
# own result (replies and events take different paths), so it is legal everywhere too; a refusal
# only while the start is in flight.
TRANSITIONS: dict[RunState, dict[Key, RunState]] = {
    S.IDLE: {
        Start: S.STARTING,
        StartAccepted: S.IDLE, (StartAccepted, ENDED): S.IDLE,
        Cancel: S.IDLE, (Cancel, OTHER_RUN): S.IDLE,
        Progress: S.RUNNING, (Progress, ENDED): S.IDLE, (Progress, STALE): S.IDLE,
        Observed: S.RUNNING, (Observed, NOTHING): S.IDLE,
        Finished: S.IDLE, (Finished, OTHER_RUN): S.IDLE,
        Reset: S.IDLE,
    },
    S.STARTING: {
        StartAccepted: S.RUNNING, (StartAccepted, ENDED): S.IDLE,
        StartRefused: S.IDLE, (StartRefused, BUSY): S.RUNNING, (StartRefused, BUSY_ENDED): S.IDLE,
        Progress: S.STARTING, (Progress, ENDED): S.STARTING, (Progress, STALE): S.STARTING,
        Observed: S.STARTING, (Observed, NOTHING): S.STARTING,
        Finished: S.IDLE, (Finished, OTHER_RUN): S.STARTING,
        Reset: S.IDLE,
    },
    S.RUNNING: {
        StartAccepted: S.RUNNING, (StartAccepted, ENDED): S.RUNNING,
        Cancel: S.RUNNING,
        Progress: S.RUNNING, (Progress, ENDED): S.IDLE,
        Observed: S.RUNNING, (Observed, NOTHING): S.IDLE,
        Finished: S.IDLE, (Finished, OTHER_RUN): S.RUNNING,
        Reset: S.RUNNING,
    },
}

# Pairs refused with the caller's error (the state unchanged) rather than as illegal.
_STARTS = (Start, (Start, UNSUPPORTED), (Start, TOO_SOON))
REFUSALS: dict[tuple[RunState, Key], Callable[["MemtestMachine", Any, dt.datetime], Refused]] = {
    **{(state, key): (lambda m, e, now: Busy(m.status)) for state in (S.STARTING, S.RUNNING) for key in _STARTS},
    (S.IDLE, (Start, UNSUPPORTED)): lambda m, e, now: Unsupported(_unsupported_reason(e)),
    (S.IDLE, (Start, TOO_SOON)): lambda m, e, now: _too_soon(m, now),
    # its start is still on the way; cancel once it answered
    (S.STARTING, Cancel): lambda m, e, now: Busy(m.status),
    (S.STARTING, (Cancel, OTHER_RUN)): lambda m, e, now: Busy(m.status),
    (S.RUNNING, (Cancel, OTHER_RUN)): lambda m, e, now: NotRunning(
        f"memory test {e.run_id} is not the one running on this device"),
}


def event_type(key: Key) -> type:
    return key[0] if isinstance(key, tuple) else key


def _too_soon(m: MemtestMachine, now: dt.datetime) -> TooSoon:
    assert m.last_accepted_at is not None  # key() says TOO_SOON only after an accepted start
    return TooSoon((m.last_accepted_at + RATE_LIMIT - now).total_seconds())


def _unsupported_reason(event: Start) -> str | None:
    """Why the device cannot run this start's mode, or None when it can."""
    caps = event.capabilities or {}
    if event.plan["mode"] == "test_boot":
        return None if caps.get("offline") else (caps.get("offlineReason") or TEST_BOOT_UNSUPPORTED)
    return None if caps.get("online") else NO_MEMORY_TEST


def _ended(status: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return status is not None and status.get("phase") in TERMINAL_PHASES


def _online(status: dict[str, Any]) -> bool:
    """An online run (not a test boot, which is what runs after its own reboot)."""
    plan = status.get("plan") or {}
    return plan.get("placement") != "offline" and plan.get("mode") != "test_boot"


def progress(status: dict[str, Any] | None) -> float | None:
    """How far the run is through its planned work, 0–1. ``coverage`` is not that: it is the share
    of the region touched at least once, which the first sweep fills while passes, patterns and the
    bit-fade waits are still ahead. The device reports the bytes verified so far (testedBytes, summed
    over sweeps and passes), its rate and the seconds it still needs for the rest of its plan
    (etaSeconds), so the planned work is testedBytes + etaSeconds × rateBps."""
    if not isinstance(status, dict):
        return None
    if status.get("phase") == "done":
        return 1.0
    done, eta, rate = status.get("testedBytes"), status.get("etaSeconds"), status.get("rateBps")
    if not isinstance(done, (int, float)) or not isinstance(eta, (int, float)) or not isinstance(rate, (int, float)):
        return None
    planned = done + eta * rate
    return round(min(1.0, done / planned), 4) if planned > 0 else 0.0


def operation(status: dict[str, Any], result: dict[str, Any] | None = None) -> dict[str, Any]:
    """The device-state-stream payload of a memory test: phase, pass, pattern, coverage, progress,
    the bytes verified so far, rate, the seconds left, errors, temperature (and outcome and verdict
    once it ended)."""
    total = status.get("totalBytes") or 0
    covered = status.get("coverageBytes") or 0
    temp = status.get("tempMilliC")
    out = {"kind": "memory_test", "runId": status.get("runId"), "phase": status.get("phase"),
           "pass": status.get("pass"), "passes": status.get("passes"), "pattern": status.get("pattern"),
           "coverage": round(covered / total, 4) if total else None, "coverageBytes": covered,
           "totalBytes": total, "progress": progress(status), "testedBytes": status.get("testedBytes"),
           "rate": status.get("rateBps"), "etaSeconds": status.get("etaSeconds"),
           "errors": status.get("errors"), "confirmedErrors": status.get("confirmedErrors"),
           "temperature": temp / 1000 if isinstance(temp, (int, float)) and temp >= 0 else None}
    if result is not None:
        out.update(outcome=result.get("outcome"), verdict=result.get("verdict"))
    return out


_END_PHASE: dict[str | None, str] = {"pass": "done", "fail": "failed", "cancelled": "cancelled", "interrupted": "interrupted",
              "error": "failed"}


class MemtestMachine:
    def __init__(self) -> None:
        self.state = RunState.IDLE
        self.status: dict[str, Any] | None = None      # the current or last run, as last known
        self.last_accepted_at: dt.datetime | None = None

    @property
    def running(self) -> dict[str, Any] | None:
        return self.status if self.state is not RunState.IDLE else None

    @property
    def workload_held(self) -> bool:
        """A stopped-mode test is under way, or a failed test boot holds the device in maintenance
        (phase failed, step holding): the workload is held, rollouts defer the device."""
        if self.status is not None and self.status.get("step") == "holding":
            return True
        return (self.state is not RunState.IDLE and self.status is not None
                and (self.status.get("plan") or {}).get("impact") == "stopped")

    def key(self, event: object, now: dt.datetime) -> Key:
        """The event's key in TRANSITIONS: its type, refined by what it says (see the guards above)."""
        kind = type(event)
        status = self.status or {}
        if isinstance(event, Start):
            if _unsupported_reason(event) is not None:
                return (Start, UNSUPPORTED)
            if self.last_accepted_at is not None and now - self.last_accepted_at < RATE_LIMIT:
                return (Start, TOO_SOON)
            return Start
        if isinstance(event, StartAccepted):
            return (kind, ENDED) if _ended({"phase": status.get("phase"), **event.status}) else kind
        if isinstance(event, StartRefused):
            if event.running is None:
                return kind
            return (kind, BUSY_ENDED) if _ended(event.running) else (kind, BUSY)
        if isinstance(event, Cancel):
            return (kind, OTHER_RUN) if event.run_id is not None and event.run_id != status.get("runId") else kind
        if isinstance(event, Progress):
            if (status.get("runId") == event.status.get("runId") and _ended(self.status)
                    and not _ended(event.status)):
                return (kind, STALE)
            return (kind, ENDED) if _ended(event.status) else kind
        if isinstance(event, Observed):
            survived = event.rebooted and event.status is not None and _online(event.status)
            return (kind, NOTHING) if event.status is None or _ended(event.status) or survived else kind
        if isinstance(event, Finished):
            ours = self.status is not None and status.get("runId") == event.result.get("runId")
            return kind if ours else (kind, OTHER_RUN)
        return kind

    def handle(self, event: object, now: dt.datetime) -> list[object]:
        key = self.key(event, now)
        refusal = REFUSALS.get((self.state, key))
        if refusal is not None:
            raise refusal(self, event, now)
        new = TRANSITIONS[self.state].get(key)
        if new is None:
            raise IllegalTransition(self.state, event)
        old, self.state = self.state, new
        return _ACTIONS[event_type(key)](self, event, now, key, old)

    def next_deadline(self) -> dt.datetime | None:
        return None  # nothing here waits on time: the rate limit is checked when a start arrives

    # -- actions: the data and effects of a transition TRANSITIONS already chose ----------------------
    # Each runs after the new state is set; ``old`` is the state the event found.
    def _start(self, event: Start, now: dt.datetime, key: Key, old: RunState) -> list[object]:
        # What a second caller is told while the device has not answered yet.
        self.status = {"runId": event.run_id, "plan": event.plan, "phase": "preparing"}
        return [SendStart(event.run_id, event.plan)]

    def _accepted(self, event: StartAccepted, now: dt.datetime, key: Key, old: RunState) -> list[object]:
        self.last_accepted_at = now
        if old is not S.STARTING:
            return []  # the run already reported; only the start rate is left to record
        pending = self.status or {}
        status = {**pending, **event.status}
        status.setdefault("plan", pending.get("plan"))
        return self._adopt(status)

    def _refused(self, event: StartRefused, now: dt.datetime, key: Key, old: RunState) -> list[object]:
        if event.running:
            return self._adopt(event.running)
        self.status = None
        return []

    def _cancel(self, event: Cancel, now: dt.datetime, key: Key, old: RunState) -> list[object]:
        return [SendCancel(event.run_id)]

    def _progress(self, event: Progress, now: dt.datetime, key: Key, old: RunState) -> list[object]:
        if old is S.STARTING:
            pending = self.status or {}  # set by _start: STARTING always has it
            if event.status.get("runId") != pending.get("runId"):
                return []  # another run's late report: the start's answer decides
            self.status = {**pending, **event.status}  # early progress of the start in flight
            return [Publish(operation(self.status))]
        if key == (Progress, STALE):
            return []
        return self._adopt(event.status)

    def _observed(self, event: Observed, now: dt.datetime, key: Key, old: RunState) -> list[object]:
        if old is S.STARTING:
            return []
        if key == Observed and event.status is not None:  # key() says Observed only with a status
            return self._adopt(event.status, publish=event.status != self.status)
        if old is S.IDLE:  # nothing runs, and nothing did: keep the device's last word on record
            if event.status is not None and _ended(event.status) and event.status != self.status:
                self.status = event.status
                return [SaveStatus(event.status)]
            return []
        # The device says nothing runs while the hub held a running test: the device's end of that
        # run when it names it; else the run died without a word (a reboot, a crash: the spec's
        # interrupted). Never the run's last progress, which would read as testing for ever.
        if _ended(event.status) and event.status.get("runId") == (self.status or {}).get("runId"):
            ended = event.status
        else:
            ended = {**(self.status or {}), "phase": "interrupted", "step": None}
        self.status = ended
        return [SaveStatus(ended), Publish(operation(ended))]

    def _finished(self, event: Finished, now: dt.datetime, key: Key, old: RunState) -> list[object]:
        result = event.result
        effects: list[object] = [StoreResult(result)]
        ours = key == Finished
        if self.state is not S.IDLE:
            return effects  # an older run's report (an interrupted test) while another starts or runs
        if ours and old is S.IDLE and _ended(self.status) and self.status.get("outcome") == result.get("outcome"):
            return effects  # the device re-sent a result the hub already ended the run with
        ended = {**((self.status or {}) if ours else {}), "runId": result.get("runId"),
                 "plan": result.get("plan") or (self.status or {}).get("plan"),
                 "phase": _END_PHASE.get(result.get("outcome"), "done"),
                 "testedBytes": result.get("testedBytes"), "coverageBytes": result.get("coverageBytes"),
                 "totalBytes": result.get("totalBytes"), "errors": result.get("errorCount"),
                 "startedAt": result.get("startedAt"), "outcome": result.get("outcome")}
        if old is S.IDLE and not ours and self.status is not None and _newer(self.status, ended):
            return effects  # a late re-send of an older result: the last run stays the newer one
        self.status = ended
        return effects + [SaveStatus(ended), Publish(operation(ended, result))]

    def _reset(self, event: Reset, now: dt.datetime, key: Key, old: RunState) -> list[object]:
        if old is S.STARTING:
            self.status = None  # the start in flight lost its task and its answer
        return []

    def _adopt(self, status: dict[str, Any], *, publish: bool = True) -> list[object]:
        """Take the device's word for the run (the state is already chosen): publish it, and save it
        when it is another run or the run ended."""
        changed_run = (self.status or {}).get("runId") != status.get("runId")
        self.status = status
        effects: list[object] = [Publish(operation(status))] if publish else []
        if changed_run or self.state is S.IDLE:
            effects.append(SaveStatus(status))
        return effects


# Each action takes its own event type: typed by what handle() calls them with.
_ACTIONS: dict[type, Callable[[MemtestMachine, Any, dt.datetime, Key, RunState], list[object]]] = {
    Start: MemtestMachine._start, StartAccepted: MemtestMachine._accepted,
            StartRefused: MemtestMachine._refused, Cancel: MemtestMachine._cancel,
            Progress: MemtestMachine._progress, Observed: MemtestMachine._observed,
            Finished: MemtestMachine._finished, Reset: MemtestMachine._reset}


def _newer(current: dict[str, Any], other: dict[str, Any]) -> bool:
    a, b = current.get("startedAt"), other.get("startedAt")
    return isinstance(a, str) and isinstance(b, str) and a > b
