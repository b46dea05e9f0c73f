"""One hub process per data dir: ``fleethub serve`` and ``fleethub demo`` hold a lock on it while they run.

Without it a second ``serve`` on the same dir attached to the first one's embedded PostgreSQL, listened
on another port, and marked every device offline at its start, devices the first hub still held links
to. The lock is an flock, so it goes with the process however it ends (no stale file to clear by hand);
the file names the holder's pid for the message. Cluster nodes share one data dir on purpose (their
presence epochs settle who holds a device), so they do not take it: ``fleethub cluster`` holds it for
all of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from hub.errors import Conflict
from storage.private import secure_data_dir

LOCK_FILE = "hub.lock"


class DataDirInUse(Conflict):
    """Another fleethub process serves this data dir."""
    code = "data_dir_in_use"


@contextlib.contextmanager
def held(data_dir: Path) -> Iterator[None]:
    """Hold ``data_dir`` for this process, or raise DataDirInUse at once (never wait: a second hub is a
    mistake to report, not a turn to take)."""
    secure_data_dir(data_dir)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            raise DataDirInUse(f"{data_dir.resolve()} is in use by another fleethub process (pid {holder}): "
                               f"stop it first, or give this one its own --data-dir; fleethub admin works "
                               f"beside it") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)
