"""The hub's side of a device's memory tests: what runs, what may start, and what a result means.

Pure: no trio, storage or quart. Time comes in as ``now`` (aware UTC). Three parts:

- ``plan_for(request)``: the spec's start-request table — field types and ranges, the mode a
  combination means, and every default of that mode applied — or ``PlanInvalid`` naming the field.
- ``MemtestMachine``: one per device, fed by its DeviceActor. It knows whether a test runs (from
  the hub's own start, the device's progress, its hello and status reads), refuses a second start
  (``Busy``, carrying the running test's status), a start within 5 s of an accepted one
  (``TooSoon``) and a mode the device cannot run (``Unsupported``), and says what to send, publish
  and persist.
- ``memory_fault`` and ``diagnosis``: the MemoryFault condition and the device's diagnosis issues.

The device is the authority on what runs: the machine answers from its own knowledge when it has
it, and otherwise forwards and lets the device's answer (busy, not_running) decide.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import Enum
from typing import Any

# -- the start request (spec: Resources → Memory test, Limits) ------------------------------------
RATE_LIMIT = dt.timedelta(seconds=5)  # a device accepts one start every 5 seconds
TEST_BOOT_UNSUPPORTED = "test boot is not supported by this board's bootloader yet"
NO_MEMORY_TEST = "this device's firmware has no memory test"
TERMINAL_PHASES = frozenset({"idle", "done", "failed", "cancelled", "interrupted"})
PAGE_SIZE = 4096
FAULT_PAGES = 32            # more than this many retired pages is a MemoryFault
FAULT_BYTES = 1024 * 1024   # more than this much distinct bad memory is a MemoryFault
FAULT_VERDICTS = frozenset({"data_line", "address_line"})

_INTS = {"passes": (1, 20), "kernelPasses": (1, 17), "timeBudgetSeconds": (60, 43200),
         "maxBytes": (PAGE_SIZE, 2**50)}
_BOOLS = ("quick", "bitFade", "holdOnFailure")
_ENUMS = {"impact": ("running", "stopped"), "placement": ("online", "offline")}
FIELDS = frozenset({*_INTS, *_BOOLS, *_ENUMS})


class PlanInvalid(ValueError):
    """The start request breaks a rule of the spec's table; ``field`` names the culprit."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def _typed(request: dict[str, Any]) -> dict[str, Any]:
    """The request's fields with their types and ranges checked; null counts as omitted."""
    out: dict[str, Any] = {}
    for name, value in request.items():
        if name not in FIELDS:
            raise PlanInvalid(name, "unknown field")
        if value is None:
            continue
        if name in _ENUMS:
            if value not in _ENUMS[name]:
                raise PlanInvalid(name, f"must be {' or '.join(_ENUMS[name])}")
        elif name in _BOOLS:
            if not isinstance(value, bool):
                raise PlanInvalid(name, "must be a boolean")
        else:
            low, high = _INTS[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise PlanInvalid(name, "must be an integer")
            if not low <= value <= high:
                raise PlanInvalid(name, f"must be between {low} and {high}")
        out[name] = value
    return out


def plan_for(request: dict[str, Any]) -> dict[str, Any]:
    """The full plan the device receives: mode, and every field with its mode default applied."""
    f = _typed(request)
    impact = f.get("impact", "running")
    placement = f.get("placement", "online")
    quick = f.get("quick", False)
    if placement == "offline" and impact == "running":
        raise PlanInvalid("placement", "offline (a test boot) requires impact stopped")
    stopped = impact == "stopped"
    if quick and stopped:
        raise PlanInvalid("quick", "the Quick preset is for Live (impact running) only")
    mode = ("test_boot" if placement == "offline" else "full_online") if stopped else (
        "live_quick" if quick else "live")
    if mode != "test_boot":
        for name in ("kernelPasses", "holdOnFailure"):
            if f.get(name):
                raise PlanInvalid(name, "applies to a test boot (placement offline) only")
    if mode == "live_quick":
        if f.get("passes", 1) != 1:
            raise PlanInvalid("passes", "the Quick preset runs one pass")
        if f.get("bitFade"):
            raise PlanInvalid("bitFade", "the Quick preset has no idle-decay check")
    plan = {"mode": mode, "impact": impact, "placement": placement, "quick": quick,
            "passes": f.get("passes", 2 if stopped else 1),
            "kernelPasses": f.get("kernelPasses", 4),
            "bitFade": f.get("bitFade", stopped),
            "holdOnFailure": f.get("holdOnFailure", False),
            "timeBudgetSeconds": f.get("timeBudgetSeconds", 7200)}
    if "maxBytes" in f:
        plan["maxBytes"] = f["maxBytes"]
    return plan


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
    """What the device says runs (a status read, the hello's memoryTestRunning); None: nothing."""
    status: dict[str, Any] | None


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


_ANY = {Start: "_start", Cancel: "_cancel", Progress: "_progress", Observed: "_observed",
        Finished: "_finished", Reset: "_reset"}
# Device-sent events are legal everywhere (the device may report at any moment). A start's
# acceptance may arrive after the run's own result (a short run; replies and events take different
# paths to the actor), so it is legal everywhere too; a refusal only while the start is in flight.
TRANSITIONS: dict[RunState, dict[type, str]] = {
    RunState.IDLE: {**_ANY, StartAccepted: "_accepted_late"},
    RunState.STARTING: {**_ANY, StartAccepted: "_accepted", StartRefused: "_refused"},
    RunState.RUNNING: {**_ANY, StartAccepted: "_accepted_late"},
}


def operation(status: dict[str, Any], result: dict[str, Any] | None = None) -> dict[str, Any]:
    """The device-state-stream payload of a memory test: phase, pass, pattern, coverage, rate,
    errors, temperature (and outcome and verdict once it ended)."""
    total = status.get("totalBytes") or 0
    covered = status.get("coverageBytes") or 0
    temp = status.get("tempMilliC")
    out = {"kind": "memory_test", "runId": status.get("runId"), "phase": status.get("phase"),
           "pass": status.get("pass"), "passes": status.get("passes"), "pattern": status.get("pattern"),
           "coverage": round(covered / total, 4) if total else None, "coverageBytes": covered,
           "totalBytes": total, "rate": status.get("rateBps"), "etaSeconds": status.get("etaSeconds"),
           "errors": status.get("errors"), "confirmedErrors": status.get("confirmedErrors"),
           "temperature": temp / 1000 if isinstance(temp, (int, float)) and temp >= 0 else None}
    if result is not None:
        out.update(outcome=result.get("outcome"), verdict=result.get("verdict"))
    return out


_END_PHASE = {"pass": "done", "fail": "failed", "cancelled": "cancelled", "interrupted": "interrupted",
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

    def handle(self, event: object, now: dt.datetime) -> list[object]:
        method = TRANSITIONS[self.state].get(type(event))
        if method is None:
            raise IllegalTransition(self.state, event)
        return getattr(self, method)(event, now)

    def next_deadline(self) -> dt.datetime | None:
        return None  # nothing here waits on time: the rate limit is checked when a start arrives

    # -- transitions (each checks, computes effects, then commits) -------------------------------
    def _start(self, event: Start, now: dt.datetime) -> list[object]:
        if self.state is not RunState.IDLE:
            raise Busy(self.status)
        caps = event.capabilities or {}
        if event.plan["mode"] == "test_boot":
            if not caps.get("offline"):
                raise Unsupported(caps.get("offlineReason") or TEST_BOOT_UNSUPPORTED)
        elif not caps.get("online"):
            raise Unsupported(NO_MEMORY_TEST)
        if self.last_accepted_at is not None and now - self.last_accepted_at < RATE_LIMIT:
            raise TooSoon((self.last_accepted_at + RATE_LIMIT - now).total_seconds())
        self.state = RunState.STARTING
        # What a second caller is told while the device has not answered yet.
        self.status = {"runId": event.run_id, "plan": event.plan, "phase": "preparing"}
        return [SendStart(event.run_id, event.plan)]

    def _accepted(self, event: StartAccepted, now: dt.datetime) -> list[object]:
        pending = self.status or {}
        status = {**pending, **event.status}
        status.setdefault("plan", pending.get("plan"))
        self.last_accepted_at = now
        return self._become(status)

    def _accepted_late(self, event: StartAccepted, now: dt.datetime) -> list[object]:
        self.last_accepted_at = now  # the run already reported; only the start rate is left to record
        return []

    def _refused(self, event: StartRefused, now: dt.datetime) -> list[object]:
        if event.running:
            return self._become(event.running)
        self.state, self.status = RunState.IDLE, None
        return []

    def _cancel(self, event: Cancel, now: dt.datetime) -> list[object]:
        if self.state is RunState.STARTING:
            raise Busy(self.status)  # its start is still on the way; cancel once it answered
        if (self.state is RunState.RUNNING and event.run_id is not None
                and event.run_id != (self.status or {}).get("runId")):
            raise NotRunning(f"memory test {event.run_id} is not the one running on this device")
        return [SendCancel(event.run_id)]

    def _progress(self, event: Progress, now: dt.datetime) -> list[object]:
        if self.state is RunState.STARTING and event.status.get("runId") == (self.status or {}).get("runId"):
            self.status = {**self.status, **event.status}  # early progress of the start in flight
            return [Publish(operation(self.status))]
        if self.state is RunState.STARTING:
            return []  # another run's late report: the start's answer decides
        last = self.status or {}
        if (self.state is RunState.IDLE and last.get("runId") == event.status.get("runId")
                and last.get("phase") in TERMINAL_PHASES and event.status.get("phase") not in TERMINAL_PHASES):
            return []  # a report from before the run's end, arriving after it: stale
        return self._become(event.status, publish=True)

    def _observed(self, event: Observed, now: dt.datetime) -> list[object]:
        if self.state is RunState.STARTING:
            return []
        if event.status is None or event.status.get("phase") in TERMINAL_PHASES:
            if self.state is RunState.IDLE:
                if event.status is not None and event.status != self.status:
                    self.status = event.status
                    return [SaveStatus(event.status)]
                return []
            self.state = RunState.IDLE
            return [SaveStatus(self.status)] if self.status is not None else []
        return self._become(event.status, publish=event.status != self.status)

    def _finished(self, event: Finished, now: dt.datetime) -> list[object]:
        result = event.result
        effects: list[object] = [StoreResult(result)]
        run_id = result.get("runId")
        ours = self.status is not None and self.status.get("runId") == run_id
        if self.state is RunState.STARTING and not ours:
            return effects  # an older run's report (an interrupted test) while a new one starts
        if ours and self.state is RunState.IDLE and self.status.get("phase") in TERMINAL_PHASES \
                and self.status.get("outcome") == result.get("outcome"):
            return effects  # the device re-sent a result the hub already ended the run with
        if ours or self.state is RunState.IDLE:
            ended = {**(self.status if ours else {}), "runId": run_id, "plan": result.get("plan")
                     or (self.status or {}).get("plan"),
                     "phase": _END_PHASE.get(result.get("outcome"), "done"),
                     "testedBytes": result.get("testedBytes"), "coverageBytes": result.get("coverageBytes"),
                     "totalBytes": result.get("totalBytes"), "errors": result.get("errorCount"),
                     "startedAt": result.get("startedAt"), "outcome": result.get("outcome")}
            if self.state is RunState.IDLE and not ours and self.status is not None \
                    and _newer(self.status, ended):
                return effects  # a late re-send of an older result: the last run stays the newer one
            self.state, self.status = RunState.IDLE, ended
            effects += [SaveStatus(ended), Publish(operation(ended, result))]
        return effects

    def _reset(self, event: Reset, now: dt.datetime) -> list[object]:
        if self.state is RunState.STARTING:
            self.state, self.status = RunState.IDLE, None
        return []

    def _become(self, status: dict[str, Any], *, publish: bool = True) -> list[object]:
        if status.get("phase") in TERMINAL_PHASES:
            self.state = RunState.IDLE
        else:
            self.state = RunState.RUNNING
        changed_run = (self.status or {}).get("runId") != status.get("runId")
        self.status = status
        effects: list[object] = [Publish(operation(status))] if publish else []
        if changed_run or self.state is RunState.IDLE:
            effects.append(SaveStatus(status))
        return effects


def _newer(current: dict[str, Any], other: dict[str, Any]) -> bool:
    a, b = current.get("startedAt"), other.get("startedAt")
    return isinstance(a, str) and isinstance(b, str) and a > b


# -- MemoryFault and diagnosis ---------------------------------------------------------------------
def bad_pages(result: dict[str, Any]) -> set[int]:
    """Distinct page addresses a result found bad: its retired pages, pages with confirmed errors,
    and the kernel sweep's bad ranges (page by page, capped: past the cap the fault is certain)."""
    page = int(result.get("pageSize") or PAGE_SIZE)
    out = {int(a) // page * page for a in result.get("retired") or [] if isinstance(a, int)}
    for entry in result.get("pages") or []:
        if not isinstance(entry, dict):
            continue
        addr = entry.get("physAddr")
        if addr is None:
            addr = entry.get("page")  # the mapping's address where physical ones were not readable
        confirmed = entry.get("confirmed", entry.get("confirmedErrors", 0))
        if isinstance(addr, int) and confirmed:
            out.add(addr // page * page)
    for r in (result.get("kernel") or {}).get("badRanges") or []:
        if not isinstance(r, dict) or not isinstance(r.get("start"), int):
            continue
        end = r.get("end") if isinstance(r.get("end"), int) else r["start"] + int(r.get("length") or page)
        for addr in range(r["start"] // page * page, end, page):
            out.add(addr)
            if len(out) > 4 * FAULT_BYTES // page:
                return out
    return out


def memory_fault(*, retired: int, bad_bytes: int, verdict: str | None,
                 since: str | None = None) -> dict[str, Any] | None:
    """The MemoryFault condition (spec: States → MemoryFault condition), or None when none holds."""
    reasons = []
    if retired > FAULT_PAGES:
        reasons.append(f"{retired} pages retired (more than {FAULT_PAGES})")
    if bad_bytes > FAULT_BYTES:
        reasons.append(f"{bad_bytes} bytes of distinct memory bad (more than 1 MiB)")
    if verdict in FAULT_VERDICTS:
        reasons.append(f"verdict {verdict}")
    if not reasons:
        return None
    return {"type": "MemoryFault", "badge": "Memory fault", "severity": "critical", "status": True,
            "reason": "; ".join(reasons), "retiredPages": retired, "badBytes": bad_bytes, "verdict": verdict,
            "since": since}


def diagnosis(conditions: list[dict[str, Any]], newest_result: dict[str, Any] | None,
              refused: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The device's issues: a MemoryFault is critical; a newest memory test that was interrupted
    is a warning (it says where it stopped; it is never retried as a test boot by itself); frames the
    link refused as too big are a warning (``refused``: count, lastAt, lastFrame, lastBytes); a newest
    result whose page map was summarised is an info saying how much of it the result lists."""
    issues = []
    for c in conditions:
        if c.get("type") == "MemoryFault":
            issues.append({"severity": "critical", "code": "MemoryFault", "title": "Memory fault",
                           "message": f"memory fault: {c.get('reason')}", "since": c.get("since"),
                           "details": {k: c.get(k) for k in ("retiredPages", "badBytes", "verdict")}})
    if newest_result is not None and newest_result.get("outcome") == "interrupted":
        where = newest_result.get("interrupted") or {}
        issues.append({"severity": "warning", "code": "MemoryTestInterrupted", "title": "Memory test interrupted",
                       "message": (f"memory test {newest_result.get('runId')} was interrupted in phase "
                                   f"{where.get('phase')}, pass {where.get('pass')}, pattern {where.get('pattern')}"),
                       "since": newest_result.get("finishedAt") or newest_result.get("startedAt"),
                       "details": {"runId": newest_result.get("runId"), **where}})
    if refused and refused.get("count"):
        issues.append({"severity": "warning", "code": "LinkFramesRefused", "title": "Frames refused as too big",
                       "message": (f"the hub refused {refused['count']} frame(s) from this device as over the "
                                   f"link's limit, the last a {refused.get('lastFrame')} frame of "
                                   f"{refused.get('lastBytes')} bytes; the device trims or drops such a frame "
                                   "and reconnects"),
                       "since": refused.get("lastAt"), "details": dict(refused)})
    summary = (newest_result or {}).get("pageSummary")
    if isinstance(summary, dict) and (summary.get("omittedPages") or (newest_result or {}).get("trimmed")):
        trimmed = (newest_result or {}).get("trimmed")
        issues.append({"severity": "info", "code": "MemoryTestPageMapSummarised",
                       "title": "Memory test page map summarised",
                       "message": (f"memory test {newest_result.get('runId')} found errors on "
                                   f"{summary.get('pagesWithErrors')} pages; its result lists the "
                                   f"{summary.get('listedPages')} with the most errors and sums up the other "
                                   f"{summary.get('omittedPages')} pages ({summary.get('omittedErrors')} errors)"
                                   + (f"; the device trimmed it after a refusal: {trimmed.get('reason')}"
                                      if isinstance(trimmed, dict) else "")),
                       "since": newest_result.get("finishedAt"),
                       "details": {"runId": newest_result.get("runId"), **summary,
                                   **({"trimmed": trimmed} if isinstance(trimmed, dict) else {})}})
    return issues
