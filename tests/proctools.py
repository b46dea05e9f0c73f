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


# A thread stopped (T) or traced (t) runs nothing; nor does one that has ended (Z, X): a backend that
# exited just before its postmaster was stopped stays a zombie, its parent no longer able to reap it.
_STILL = ("T", "t", "Z", "X")


def _running(pid: int) -> list[str]:
    """The states of ``pid``'s threads that may still run code; none when it is gone."""
    try:
        states = [_state((task / "stat").read_text()) for task in Path(f"/proc/{pid}/task").iterdir()]
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [s for s in states if s not in _STILL]


def stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped, traced or ended; a process that is gone counts as stopped."""
    return not _running(pid)


def wait_stopped(pids: list[int], timeout: float = 30.0) -> None:
    """Return once every one of ``pids`` has stopped after a SIGSTOP.

    A thread in uninterruptible sleep (D: an fsync, on a disk other tests keep busy) takes the signal
    only when that call returns; on CI's host that has taken seconds, so the wait is long, and costs
    nothing when they stop at once. Past it, the error names each process still running, its state
    and its name."""
    deadline = time.monotonic() + timeout
    while not all(stopped(pid) for pid in pids):
        if time.monotonic() >= deadline:
            late = {pid: states for pid in pids if (states := _running(pid))}
            raise AssertionError(f"not stopped {timeout:g} s after SIGSTOP: "
                                 + ", ".join(f"{pid} {_comm(pid)!r} in {states}" for pid, states in late.items()))
        time.sleep(0.001)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def sigstop(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOP ``pid`` and return once it has stopped."""
    os.kill(pid, signal.SIGSTOP)
    wait_stopped([pid], timeout)
