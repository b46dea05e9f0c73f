"""Notice when the trio thread stops running tasks, and say what held it.

Everything a process of ours does runs on one trio thread: in a hub every device link, request,
rollout and stream; in an agent its link's heartbeats, its commands and its workload's supervision.
Synchronous work on that thread holds all of it at once. Two such faults were found by their
symptoms, far from their cause: the OpenAPI document built on every request (0.6-0.9 s, hub/openapi.py)
closed pooled HTTP connections under load, and the agent's first tunnel imports (0.4-1.1 s,
device_client/imports.py) outlasted a heartbeat timeout. This names the next one where it happens.

How: a task on the watched loop notes the time every quarter of ``threshold``; a daemon thread looks
at the note as often. When the note is older than ``threshold``, the thread takes the loop thread's
stack (``sys._current_frames``), which is the code holding the loop while it holds it, and logs it as
one warning (at most one per ``report_every`` seconds; the others are counted in it). When the task
runs again it counts the stall and its length (``LoopWatch.stalls``, the hub's /metrics). A stall in C
code that keeps the GIL (a long regular expression, a garbage collection) lets no other thread run
either: the thread looks only once it is over, so its count and length are right but the stack logged,
if any, may already be past the code that held the loop. Only the file, line and function of each
frame are logged, never a value.

The warning also reads the CPU clocks over the stall (``Stall.why``): the loop thread's own (it ran:
the stack is the culprit), the process's (its other threads ran: they held the GIL), neither (the
process got no CPU, or sat in a blocking call), and the garbage collector's time. Its first run through
the test suite found a hub fault this way: a hello's fifty thousand addresses parsed on the loop
(device_client/shared/systemfacts.py).

The decisions (``Stalls``) take instants and clock readings (``Sample``) and read no clock; the task and
the thread are the IO. Not started under trio's virtual clock (``MockClock``): the task's sleeps would
return at once and keep that clock from ever jumping.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType

import trio

log = logging.getLogger("fleethub.loop")

ENV = "FLEETHUB_LOOP_STALL_SECONDS"
DEFAULT_THRESHOLD = 0.5  # seconds; a device link's heartbeat timeout is 90 s, an HTTP keep-alive 5 s

STACK_FRAMES = 12  # innermost frames logged: enough to reach our own code below a library's


@dataclass(frozen=True)
class Sample:
    """The clocks besides the time, read together at one instant."""

    thread: float | None = None  # the loop thread's CPU seconds; None: no such clock on this platform
    process: float = 0.0  # the process's CPU seconds, every thread
    collecting: float = 0.0  # seconds the process has spent collecting garbage


@dataclass
class Stall:
    """One stall as the watcher thread saw it while it lasted."""

    held: float  # seconds since the loop last ran the watch's task
    ran: float | None  # of which the loop's thread ran on a CPU (the rest it waited); None: not known here
    others: float | None  # the CPU seconds the process's other threads used meanwhile
    collecting: float  # of which the process collected garbage (any thread: every thread waits for it)
    unreported: int  # stalls before this one that were counted but not logged (rate limit)

    def why(self) -> str:
        """What the CPU clocks say: code running on the loop (the stack is the culprit), another thread
        holding the GIL, or a loop that got no CPU at all."""
        parts = [] if self.ran is None else [f"its thread ran {self.ran:.2f} s of it"]
        if self.collecting >= 0.01:
            parts.append(f"garbage collection {self.collecting:.2f} s")
        if self.ran is None or self.others is None or self.ran >= self.held / 2 or self.collecting >= self.held / 2:
            return "; ".join(parts)
        if self.others >= self.held / 2:
            parts.append(f"the process's other threads ran {self.others:.2f} s: it waited for the GIL")
        else:
            parts.append("the process ran little of it: it waited for a CPU (the machine busy elsewhere) "
                         "or in a blocking call")
        return "; ".join(parts)


class Stalls:
    """The decisions, without IO: fed instants by the loop's task (``beat``) and the thread (``check``)."""

    def __init__(self, threshold: float, *, report_every: float = 10.0) -> None:
        self.threshold = threshold
        self.interval = threshold / 4
        self.report_every = report_every
        self.count = 0
        self.seconds = 0.0
        self.longest = 0.0
        self._last_beat: float | None = None
        self._at_beat = Sample()  # the clocks at the last beat
        self._seen = False  # the current stall was already seen (and logged or counted as unreported)
        self._last_report: float | None = None
        self._unreported = 0
        self._lock = threading.Lock()  # beat and check run on different threads

    def beat(self, now: float, clocks: Sample = Sample()) -> float | None:
        """The loop ran the task at ``now``: the length of the stall that ended, if there was one."""
        with self._lock:
            last, self._last_beat = self._last_beat, now
            self._at_beat = clocks
            seen, self._seen = self._seen, False
            if last is None:
                return None
            held = now - last - self.interval  # the task slept one interval on purpose
            if held < self.threshold and not seen:
                return None
            self.count += 1
            self.seconds += held
            self.longest = max(self.longest, held)
            return held

    def check(self, now: float, clocks: Sample = Sample()) -> Stall | None:
        """The thread looked at ``now``: a stall to log (once per stall, rate limited), or None."""
        with self._lock:
            if self._last_beat is None or self._seen:
                return None
            held = now - self._last_beat - self.interval
            if held < self.threshold:
                return None
            self._seen = True
            if self._last_report is not None and now - self._last_report < self.report_every:
                self._unreported += 1
                return None
            self._last_report = now
            then = self._at_beat
            ran = others = None
            if clocks.thread is not None and then.thread is not None:
                ran = max(0.0, clocks.thread - then.thread)
                others = max(0.0, clocks.process - then.process - ran)
            stall = Stall(held, ran, others, max(0.0, clocks.collecting - then.collecting), self._unreported)
            self._unreported = 0
            return stall


