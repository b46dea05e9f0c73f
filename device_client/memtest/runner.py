"""One memory test run: phases, passes, patterns, the time budget, cancellation and progress.

Phases are the spec's only (``PHASES``); what the spec does not name is the status's ``step``. In
order: ``preparing`` (map and lock the memory), ``kernel_sweep`` (test boot only; step ``kernel``),
``testing`` (step ``patterns``: the suite, ``passes`` times; then step ``idle_decay``, once after the
last pass when bitFade is on: write, wait 5 minutes on the clock, verify), ``confirming``
(confirm.py), then the result. The tester adds ``stopping_workload``, ``retiring``, ``restoring``,
``rebooting`` and the ends (``done``, ``failed``, ``cancelled``, ``interrupted``; ``idle`` before any).

Numpy work runs in the trio thread in chunks of 4 MiB with a checkpoint every other chunk, so
the agent keeps answering commands and heartbeats, and time passes only in real waits: on trio's
autojump clock a 5-minute idle decay or the budget costs nothing. The time budget is a deadline on
the clock: when it passes the run stops where it is and ends with outcome error, message "time
budget reached", keeping what it found. ``cancel()`` ends it with outcome cancelled, also keeping
what it found. A cancellation from outside (the agent stopping: a power loss, as far as the run
knows) ends it with no result: its checkpoint stays on disk and the next boot reports it.

Outcomes: pass (no mismatch), fail (any mismatch; the verdict says what kind), cancelled, error,
interrupted (reported by the tester at boot). Retirement: confirmed pages, unless the verdict is a
line fault (retiring pages cannot fix a data or address line; MemoryFault is raised by the verdict).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import trio

from ..shared.clock import Clock, rfc3339
from ..shared.protocol import MEMTEST_PHASES
from ..shared import pagemap
from .confirm import IDLE_DECAY_S, confirm
from .engine import PAGE, Engine, Region
from .faults import FaultModel
from .hwsim import Hardware
from .patterns import Address, Pair, Pattern, full_suite
from .plan import BACKOFF_WAIT_S, MIN_BYTES, MemInfo
from .retire import FAULT_PAGES
from .bounds import KERNEL_RANGES, MESSAGE_MAX, RESULT_ERRORS, RESULT_PAGES, page_summary
from .verdict import Findings, error_entry, verdict

log = logging.getLogger("fleethub.agent.memtest")

PROGRESS_EVERY = 1.0  # seconds: memtest.progress events
YIELD_EVERY = 2  # chunks between trio checkpoints
FAULT_BYTES = 1 << 20
LINE_VERDICTS = ("data_line", "address_line")
PHASES = MEMTEST_PHASES  # the spec's: the only values ``phase`` takes
BUDGET_MESSAGE = "time budget reached"


class Run:
    def __init__(self, run_id: str, plan: dict[str, Any], *, size: int, clock: Clock, hw: Hardware,
                 checkpoint: Callable[[dict[str, Any]], None],
                 progress: Callable[[dict[str, Any]], Awaitable[None]],
                 meminfo: Callable[[], MemInfo] | None = None, fault: str | None = None,
                 fault_seed: int = 1, ignored_pages: set[int] | None = None, physical: bool = True,
                 chunk_words: int = 1 << 19, seed: int | None = None) -> None:
        self.run_id, self.plan, self.size, self.clock, self.hw = run_id, plan, size, clock, hw
        self._checkpoint, self._progress, self._meminfo = checkpoint, progress, meminfo
        self.fault_kind, self.fault_seed, self.physical = fault, fault_seed, physical
        self.chunk_words = chunk_words
        self.seed = secrets.randbits(63) if seed is None else seed
        self.findings = Findings(ignored_pages)
        self.kernel = Findings(ignored_pages)
        self.started_at = clock.now()
        self.started = trio.current_time()
        self.phase, self.pass_no, self.pattern = "preparing", 0, None
        self.step: str | None = None  # the sub-step of a phase the spec does not name (see PHASES)
        self.patterns_run: list[str] = []
        self.max_temp: float | None = None
        self.backoffs = 0
        self.cancelled = False
        self.region: Region | None = None
        self.engine: Engine | None = None
        self._scope: trio.CancelScope | None = None
        self._last_progress = -1e9
        self._planned = 1
        self._yields = 0
        self.pages_retested: list = []
        self._current = self.findings

    # ---- control and status ----

    def cancel(self) -> None:
        self.cancelled = True
        if self._scope is not None:
            self._scope.cancel()

    def status(self) -> dict[str, Any]:
        done = self.engine.verified_bytes if self.engine else 0
        total = self.region.active_bytes if self.region else self.size
        elapsed = max(trio.current_time() - self.started, 1e-9)
        rate = int(done / elapsed) if done else 0
        temp = self._temp()
        return {"runId": self.run_id, "plan": self.plan, "phase": self.phase, "step": self.step, "pass": self.pass_no,
                "passes": self.plan["passes"], "pattern": self.pattern, "testedBytes": done,
                "coverageBytes": min(done, total), "totalBytes": total, "rateBps": rate,
                # to a tenth: whole seconds made the last second of a run read 0 left (and the hub's
                # progress, done / (done + eta × rate), 100 %) while work remained
                "etaSeconds": round(max(0, self._planned - done) / rate, 1) if rate else None,
                "errors": self.findings.count + self.kernel.count,
                "confirmedErrors": sum(p.errors for p in self.findings.confirmed_pages()),
                "tempMilliC": None if temp is None else int(temp * 1000),
                "startedAt": rfc3339(self.started_at)}

    def where(self) -> dict[str, Any]:
        return {"runId": self.run_id, "plan": self.plan, "startedAt": rfc3339(self.started_at),
                "phase": self.phase, "step": self.step, "pass": self.pass_no, "pattern": self.pattern}

    def _temp(self) -> float | None:
        temp = self.hw.temp_c()
        if temp is not None and (self.max_temp is None or temp > self.max_temp):
            self.max_temp = temp
        return temp

    async def _enter(self, phase: str, pattern: str | None = None, step: str | None = None) -> None:
        assert phase in PHASES, phase
        self.phase, self.pattern, self.step = phase, pattern, step
        if pattern is not None and pattern not in self.patterns_run:
            self.patterns_run.append(pattern)
        self._checkpoint(self.where())
        await self._tick(force=True)

    async def _tick(self, force: bool = False) -> None:
        now = trio.current_time()
        if force or now - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = now
            try:
                await self._progress(self.status())
            except Exception:  # a progress report that cannot go out must not stop the test
                log.exception("memtest: progress report failed")

    async def _pause(self) -> None:
        self._yields += 1
        if self._yields % YIELD_EVERY == 0:
            await trio.lowlevel.checkpoint()
            await self._tick()

    async def _sweep(self, sweep: Any) -> None:
        for _ in sweep:
            await self._pause()

    # ---- the run ----

    async def execute(self) -> dict[str, Any]:
        """Run to the end, the budget, or cancel(); the result. Outside cancellation propagates."""
        outcome, message = None, None
        try:
            with trio.CancelScope() as self._scope:
                with trio.move_on_at(self.started + self.plan["timeBudgetSeconds"]) as budget:
                    try:
                        await self._work()
                    except MemoryError as exc:
                        outcome, message = "error", f"could not map the memory to test: {exc}"
                    except OSError as exc:
                        outcome, message = "error", f"could not map the memory to test: {exc.strerror or exc}"
                if budget.cancelled_caught:
                    outcome, message = "error", BUDGET_MESSAGE
            if self.cancelled:
                outcome, message = "cancelled", "cancelled"
            return self._result(outcome, message)
        finally:
            if self.region is not None:
                self.region.close()

    async def _work(self) -> None:
        await self._enter("preparing")
        # in the trio thread, as all of a run's work: a worker thread would let an autojump clock
        # leap to the budget's deadline while the mapping is made
        self.region = Region(max(MIN_BYTES, self.size), physical=self.physical, prepare=False)
        await self._sweep(self.region.prepare())
        fault = (FaultModel(self.fault_kind, self.region.words.size, seed=self.fault_seed)
                 if self.fault_kind else None)
        self.engine = Engine(self.region, self._sink, chunk_words=self.chunk_words, fault=fault)
        self.findings.reserve(self.region.nbytes // PAGE)
        self.kernel.reserve(self.region.nbytes // PAGE)
        self.hw.heat_bytes = 64 * self.region.nbytes if self.hw.simulated else self.hw.heat_bytes
        suite = full_suite(self.seed, idle_decay=False)
        sweeps = sum(len(p.steps) for p in suite) + 2
        self._planned = self.region.nbytes * (sweeps * self.plan["passes"] + self.plan["bitFade"]
                                              + (2 * self.plan.get("kernelPasses", 0)
                                                 if self.plan["mode"] == "test_boot" else 0))
        if self.plan["mode"] == "test_boot":
            await self._kernel_sweep()
        for pass_no in range(1, self.plan["passes"] + 1):
            self.pass_no = self.findings.pass_no = pass_no
            for pattern in suite:
                await self._pattern(pattern)
        if self.plan["bitFade"]:
            await self._idle_decay(full_suite(self.seed, idle_decay=True)[-1])
        if self.findings.count:
            await self._enter("confirming")
            self.pages_retested = await confirm(self.findings, self.engine, pause=self._pause,
                                                idle_wait=self._idle_wait)

    def _sink(self, *args: Any) -> None:
        self._current.add(*args)

    async def _conditions(self) -> None:
        temp = self._temp()
        self.findings.temp_c = self.kernel.temp_c = temp
        assert self.engine is not None
        self.engine.conditions(idle_seconds=0.0, temp_c=temp if temp is not None else 0.0)

    async def _kernel_sweep(self) -> None:
        """Simulated: the kernel's sweep before user space is kernelPasses sweeps of the same
        memory, each a stuck-address step and a moving inversion of zeros (memtest= style)."""
        assert self.engine is not None
        self._current = self.kernel
        for k in range(self.plan.get("kernelPasses", 4)):
            self.pass_no = k + 1
            await self._enter("kernel_sweep", "kernel", step="kernel")
            await self._conditions()
            await self._sweep(self.engine.step(Address("kernel", k)))
            await self._sweep(self.engine.moving_inversion(Pair("kernel", k, 0)))
            self.hw.heat(3 * self.region.active_bytes)  # type: ignore[union-attr]
        self.pass_no = 0

    async def _pattern(self, pattern: Pattern) -> None:
        assert self.engine is not None and self.region is not None
        self._current = self.findings
        await self._enter("testing", pattern.name, step="patterns")
        for step in pattern.steps:
            await self._back_off_if_tight()
            await self._conditions()
            if pattern.special == "moving_inversions":
                await self._sweep(self.engine.moving_inversion(step))  # type: ignore[arg-type]
            else:
                await self._sweep(self.engine.step(step))
            self.hw.heat(2 * self.region.active_bytes)

    async def _idle_decay(self, pattern: Pattern) -> None:
        assert self.engine is not None
        self._current = self.findings
        await self._enter("testing", pattern.name, step="idle_decay")
        step = pattern.steps[0]
        await self._sweep(self.engine.write(step))
        await self._idle_wait(IDLE_DECAY_S)
        self.engine.inject(step)
        await self._sweep(self.engine.verify(step))
        self.engine.conditions(idle_seconds=0.0)

    async def _idle_wait(self, seconds: float) -> None:
        assert self.engine is not None
        end = trio.current_time() + seconds
        while trio.current_time() < end:  # progress goes on while the data sits (and cools)
            await trio.sleep_until(min(end, trio.current_time() + PROGRESS_EVERY))
            await self._tick()
        temp = self._temp()
        self.findings.temp_c = temp
        self.engine.conditions(idle_seconds=seconds, temp_c=temp if temp is not None else 0.0)

    async def _back_off_if_tight(self) -> None:
        if self.plan["mode"] not in ("live", "live_quick") or self._meminfo is None or self.region is None:
            return
        info = self._meminfo()
        if info.tight and self.region.active_bytes > MIN_BYTES:
            self.backoffs += 1
            log.info("memtest: memory is tight (available %d of %d, psi %s); testing half as much",
                     info.available, info.total, info.psi_some_avg10)
            self.region.shrink(self.region.active_bytes // 2)
            await trio.sleep(BACKOFF_WAIT_S)

    # ---- the result ----

    def page_map(self, result: dict[str, Any]) -> bytes | None:
        """The full per-page error map (pagemap.py), when the result could not list every page."""
        if not (result.get("pageSummary") or {}).get("omittedPages"):
            return None
        f = self.findings
        bad = np.flatnonzero(f.counts)
        pfns = self.region.pfns if self.region is not None else None
        addresses = pfns[bad].astype(np.int64) * PAGE if pfns is not None else bad.astype(np.int64) * PAGE
        runs = pagemap.runs_of(addresses, f.counts[bad], PAGE)
        return pagemap.encode(self.run_id, runs, page_size=PAGE, address_kind=result["addressKind"],
                              error_count=f.count)

    def failed(self, message: str) -> dict[str, Any]:
        """The result of a run that broke (outcome error), with what it had found."""
        if self.region is not None:
            self.region.close()
        return self._result("error", message)

    def _result(self, outcome: str | None, message: str | None) -> dict[str, Any]:
        """The spec's result members (Resources → Memory test) and our documented extensions
        (docs/memtests.md)."""
        region, f = self.region, self.findings
        address = region.page_address if region is not None else (lambda page: page * PAGE)
        verdict_ = verdict(f) if f.count else ("ok" if not self.kernel.count else "unknown")
        if outcome is None:
            outcome = "pass" if f.count + self.kernel.count == 0 else "fail"
        line = verdict_ in LINE_VERDICTS
        # only the pages confirmation retested can be confirmed, so retired: at most CONFIRM_MAX_PAGES
        for retested in f.pages.values():
            retested.retired = bool(retested.confirmed) and not line
        retired = sorted(address(p.page) for p in f.pages.values() if p.retired)
        pages = []
        for number in f.top(RESULT_PAGES):  # bounded: the pages with the most errors first
            page = f.page(number)
            pages.append({"page": address(page.page), "physAddr": address(page.page) if region and
                          region.address_kind == "physical" else None, "offset": page.page * PAGE,
                          "errors": page.errors, "confirmed": page.confirmed, "rounds": page.rounds,
                          "reproduced": page.reproduced, "intermittent": page.intermittent,
                          "retired": page.retired})
        summary = page_summary([], pages, f.count, f.pages_with_errors())
        summary["fullMap"] = bool(summary["omittedPages"])  # the device uploads it (pagemap.py)
        confirmed = {p.page for p in f.pages.values() if p.confirmed}
        bad_bytes = len(f.confirmed_pages()) * PAGE
        reasons = []
        if len(retired) > FAULT_PAGES:
            reasons.append(f"{len(retired)} pages retired (more than {FAULT_PAGES})")
        if bad_bytes > FAULT_BYTES:
            reasons.append(f"{bad_bytes} bytes of distinct memory bad (more than 1 MiB)")
        if line:
            reasons.append(f"verdict {verdict_}")
        kernel = None
        if self.plan["mode"] == "test_boot":
            kpages = self.kernel.bad_page_numbers(KERNEL_RANGES)
            kernel = {"passes": self.plan.get("kernelPasses", 4), "errors": self.kernel.count,
                      "simulated": True, "badPages": self.kernel.pages_with_errors(),
                      "badRanges": [{"start": address(p), "end": address(p) + PAGE} for p in kpages]}
        status = self.status()
        kind = region.address_kind if region is not None else "virtual"
        return {
            "runId": self.run_id, "plan": self.plan, "mode": self.plan["mode"], "outcome": outcome,
            "verdict": verdict_, "summary": one_line(outcome, verdict_, f.count, summary["pagesWithErrors"],
                                                     len(retired), message),
            "patternsRun": list(self.patterns_run), "seed": self.seed,
            "message": None if message is None else message[:MESSAGE_MAX],
            "startedAt": rfc3339(self.started_at), "finishedAt": rfc3339(self.clock.now()),
            "durationSeconds": round(trio.current_time() - self.started, 3),
            "passesCompleted": self.pass_no if outcome in ("pass", "fail") else max(0, self.pass_no - 1),
            "testedBytes": status["testedBytes"], "coverageBytes": status["coverageBytes"],
            "totalBytes": status["totalBytes"], "pageSize": PAGE,
            "addressKind": kind,
            "locked": bool(region and region.locked), "backoffs": self.backoffs,
            "errorCount": f.count,
            "errors": [error_entry(m, address, confirmed) for m in f.details[:RESULT_ERRORS]],
            "confirmedErrors": status["confirmedErrors"], "pages": pages, "pageSummary": summary,
            "retired": retired,
            "kernel": kernel, "fault": bool(reasons),
            "faultReason": "; ".join(reasons) or None,
            "maxTempMilliC": None if self.max_temp is None else int(self.max_temp * 1000),
            "simulatedFault": self.fault_kind,
        }


def one_line(outcome: str, verdict_: str, errors: int, pages: int, retired: int, message: str | None) -> str:
    """The result's ``summary``: what an operator reads first."""
    text = f"{outcome}: {verdict_}"
    if errors:
        text += f", {errors:,} errors on {pages:,} pages, {retired} retired"
    return text + (f" ({message[:100]})" if message and outcome not in ("pass", "fail") else "")
