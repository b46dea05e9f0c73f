"""Stopping a process for a fault test, and knowing it has stopped.

``os.kill(pid, SIGSTOP)`` returns once the signal is queued, not once the process stands still: each of
its threads stops when the kernel next runs it, and on a loaded machine a thread of a busy server can
still answer a packet in between. CI once saw a request answered by a nats-server just SIGSTOPped. A
test that asserts what happens while a process is stopped waits here until every thread of it is."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def _state(stat: str) -> str:
    # /proc/<pid>/task/<tid>/stat: "tid (comm) S ...", where comm may hold spaces and parentheses
    return stat.rsplit(")", 1)[1].split()[0]


def stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (T) or traced (t); a process that is gone counts as stopped."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        return all(_state((task / "stat").read_text()) in ("T", "t") for task in tasks)
    except (FileNotFoundError, ProcessLookupError):
        return True


def sigstop(pid: int, timeout: float = 5.0) -> None:
    """SIGSTOP ``pid`` and return once it has stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not stopped(pid):
        if time.monotonic() >= deadline:
            raise AssertionError(f"process {pid} did not stop within {timeout} s of SIGSTOP")
        time.sleep(0.001)