def threshold_from_env() -> float:
    """``FLEETHUB_LOOP_STALL_SECONDS``: the stall worth a warning; 0 switches the watch off."""
    raw = os.environ.get(ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_THRESHOLD
    except ValueError:
        raise SystemExit(f"{ENV} must be a number of seconds (0: off), not {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise SystemExit(f"{ENV} must be a number of seconds (0: off), not {raw!r}")
    return value


# the watch of the current trio run (the hub's /metrics read it): per run, as a process may have
# several, each on its own thread (tests/threadhub.py)
_current: trio.lowlevel.RunVar[LoopWatch | None] = trio.lowlevel.RunVar("fleethub_loopwatch", default=None)


def current() -> LoopWatch | None:
    """The watch running on this trio run's thread, if any (None outside a trio run)."""
    try:
        return _current.get()
    except RuntimeError:
        return None


async def ensure(nursery: trio.Nursery) -> None:
    """Start a watch in ``nursery`` unless this trio run has one already (a hub inside ``fleethub
    serve``; a hub a test starts has none before its own) or the environment switches it off. A watch
    that ended took itself out of ``current()``."""
    threshold = threshold_from_env()
    if threshold > 0 and current() is None:
        await nursery.start(LoopWatch(threshold).run)


class LoopWatch:
    """The task and the thread around ``Stalls``; ``run`` is started in the process's nursery."""

    def __init__(self, threshold: float) -> None:
        self.stalls = Stalls(threshold)
        self._stop = threading.Event()
        self._loop_thread: int | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if _virtual_clock():
            log.debug("loop watch not started: the trio run has a virtual clock")
            task_status.started()
            return
        self._loop_thread = threading.get_ident()
        _current.set(self)
        stalls, collector = self.stalls, _collector()
        stalls.beat(time.monotonic(), _sample(time.thread_time(), collector))
        thread = threading.Thread(target=self._watch, name="fleethub-loopwatch", daemon=True)
        thread.start()
        task_status.started()
        try:
            while True:
                await trio.sleep(stalls.interval)
                held = stalls.beat(time.monotonic(), _sample(time.thread_time(), collector))
                if held is not None:
                    log.debug("the event loop was held for %.3f s", held)
        finally:
            self._stop.set()
            if current() is self:
                _current.set(None)

    def _watch(self) -> None:
        stalls, collector = self.stalls, _collector()
        # the loop thread's CPU clock: Linux and most Unixes; elsewhere a stall is reported without it
        clock_of = getattr(time, "pthread_getcpuclockid", None)
        loop_cpu = clock_of(self._loop_thread or 0) if clock_of is not None else None
        while not self._stop.wait(stalls.interval):
            try:
                thread_cpu = time.clock_gettime(loop_cpu) if loop_cpu is not None else None
            except OSError:  # the loop's thread has ended: so has the watch
                return
            stall = stalls.check(time.monotonic(), _sample(thread_cpu, collector))
            if stall is None:
                continue
            frame = sys._current_frames().get(self._loop_thread or 0)
            more = f"{stall.unreported} more stalls since the last report" if stall.unreported else ""
            why = "; ".join(filter(None, (stall.why(), more)))
            where = innermost(frame, STACK_FRAMES) if frame is not None else "  (no stack)"
            log.warning("the event loop has been held for %.2f s%s by:\n%s", stall.held,
                        f" ({why})" if why else "", where)


def _virtual_clock() -> bool:
    """Whether this trio run's clock is trio's MockClock. Read from sys.modules, not imported: importing
    trio.testing costs an agent 6 MiB of RSS (it brings pytest along where pytest is installed;
    bench/agent_footprint.py, 2026-11-29), and no MockClock exists unless something imported it."""
    testing = sys.modules.get("trio.testing")
    return testing is not None and isinstance(trio.lowlevel.current_clock(), testing.MockClock)


def _sample(thread_cpu: float | None, collector: _Collector) -> Sample:
    """The clocks now, the loop thread's CPU seconds read by the caller (its own, or through its clock id)."""
    return Sample(thread_cpu, time.process_time(), collector.seconds)


class _Collector:
    """Seconds the process has spent collecting garbage, from gc.callbacks: a collection stops every
    thread, the loop's and the watch's, and its time is named apart in a stall's report."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None


_collector_instance: _Collector | None = None


def _collector() -> _Collector:
    """One per process, installed with the first watch and kept (a callback costs two clock reads per
    collection)."""
    global _collector_instance
    if _collector_instance is None:
        _collector_instance = _Collector()
        gc.callbacks.append(_collector_instance)
    return _collector_instance


def innermost(frame: FrameType | None, limit: int) -> str:
    """The ``limit`` innermost frames from ``frame`` outwards, outermost first, as traceback prints
    them but without source lines: file, line and function (no file is read, no value shown)."""
    lines: list[str] = []
    while frame is not None and len(lines) < limit:
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        frame = frame.f_back
    return "\n".join(reversed(lines))
