"""The device's memory tester as the agent sees it: verbs, hello fields and boot/link/shutdown hooks.

Verbs (device_client/shared/protocol.py, "Memory tests"): memtest.start, memtest.cancel, memtest.status,
memtest.ack. One run at a time. A run lives in the agent's nursery (it outlives links); its result
is saved (store.py) and sent as ``memtest.result`` now and at every link until acknowledged.

Modes: Live and Live Quick test beside the workload. Full online holds (stops) the workload first
(``workload_stop_failed`` if it would not stop, and nothing runs), drops the page cache on a real
device run as root (never on a simulated one: that would be the host's cache), and always releases
the workload at the end, whatever the end. A test boot records the request, answers with phase
``rebooting`` and reboots with boot reason ``memory_test``; the boot with that reason holds the
workload before it starts (this module's boot hook runs before the configuration's), comes up in
maintenance, runs the (simulated) kernel sweep and the full suite, sends the result and reboots with
reason ``memory_test_done`` (a documented extension: the spec names only ``memory_test``), after
which the workload starts. With holdOnFailure a failed test boot stays held in maintenance (phase
``failed``, step ``holding``) for ``HOLD_SECONDS`` on the clock, or until memtest.cancel. A test boot
is never run twice: a boot that finds it already started reports it interrupted.

Phases the tester reports around the runner's (all the spec's): ``stopping_workload`` (full online,
before the workload stops), ``rebooting`` (a test boot's start), ``retiring`` (pages taken out of
use), ``restoring`` (the workload released; a test boot's reboot back to service), and ``idle`` in a
status read when no test ever ran.

Simulated devices (``MemtestConfig.simulated``, the default outside ``fleethub agent`` on real
hardware) test at most ``budget`` bytes, may carry a fault model (faults.py), report addresses as
offsets of their memory, read hwsim's simulated temperature and EDAC counters, and never touch
/proc/sys/vm/drop_caches or soft_offline_page.
"""

from __future__ import annotations

import logging
import os
import platform
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..shared import protocol
from ..shared.clock import rfc3339
from ..commands import CommandError
from ..imports import load
from . import bounds
from . import plan as plans
from .hwsim import Hardware
from .retire import FAULT_PAGES, soft_offline
from .upload import upload_page_maps
from .store import MemtestStore

if TYPE_CHECKING:
    from ..context import DeviceContext
    from .runner import Run

log = logging.getLogger("fleethub.agent.memtest")

HOLD_SECONDS = 1800.0  # spec: Limits, hold in maintenance
TEST_BOOT_DONE = "memory_test_done"  # boot reason of the reboot back to service (documented extension)
CANCEL_WAIT = 10.0
TEST_BOOT_UNSUPPORTED = "test boot is not supported by this board's bootloader yet"
NO_MEMORY_TEST = "this device's firmware has no memory test"
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
PAGE = 4096


@dataclass
class MemtestConfig:
    enabled: bool = True  # False: firmware without memory tests (supported false)
    # False: the board's bootloader cannot do a test boot (offlineReason TEST_BOOT_UNSUPPORTED). True
    # here for simulated devices; ``fleethub agent`` on a real device sets it from --memtest-test-boot
    # (memtest.agent_config), False unless the device maker says the board supports it.
    test_boot: bool = True
    simulated: bool = True  # False only for a real device (fleethub agent without budget or fault)
    budget: int | None = 64 << 20  # bytes a run may test at most; None: no cap
    fault: str | None = None  # faults.KINDS: simulated faulty memory
    fault_seed: int = 1
    chunk_words: int = 1 << 19
    meminfo: Callable[[], plans.MemInfo] | None = None  # default: /proc/meminfo and PSI


