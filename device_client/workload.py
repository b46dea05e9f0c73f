"""The device's workload: the command a configuration asks the device to run, as a real subprocess.

What it runs is ``spec.workload`` (device_client/workload_spec.py: the format, and what healthy means),
as the account device_client/workload_account.py names. The process runs in its own session, so
stopping it (SIGTERM, then SIGKILL after ``stop_grace``) also stops whatever it started. Its stdout and
stderr go to ``<data_dir>/workload.log``. The environment is deliberately small (PATH, locale, HOME, TZ,
the spec's env and the platform's FLEETHUB_* variables) so the agent's own secrets, such as
FLEETHUB_DEVICE_TOKEN, never reach the workload.

Supervision (when ``nursery`` is set, or inside ``run()``): a workload that exits on its own is
reported through ``on_health`` and restarted with backoff. The agent stops the workload when it
stops. A held workload (memory tests) is stopped and stays stopped until released; the hold is not
a crash.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import trio

from . import logtail
from .shared.backoff import Backoff
from .devroot import DeviceRoot, Refused
from .shared.paths import PLATFORM_DIR, SECRETS_DIR, VOLUMES_DIR
from .workload_account import RunAs, make_traversable
from .workload_spec import UNSEEN_CHECK_SLACK, Health, WorkloadSpec

log = logging.getLogger("fleethub.agent.workload")

LOG_ROTATE_BYTES = 1 << 20
_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "HOME")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_KEEP: Any = object()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _killpg(proc: trio.Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def _kill_now(proc: trio.Process) -> None:
    proc.kill()


class Workload:
    def __init__(self, data_dir: Path, root: Path, *, stop_grace: float = 5.0,
                 restart_backoff: tuple[float, float] = (1.0, 30.0),
                 on_health: Callable[[Health], Awaitable[Any]] | None = None,
                 run_as: RunAs | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.run_as = run_as if run_as is not None and run_as.is_other() else None
        self.root = Path(root)
        self.fs = DeviceRoot(self.root)
        self.log_path = self.data_dir / "workload.log"
        self.stop_grace = stop_grace
        self.restart_backoff = restart_backoff
        self.on_health = on_health
        self.spec: WorkloadSpec | None = None
        self.held = False
        self.starts = 0
        self.crashes = 0
        self.last_error: str | None = None  # why the last start or run failed
        self._env: dict[str, str] = {}
        self._wanted = False
        self._proc: trio.Process | None = None
        self._started_at = 0.0
        self._backoff = Backoff(*restart_backoff, jitter=False)
        self._lock = trio.Lock()
        self._change = trio.Event()
        self.nursery: trio.Nursery | None = None  # where process watchers run; None: unsupervised

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running else None  # type: ignore[union-attr]

    def environment(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
        env.setdefault("PATH", _DEFAULT_PATH)
        env.update(self.spec.env if self.spec else {})
        env["FLEETHUB_SECRETS_DIR"] = str(self.root / SECRETS_DIR.lstrip("/"))
        env["FLEETHUB_VOLUMES_DIR"] = str(self.root / VOLUMES_DIR.lstrip("/"))
        env.update(self._env)
        if self.run_as is not None:
            env.update(HOME=self.run_as.home, USER=self.run_as.name, LOGNAME=self.run_as.name)
        return env

    def _account(self) -> dict[str, Any]:
        """Popen options that drop to ``run_as``: its uid and gid, and none of our groups."""
        if self.run_as is None:
            return {}
        return {"user": self.run_as.uid, "group": self.run_as.gid, "extra_groups": []}

    def _make_secrets_dir(self) -> None:
        with self.fs.directory(SECRETS_DIR, create=True):
            pass

    def _prepare_for_account(self) -> None:
        if self.run_as is None:
            return
        make_traversable(self.root)  # again at every start: a parent may have been tightened since
        # the workload's own persistent data; opened by descriptor like every path under the root
        # (devroot.py), though only the platform directory, which is root's, holds it
        name = VOLUMES_DIR.rsplit("/", 1)[1]
        with self.fs.directory(PLATFORM_DIR, create=True) as platform:
            try:
                os.mkdir(name, 0o700, dir_fd=platform)
            except FileExistsError:
                pass
            with DeviceRoot.open_directory(platform, name) as volumes:
                st = os.fstat(volumes)
                if (st.st_uid, st.st_gid) != (self.run_as.uid, self.run_as.gid):
                    os.fchown(volumes, self.run_as.uid, self.run_as.gid)

    # ---- control ----

    async def start(self, spec: WorkloadSpec | None = _KEEP, env: Mapping[str, str] | None = None) -> None:
        """Run ``spec`` (default: the current one) unless it already runs; held: remember it only."""
        async with self._lock:
            if spec is not _KEEP and spec != self.spec:
                await self._terminate()
                self.spec = spec
            if env is not None:
                self._env = dict(env)
            self._wanted = True
            if not self.held and not self.running:
                await self._spawn()

    async def restart(self, spec: WorkloadSpec | None = _KEEP, env: Mapping[str, str] | None = None) -> None:
        async with self._lock:
            await self._terminate()
            if spec is not _KEEP:
                self.spec = spec
            if env is not None:
                self._env = dict(env)
            self._wanted = True
            if not self.held:
                await self._spawn()

    async def stop(self) -> None:
        async with self._lock:
            self._wanted = False
            await self._terminate()

    async def hold(self) -> None:
        async with self._lock:
            self.held = True
            await self._terminate()

    async def release(self) -> None:
        async with self._lock:
            self.held = False
            if self._wanted and not self.running:
                await self._spawn()

    # ---- health ----

    async def check_health(self) -> Health:
        spec = self.spec
        if spec is None:
            return Health(True, "no workload configured")
        if self.held:
            return Health(False, "the workload is held")
        proc = self._proc
        if proc is None:
            return Health(False, self.last_error or "the workload is not running")
        wait = self._started_at + spec.grace - trio.current_time()
        if wait > 0:
            with trio.move_on_after(wait):
                await proc.wait()
        if proc.poll() is not None:
            return Health(False, f"the workload {_describe_exit(proc.returncode)}")
        if spec.health_command:
            problem, output = await self._run_health_command(spec)
            if problem:
                return Health(False, problem, output)
            if proc.poll() is not None:
                return Health(False, f"the workload {_describe_exit(proc.returncode)}")
            return Health(True, "running; the health check passed")
        return Health(True, "running")

    async def is_healthy(self) -> bool:
        return (await self.check_health()).healthy

    async def wait_healthy(self, deadline: float) -> Health:
        """Health checks until one passes, the process dies, or ``deadline`` seconds pass."""
        last: Health | None = None
        with trio.move_on_after(deadline):
            while True:
                last = await self.check_health()
                if last.healthy or not self.running or self.held:
                    return last
                await trio.sleep(0.1)
        if last is None and self.spec is not None:
            # No verdict without a check that completed (as containers.py's _wait_healthy): a loaded
            # device can take longer than the deadline to start the health command; it runs once more to
            # its end, bounded by its own timeout and the slowness of starting a process.
            with trio.move_on_after(self.spec.timeout + UNSEEN_CHECK_SLACK):
                last = await self.check_health()
                if last.healthy:
                    return last
        reason = f": {last.detail}" if last else ""
        return Health(False, f"not healthy within {deadline:g}s{reason}", last.output if last else None)

    def log_tail(self) -> str | None:
        """The workload log's last lines (logtail.visible), None when it is empty or missing."""
        return logtail.file_tail(self.log_path)

    async def _run_health_command(self, spec: WorkloadSpec) -> tuple[str | None, str | None]:
        """(why the check failed or None, the end of what it printed when it failed). The output goes
        to an unnamed file first, so its end is the check's alone and not the workload's lines
        written meanwhile, then to the workload log, as before."""
        assert spec.health_command is not None
        try:
            out = tempfile.TemporaryFile(dir=self.data_dir)
        except OSError as exc:  # a full or read-only data dir: the check cannot be run as it should
            return f"the health check could not start: its output has nowhere to go ({exc.strerror or exc})", None
        with out:
            with trio.move_on_after(spec.timeout) as scope:
                try:
                    result = await trio.run_process(
                        list(spec.health_command), check=False, stdin=subprocess.DEVNULL, stdout=out,
                        stderr=subprocess.STDOUT, env=self.environment(), cwd=self.root,
                        deliver_cancel=_kill_now, **self._account())
                except OSError as exc:
                    return f"the health check could not start: {exc.strerror or exc}", None
            tail = await trio.to_thread.run_sync(logtail.append_and_tail, out, self.log_path)
        if scope.cancelled_caught:
            return f"the health check did not finish within {spec.timeout:g}s", tail
        if result.returncode != 0:
            return f"the health check {_describe_exit(result.returncode)}", tail
        return None, None

    # ---- supervision ----

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise until cancelled, then stop the workload (the agent does the same with its own
        nursery: it sets ``nursery`` and stops the workload when it stops)."""
        try:
            async with trio.open_nursery() as self.nursery:
                if self._proc is not None:
                    self.nursery.start_soon(self._watch, self._proc)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self.nursery = None
            with trio.CancelScope(shield=True):
                await self.stop()

    async def _watch(self, proc: trio.Process) -> None:
        # One watcher per process, so there is no task at all while nothing runs: a simulated fleet
        # of thousands of devices without workloads pays nothing for supervision.
        await proc.wait()
        if proc is not self._proc:
            return  # stopped or replaced on purpose
        ran_for = trio.current_time() - self._started_at
        if ran_for > self.restart_backoff[1]:
            self._backoff.reset()  # it ran longer than the longest delay: a new failure, not a loop
        self.crashes += 1
        self.last_error = f"the workload {_describe_exit(proc.returncode)}"
        delay = self._backoff.next_delay()
        log.warning("workload pid %d %s; restarting in %.1fs", proc.pid, _describe_exit(proc.returncode), delay)
        async with self._lock:
            if self._proc is not proc:
                return
            self._proc = None
            _killpg(proc, signal.SIGKILL)  # what it left behind in its session
            self._changed()
        if self.on_health is not None:
            try:
                await self.on_health(Health(False, self.last_error))
            except Exception:  # a report that cannot be sent must not stop supervision
                log.exception("reporting workload health failed")
        change = self._change
        with trio.move_on_after(delay):
            await change.wait()  # an explicit start or stop meanwhile decides instead
        async with self._lock:
            if self._proc is None and self._wanted and not self.held:
                await self._spawn()

    def _changed(self) -> None:
        self._change.set()
        self._change = trio.Event()

    async def _spawn(self) -> None:
        spec = self.spec
        if spec is None:
            return
        # the workload may list its secrets before the first one arrives
        try:
            self._make_secrets_dir()
            self._prepare_for_account()
        except Refused as exc:
            self.last_error = f"the workload's directories could not be made: {exc}"
            log.warning("%s", self.last_error)
            return
        except OSError as exc:
            self.last_error = f"the workload could not be given its account: {exc.strerror or exc}"
            log.warning("%s", self.last_error)
            return
        try:  # by name: the log is in the agent's 0700 data directory, not the workload's (state.py)
            if self.log_path.stat().st_size > LOG_ROTATE_BYTES:
                os.replace(self.log_path, self.log_path.with_name("workload.log.1"))
        except FileNotFoundError:
            pass
        with open(self.log_path, "ab") as out:
            out.write(f"--- starting {list(spec.command)!r}\n".encode())
            out.flush()
            try:
                proc = await trio.lowlevel.open_process(
                    list(spec.command), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=self.environment(), cwd=self.root, start_new_session=True, **self._account())
            except OSError as exc:
                self.last_error = f"the workload could not start: {exc.strerror or exc}"
                log.warning("%s (%s)", self.last_error, spec.command[0])
                return
        self._proc, self._started_at = proc, trio.current_time()
        self.starts += 1
        self.last_error = None
        log.info("workload started, pid %d", proc.pid)
        self._changed()
        if self.nursery is not None:
            self.nursery.start_soon(self._watch, proc)

    async def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._changed()  # before the signal: the supervisor must not take this exit for a crash
        # shielded: a cancelled caller must not leave a process running that nobody tracks any more
        with trio.CancelScope(shield=True):
            if proc.poll() is None:
                _killpg(proc, signal.SIGTERM)
                with trio.move_on_after(self.stop_grace):
                    await proc.wait()
                if proc.poll() is None:
                    log.warning("workload pid %d ignored SIGTERM for %gs; killing it", proc.pid, self.stop_grace)
                    _killpg(proc, signal.SIGKILL)
                    await proc.wait()
            _killpg(proc, signal.SIGKILL)  # whatever it left behind in its session
        log.info("workload pid %d stopped (%s)", proc.pid, _describe_exit(proc.returncode))
