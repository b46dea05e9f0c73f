"""The device's workload: the command a configuration asks the device to run, as a real subprocess.

``spec.workload`` of a configuration version::

    {"command": [argv...], "env": {NAME: value},
     "healthCheck": {"command": [argv...] | null, "timeoutSeconds": 10, "graceSeconds": 1}}

No ``workload`` in the spec means there is nothing to run, and the device is always healthy. When
``spec.workload.healthCheck`` is absent, a top-level ``spec.healthCheck`` object is read (leniently:
fields of other shapes are ignored, since that key may mean something else to other tools).

Healthy means: the process has stayed up for ``graceSeconds`` and the health-check command, if any,
exits 0 within ``timeoutSeconds``. The process runs in its own session, so stopping it (SIGTERM, then
SIGKILL after ``stop_grace``) also stops whatever it started. Its stdout and stderr go to
``<data_dir>/workload.log``. The environment is deliberately small (PATH, locale, HOME, TZ, the
spec's env and the platform's FLEETHUB_* variables) so the agent's own secrets, such as
FLEETHUB_DEVICE_TOKEN, never reach the workload.

The account (``run_as``): by default the workload runs as the agent's own user; a real device's
operator chooses (``fleethub agent --workload-user`` or FLEETHUB_WORKLOAD_USER). Simulated devices
(``device_client/sim.py``) run in the hub's host, so when the simulator is root their workloads run
as an unprivileged account (``simulator_user``: FLEETHUB_WORKLOAD_USER, default ``nobody``), never
root. Without root nothing else is possible: the workload runs as the simulator's own user. For
another account the agent makes the path to the device root traversable (execute only: nothing is
listed, and the agent's files stay 0600) and gives the account the volumes directory; secret files
keep the mode and owner they were delivered with.

Supervision (when ``nursery`` is set, or inside ``run()``): a workload that exits on its own is
reported through ``on_health`` and restarted with backoff. The agent stops the workload when it
stops. A held workload (memory tests) is stopped and stays stopped until released; the hold is not
a crash.
"""

from __future__ import annotations

import logging
import math
import os
import pwd
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import trio

from . import logtail
from .shared.backoff import Backoff
from .devroot import DeviceRoot, Refused
from .shared.paths import PLATFORM_DIR, SECRETS_DIR, VOLUMES_DIR

log = logging.getLogger("fleethub.agent.workload")

DEFAULT_HEALTH_TIMEOUT = 10.0
DEFAULT_GRACE = 1.0
MAX_HEALTH_TIMEOUT = 600.0
LOG_ROTATE_BYTES = 1 << 20
_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "HOME")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_KEEP: Any = object()
WORKLOAD_USER_ENV = "FLEETHUB_WORKLOAD_USER"
SIMULATOR_DEFAULT_USER = "nobody"


@dataclass(frozen=True)
class RunAs:
    """The account a workload runs as when it is not the agent's own."""

    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def lookup(cls, name: str) -> RunAs:
        """``name`` is a user name or a numeric uid; ValueError when the system has no such user."""
        try:
            entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        except (KeyError, ValueError):
            raise ValueError(f"no user {name!r} on this system (workload user)") from None
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)

    def is_other(self) -> bool:
        return self.uid != os.geteuid()


def configured_user(name: str | None = None) -> RunAs | None:
    """A real agent's workload account: ``name``, else FLEETHUB_WORKLOAD_USER, else the agent's own."""
    name = name or os.environ.get(WORKLOAD_USER_ENV)
    return RunAs.lookup(name) if name else None


def simulator_user(name: str | None = None) -> RunAs | None:
    """Simulated devices' workload account: unprivileged when the simulator is root (configuration
    commands come from the hub's tenants, and this host holds the hub's keys); None when not root,
    where switching is impossible and the workload runs as the simulator's own user."""
    if os.geteuid() != 0:
        return None
    user = RunAs.lookup(name or os.environ.get(WORKLOAD_USER_ENV) or SIMULATOR_DEFAULT_USER)
    if user.uid == 0:
        raise ValueError(f"simulated workloads must not run as root ({user.name!r} has uid 0)")
    return user


def _make_traversable(path: Path) -> None:
    """Execute (not read) for others on ``path`` and its parents, so another account can reach a
    known path below without listing anything on the way."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if mode & 0o001 != 0o001:
            parent.chmod(mode | 0o001)


@dataclass(frozen=True)
class WorkloadSpec:
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, hash=False)
    health_command: tuple[str, ...] | None = None
    timeout: float = DEFAULT_HEALTH_TIMEOUT
    grace: float = DEFAULT_GRACE


@dataclass(frozen=True)
class Health:
    healthy: bool
    detail: str
    #: the end of what the failing health check printed (logtail.visible), None when it printed nothing
    output: str | None = field(default=None, compare=False)

    def event(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "detail": self.detail}


def _argv(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value) or not value[0]:
        raise ValueError(f"{what} must be a non-empty list of strings")
    if any("\0" in a for a in value):
        raise ValueError(f"{what} must not contain NUL characters")
    return tuple(value)


def _seconds(value: Any, default: float, what: str, low: float, strict: bool) -> float:
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low <= value <= MAX_HEALTH_TIMEOUT:
        return float(value)
    if strict:
        raise ValueError(f"{what} must be a number from {low:g} to {MAX_HEALTH_TIMEOUT:g}")
    return default


def parse_spec(spec: Mapping[str, Any] | None) -> WorkloadSpec | None:
    """The workload of a configuration spec; None when it has none. ValueError says what is wrong."""
    workload = (spec or {}).get("workload")
    if workload is None:
        return None
    if not isinstance(workload, dict):
        raise ValueError("workload must be an object")
    command = _argv(workload.get("command"), "workload.command")
    env = workload.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("workload.env must map names to strings")
    if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in env.items()):
        raise ValueError("workload.env has an invalid name or value")
    check, strict = workload.get("healthCheck"), True
    if check is None:
        check, strict = (spec or {}).get("healthCheck"), False
    if check is None or (not strict and not isinstance(check, dict)):
        check = {}
    if not isinstance(check, dict):
        raise ValueError("workload.healthCheck must be an object")
    health_command = check.get("command")
    if health_command is not None:
        try:
            health_command = _argv(health_command, "workload.healthCheck.command")
        except ValueError:
            if strict:
                raise
            health_command = None
    return WorkloadSpec(command=command, env=dict(env), health_command=health_command,
                        timeout=_seconds(check.get("timeoutSeconds"), DEFAULT_HEALTH_TIMEOUT,
                                         "healthCheck.timeoutSeconds", 0.001, strict),
                        grace=_seconds(check.get("graceSeconds"), DEFAULT_GRACE,
                                       "healthCheck.graceSeconds", 0.0, strict))


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
        _make_traversable(self.root)  # again at every start: a parent may have been tightened since
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
        try:
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