class MemoryTester:
    def __init__(self, device: DeviceContext, config: MemtestConfig | None = None) -> None:
        self.device = device
        self.config = config or MemtestConfig()
        self.store = MemtestStore(device.data_dir)
        self.hw = Hardware(simulated=self.config.simulated)
        self.run: Run | None = None
        self.maintenance = False
        self.holding = False
        self._done = trio.Event()
        self._release_hold = trio.Event()
        self._task_scope: trio.CancelScope | None = None
        self._last_status: dict[str, Any] | None = None
        self._starting = False
        self._uploading = False

    # ---- wiring ----

    def attach(self) -> MemoryTester:
        device, enabled = self.device, self.config.enabled
        device.capabilities.memoryTest = protocol.MemoryTestCapabilities(
            online=enabled, offline=enabled and self.config.test_boot,
            offlineReason=None if enabled and self.config.test_boot else (
                TEST_BOOT_UNSUPPORTED if enabled else NO_MEMORY_TEST))
        device.add_hello_provider(self._hello)
        device.on_event_too_big("memtest.result", self._trim_result)
        if not enabled:
            return self
        device.register("memtest.start", self._start)
        device.register("memtest.cancel", self._cancel)
        device.register("memtest.status", self._status)
        device.register("memtest.ack", self._ack)
        device.add_boot_hook(self.boot)
        device.add_link_hook(self._link)
        device.add_shutdown_hook(self._shutdown)
        return self

    @property
    def running(self) -> bool:
        return self.run is not None and not self._done.is_set()

    def _hello(self) -> dict[str, Any]:
        history = self.store.history()
        return {"retiredPages": bounds.retired_listed(self.store.retired()),
                "lastMemoryTest": history[0] if history else None,
                "memoryTestRunning": self.run.status() if self.running else None,  # type: ignore[union-attr]
                "workloadHeld": self.device.workload.held, "maintenance": self.maintenance}

    def health(self) -> dict[str, Any]:
        retired = self.store.retired()
        history = self.store.history()
        last = history[0] if history else None
        fault = len(retired) > FAULT_PAGES or bool(last and last.get("fault"))
        reason = (last or {}).get("faultReason") if last and last.get("fault") else (
            f"{len(retired)} pages retired (more than {FAULT_PAGES})" if fault else None)
        return {"capabilities": self.device.capabilities.memoryTest.model_dump(),
                "hardwareCorruptedBytes": self.hw.hardware_corrupted_bytes(len(retired), PAGE),
                "edac": self.hw.edac(), "simulated": self.config.simulated,
                "retiredPages": len(retired), "retired": bounds.retired_listed(retired), "fault": fault,
                "faultReason": reason,
                "kernelErrors": [line[:bounds.KERNEL_LINE_MAX] for line in
                                 self.hw.kernel_lines(retired)[-bounds.KERNEL_LINES:]],
                "lastResult": bounds.brief(last)}

    # ---- verbs ----

    async def _start(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            plan = plans.check(payload.get("plan"))
        except plans.PlanError as exc:
            raise CommandError("invalid", str(exc)) from None
        run_id = str(payload.get("runId") or secrets.token_hex(8))
        if self.running or self._starting or self.holding or self.store.test_boot():
            raise CommandError("busy", "a memory test is already running")
        if plan["mode"] == "test_boot":
            if not self.config.test_boot:
                raise CommandError("unsupported", TEST_BOOT_UNSUPPORTED)
            return await self._request_test_boot(run_id, plan)
        self._starting = True
        stopped = plan["mode"] == "full_online"
        try:
            if stopped:
                await self._progress(_pending_status(run_id, plan, "stopping_workload", self.device.clock))
                await self._stop_workload()
            try:
                await load_runner()
                run = self._new_run(run_id, plan)
                self._launch(run, stopped=stopped, test_boot=False)
            except BaseException:
                if stopped:  # nothing runs: the workload must not stay stopped
                    with trio.CancelScope(shield=True):
                        await self.device.workload.release()
                raise
        finally:
            self._starting = False
        return {"status": run.status()}

    async def _stop_workload(self) -> None:
        workload = self.device.workload
        await workload.hold()
        if workload.running:
            await workload.release()
            raise CommandError("workload_stop_failed", "the workload could not be stopped; nothing was started")
        if not self.config.simulated and os.geteuid() == 0:
            try:  # free the page cache so the test reaches nearly all RAM; a real device only
                os.sync()
                DROP_CACHES.write_text("3\n")
            except OSError as exc:
                log.info("memtest: could not drop caches: %s", exc)

    async def _request_test_boot(self, run_id: str, plan: dict[str, Any]) -> dict[str, Any]:
        now = rfc3339(self.device.clock.now())
        record = {"runId": run_id, "plan": plan, "startedAt": now, "phase": "rebooting", "pass": 0,
                  "pattern": None}
        self.store.set_test_boot({**record, "started": False})
        self.store.checkpoint(record)
        self.device.request_reboot("memory_test")
        status = _pending_status(run_id, plan, "rebooting", self.device.clock)
        self._last_status = status
        return {"status": status}

    async def _cancel(self, payload: dict[str, Any]) -> dict[str, Any]:
        run = self.run
        wanted = payload.get("runId")
        if run is None or not (self.running or self.holding) or (wanted and wanted != run.run_id):
            raise CommandError("not_running", "no memory test is running")
        if self.holding:
            self._release_hold.set()
            status = {**run.status(), "phase": "cancelled"}
            return {"status": status}
        run.cancel()
        with trio.move_on_after(CANCEL_WAIT):
            await self._done.wait()
        return {"status": self._last_status or run.status()}

    async def _status(self, payload: dict[str, Any]) -> dict[str, Any]:
        status = self.run.status() if self.run is not None and (self.running or self.holding) else self._last_status
        if status is None:
            history = self.store.history()
            status = _ended_status(history[0]) if history else _pending_status(None, None, "idle", self.device.clock)
        # brief: eleven full results could pass the frame limit; the hub has them in full
        return {"supported": self.config.enabled, "status": status, "health": self.health(),
                "history": [bounds.brief(r) for r in self.store.history()]}

    async def _ack(self, payload: dict[str, Any]) -> dict[str, Any]:
        ids = payload.get("runIds")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise CommandError("invalid", "runIds must be a list of strings")
        self.store.ack(ids)
        self.device.nursery.start_soon(self._upload_page_maps)  # a map goes up once its result is stored
        return {}

    # ---- runs ----

    def _new_run(self, run_id: str, plan: dict[str, Any]) -> Run:
        from .runner import Run  # loaded by load_runner

        meminfo = self.config.meminfo or plans.read_meminfo
        size = plans.size_for(plan, meminfo(), self.config.budget)
        ignored = {a // PAGE for a in self.store.retired()} if self.config.simulated else None
        return Run(run_id, plan, size=size, clock=self.device.clock, hw=self.hw,
                   checkpoint=self.store.checkpoint, progress=self._progress, meminfo=meminfo,
                   fault=self.config.fault if self.config.simulated else None,
                   fault_seed=self.config.fault_seed, ignored_pages=ignored,
                   physical=not self.config.simulated, chunk_words=self.config.chunk_words)

    def _launch(self, run: Run, *, stopped: bool, test_boot: bool) -> None:
        nursery = self.device.nursery
        if nursery is None:
            raise CommandError("internal", "the agent is not running")
        self.run, self._done, self._release_hold = run, trio.Event(), trio.Event()
        self._last_status = run.status()
        self.store.checkpoint(run.where())  # on disk before it runs: a reboot from here is an interruption
        nursery.start_soon(self._supervise, run, stopped, test_boot)

    async def _progress(self, status: dict[str, Any]) -> None:
        self._last_status = status
        await self.device.send_event("memtest.progress", status)

    async def _supervise(self, run: Run, stopped: bool, test_boot: bool) -> None:
        try:
            with trio.CancelScope() as self._task_scope:
                try:
                    result = await run.execute()
                except Exception as exc:  # a bug in the tester must not take the agent down with it
                    log.exception("memtest %s: the run failed", run.run_id)
                    result = run.failed(f"the tester failed: {type(exc).__name__}: {exc}")
                if stopped and not test_boot:  # restored before the hub hears the run has ended
                    await self._phase(run, "restoring")
                    with trio.CancelScope(shield=True):
                        await self.device.workload.release()
                self._keep_page_map(run, result)
                await self._finish(run, result)
                self.device.nursery.start_soon(self._upload_page_maps)
                if test_boot:
                    await self._end_test_boot(run, result)
        finally:
            if stopped and not test_boot:  # whatever the end: a crash of the run, the agent stopping
                with trio.CancelScope(shield=True):
                    await self.device.workload.release()
            self._done.set()

    async def _finish(self, run: Run, result: dict[str, Any]) -> None:
        retired = result["retired"]
        if retired:
            await self._phase(run, "retiring")
            self.store.add_retired(retired, physical=result["addressKind"] == "physical")
            soft_offline(retired, real=not self.config.simulated, address_kind=result["addressKind"])
        if self.config.simulated:
            self.hw.ce += sum(1 for p in result["pages"] if not p["confirmed"])
            self.hw.ue += sum(1 for p in result["pages"] if p["confirmed"])
        result.update(self._details())
        self.store.add_result(result)
        self.store.clear_checkpoint()
        self._last_status = _ended_status(result)
        log.info("memtest %s: %s (%s), %d errors", run.run_id, result["outcome"], result["verdict"],
                 result["errorCount"])
        await self.device.send_event("memtest.result", {"result": result})

    def _details(self) -> dict[str, Any]:
        """The hardware and versions a result was made with (the spec's run-report details)."""
        facts = getattr(self.device, "facts", None) or {}
        try:
            total = (self.config.meminfo or plans.read_meminfo)().total
        except (OSError, ValueError, KeyError):
            total = None
        agent_module = sys.modules.get("device_client.agent")
        return {"hardware": {"architecture": str(facts.get("architecture") or platform.machine())[:64],
                             "memTotalBytes": total, "simulated": self.config.simulated,
                             "budgetBytes": self.config.budget, "edac": self.hw.edac()},
                "versions": {"agent": getattr(agent_module, "AGENT_VERSION", None),
                             "firmware": str(facts.get("firmware") or platform.platform())[:protocol.FACT_MAX],
                             "engine": f"fleethub memtest 1 (numpy {_numpy_version()})"}}

    async def _phase(self, run: Run, phase: str, step: str | None = None) -> None:
        """A phase of the run's end the runner does not see (retiring, restoring)."""
        run.phase, run.step = phase, step
        status = run.status()
        try:
            await self._progress(status)
        except Exception:  # a report that cannot go out must not stop the ending
            log.exception("memtest %s: progress report failed", run.run_id)

    async def _end_test_boot(self, run: Run, result: dict[str, Any]) -> None:
        if result["outcome"] == "fail" and run.plan.get("holdOnFailure"):
            self.holding = True
            # the test failed; the device holds in maintenance (step holding) until cancel or 30 min
            run.phase, run.step = "failed", "holding"
            self._last_status = run.status()
            await self.device.send_event("memtest.progress", self._last_status)
            with trio.move_on_after(HOLD_SECONDS):
                await self._release_hold.wait()
            self.holding = False
            self._last_status = _ended_status(result)
        self.store.set_test_boot(None)
        self.maintenance = False
        self._last_status = {**(self._last_status or {}), "phase": "restoring", "step": None}
        await self.device.send_event("memtest.progress", self._last_status)
        self._last_status = _ended_status(result)
        self.device.request_reboot(TEST_BOOT_DONE)

    # ---- hooks ----

    async def boot(self) -> None:
        # A boot forgets what ran in memory (an in-process reboot keeps this object): an online test
        # cannot survive a reboot, its checkpoint below makes it an interrupted result, and the last
        # status a read answers is that result's, never the run's last progress.
        self.run, self._last_status = None, None
        self.maintenance = self.holding = False
        physical = self.store.retired_physical()
        if physical:  # soft offlining does not survive a reboot: before the workload starts
            soft_offline(physical, real=not self.config.simulated)
        checkpoint = self.store.load_checkpoint()
        test_boot = self.store.test_boot()
        if (test_boot and not test_boot.get("started") and self.device.boot_reason == "memory_test"):
            await self._begin_test_boot(test_boot)
            return
        if checkpoint is not None:
            self.store.add_result(_interrupted(checkpoint, self.device.clock, self._details()))
            self.store.clear_checkpoint()
        if test_boot:
            self.store.set_test_boot(None)

    async def _begin_test_boot(self, record: dict[str, Any]) -> None:
        await load_runner()  # before any of the state below changes
        self.store.set_test_boot({**record, "started": True})
        await self.device.workload.hold()  # before the configuration's boot hook would start it
        self.maintenance = True
        run = self._new_run(record["runId"], record["plan"])
        self._launch(run, stopped=True, test_boot=True)

    def _trim_result(self, payload: dict[str, Any], reason: str) -> dict[str, Any] | None:
        """The hub refused this result as too big: keep (and from now on send) a trimmed one."""
        result = payload.get("result")
        if not isinstance(result, dict):
            return None
        smaller = bounds.trim(result, reason)
        self.store.replace_result(result.get("runId"), smaller)
        return None if smaller is None else {"result": smaller}

    def _keep_page_map(self, run: Run, result: dict[str, Any]) -> None:
        try:
            body = run.page_map(result)
        except Exception:  # the result matters more than its full map
            log.exception("memtest %s: the page map could not be made", run.run_id)
            return
        if body is not None:
            self.store.save_page_map(run.run_id, body)

    async def _upload_page_maps(self) -> None:
        """Each waiting full page map to the hub (upload.py). Only maps of results the hub acknowledged:
        the hub takes a map of a run whose result it stored."""
        waiting = {str(r.get("runId")) for r in self.store.unacked()}
        maps = [(run_id, path) for run_id, path in self.store.page_maps() if run_id not in waiting]
        if not maps or self._uploading:
            return
        self._uploading = True
        try:
            await upload_page_maps(self.device, maps, self.store.page_map_done)
        finally:
            self._uploading = False

    async def _link(self) -> None:
        self.device.nursery.start_soon(self._upload_page_maps)
        for result in self.store.unacked():
            if not await self.device.send_event("memtest.result", {"result": result}):
                return
        await self.device.send_event("memtest.health", {"health": self.health()})

    async def _shutdown(self) -> None:
        # the agent stops or reboots: to the run this is a power loss (no result; its checkpoint
        # stays for the next boot to report), and a hold does not survive a reboot
        if self._task_scope is not None and self.running:
            self._task_scope.cancel()
            await self._done.wait()
        self.maintenance = False
        self.holding = False
        self.device.workload.held = False


async def load_runner() -> None:
    """The engine (numpy), imported off the trio thread (device_client/imports.py) before the first run:
    an agent that never tests never loads it (bench/agent_footprint.py)."""
    await load(f"{__package__}.runner")


def _ended_status(result: dict[str, Any]) -> dict[str, Any]:
    phase = {"pass": "done", "fail": "failed", "cancelled": "cancelled", "interrupted": "interrupted",
             "error": "failed"}.get(result.get("outcome"), "done")
    plan = result.get("plan") or {}
    return {"runId": result.get("runId"), "plan": plan, "phase": phase, "step": None,
            "pass": result.get("passesCompleted", 0), "passes": plan.get("passes"),
            "pattern": (result.get("interrupted") or {}).get("pattern"),
            "testedBytes": result.get("testedBytes", 0), "coverageBytes": result.get("coverageBytes", 0),
            "totalBytes": result.get("totalBytes", 0), "rateBps": 0, "etaSeconds": 0,
            "errors": result.get("errorCount", 0), "confirmedErrors": result.get("confirmedErrors", 0),
            "tempMilliC": result.get("maxTempMilliC"), "startedAt": result.get("startedAt")}


def _pending_status(run_id: str | None, plan: dict[str, Any] | None, phase: str, clock: Any) -> dict[str, Any]:
    """The status before a run exists: stopping the workload, rebooting into a test boot, or idle."""
    return {"runId": run_id, "plan": plan, "phase": phase, "step": None, "pass": 0,
            "passes": (plan or {}).get("passes"), "pattern": None, "testedBytes": 0, "coverageBytes": 0,
            "totalBytes": 0, "rateBps": 0, "etaSeconds": None, "errors": 0, "confirmedErrors": 0,
            "tempMilliC": None, "startedAt": rfc3339(clock.now()) if run_id else None}


def _interrupted(checkpoint: dict[str, Any], clock: Any, hardware: dict[str, Any] | None = None) -> dict[str, Any]:
    """The result of a run the device reset or crashed in: where it was (the spec's phase), and the
    verdict unknown (what it found died with it)."""
    plan = checkpoint.get("plan") or {}
    phase, step = protocol.memtest_phase(checkpoint.get("phase"), checkpoint.get("step"))
    where = {"phase": phase, "pass": checkpoint.get("pass"), "pattern": checkpoint.get("pattern"), "step": step}
    message = (f"the device reset or the agent died during the test (phase {where['phase']}, "
               f"pass {where['pass']}, pattern {where['pattern']})")
    return {"runId": checkpoint.get("runId") or "unknown", "plan": plan, "source": "unknown",
            "mode": plan.get("mode"), "outcome": "interrupted", "verdict": "unknown",
            "summary": f"interrupted in phase {phase}, pass {where['pass']}, pattern {where['pattern']}",
            "message": message, "startedAt": checkpoint.get("startedAt"), "finishedAt": rfc3339(clock.now()),
            "passesCompleted": max(0, (where["pass"] or 1) - 1), "patternsRun": [], "testedBytes": 0,
            "coverageBytes": 0, "totalBytes": 0, "maxTempMilliC": None, "pageSize": PAGE, "errorCount": 0,
            "errors": [], "confirmedErrors": 0, "pages": [], "retired": [], "kernel": None, "interrupted": where,
            "fault": False, "faultReason": None, **(hardware or {})}


def _numpy_version() -> str:
    # from the installed distribution's metadata: a result made at boot (a run a reboot interrupted)
    # names its engine without importing numpy
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("numpy")
    except PackageNotFoundError:
        return "unknown"
