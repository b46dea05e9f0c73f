"""Running the ``fleethub`` command as a user would: subprocesses, free ports, bounded waits."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.ports import free_port  # noqa: F401 — the suite's free ports (tests/ports.py)


def fleethub_exe() -> str:
    exe = Path(sys.executable).parent / "fleethub"
    if exe.exists():
        return str(exe)
    found = shutil.which("fleethub")
    assert found, "the fleethub console script is not installed in this environment"
    return found


def clean_env() -> dict[str, str]:
    """The user's environment without FLEETHUB_* overrides (no external database, default timings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHUB_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_until(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.1, what: str = "",
               proc: "Proc | None" = None) -> Any:
    """Poll until ``predicate()`` is truthy; fail with the process log when it never is, or when the
    process died meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = predicate()
        except (httpx.HTTPError, OSError, ValueError):
            result = None
        if result:
            return result
        if proc is not None and proc.popen.poll() is not None:
            raise AssertionError(f"{proc.name} exited with {proc.popen.returncode} while waiting for "
                                 f"{what}\n{proc.log_tail()}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f"\n{proc.log_tail()}" if proc else ""))
        time.sleep(interval)


class Proc:
    """One ``fleethub`` subprocess in its own session (so a test's Ctrl-C never reaches it by
    accident), output to a log file."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen([fleethub_exe(), *args], stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env={**clean_env(), **(env or {})},
                                          start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return f"--- {self.name} log ---\n" + self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def interrupt(self, timeout: float = 30) -> int:
        """Ctrl-C, then wait for the process to exit; returns its exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit {timeout}s after SIGINT\n{self.log_tail()}") from None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


def run_cli(args: list[str], *, timeout: float = 60) -> subprocess.CompletedProcess:
    result = subprocess.run([fleethub_exe(), *args], capture_output=True, text=True, timeout=timeout,
                            env=clean_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"fleethub {' '.join(args)} -> {result.returncode}\n{result.stderr[-4000:]}"
    return result


def run_cli_json(args: list[str], *, timeout: float = 60) -> dict:
    out = run_cli(args, timeout=timeout).stdout
    try:
        return json.loads(out)
    except ValueError:
        raise AssertionError(f"fleethub {' '.join(args)} did not print JSON: {out!r}") from None


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose command line contains ``text`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if text in cmdline and ") Z " not in stat:  # zombies are gone already
            found.append((int(entry.name), cmdline.strip()))
    return found


def postgres_of(data_dir: Path) -> list[tuple[int, str]]:
    return [(pid, cmd) for pid, cmd in processes_mentioning(str(data_dir.resolve()))
            if "postgres" in cmd.split(" ", 1)[0]]


def stop_leftover_postgres(data_dir: Path) -> None:
    """Teardown only: a server a failed test left behind for its own data dir (we started it)."""
    for pid, _ in postgres_of(data_dir):
        try:
            os.kill(pid, signal.SIGINT)
        except OSError:
            pass


def api(base_url: str, pat: dict | tuple, org_id: str | None) -> httpx.Client:
    pat_id, secret = (pat["id"], pat["secret"]) if isinstance(pat, dict) else pat
    headers = {"X-API-Token-ID": pat_id, "X-API-Secret-Key": secret}
    if org_id:
        headers["X-Organization-ID"] = org_id
    return httpx.Client(base_url=base_url, headers=headers, timeout=10)
