"""A local, durable journal of rows that PostgreSQL has not confirmed yet (audit rows during an outage).

An API call's answer waits until its audit row is in PostgreSQL (storage/behind.py ``append_written``).
While PostgreSQL is unreachable or frozen that wait would be the whole outage, so the row goes to this
journal instead: a file on the hub's own disk, written and fsync'd before the answer leaves. Once the
write-behind has written every journaled row to PostgreSQL the file is emptied. A process killed in
between leaves its file behind, and the next process to start on the same data directory replays it.

Each process has its own file (``<name>-<pid>-<random>.jsonl``) and holds an exclusive ``flock`` on it
for its life, so cluster nodes sharing a data directory never empty each other's journal: a file whose
lock can be taken belongs to a process that is gone, and ``orphans`` hands its rows over (they are
copied into this process's journal before the old file is removed, so a crash between the two loses
nothing; a row replayed twice is written once, since its id is its primary key).

Appends are group-committed: rows that arrive while a write is in flight go out in the next write, so
an outage under load costs one fsync per batch, not one per call. A row is JSON with the two types
JSON lacks tagged (uuid, datetime). A line torn by a crash mid-write is skipped and counted.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger("fleethub.storage")


def _encode(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    raise TypeError(f"a journal row cannot hold a {type(value).__name__}")


def _decode(obj: dict) -> Any:
    if len(obj) == 1:
        if "$uuid" in obj:
            return uuid.UUID(obj["$uuid"])
        if "$datetime" in obj:
            return dt.datetime.fromisoformat(obj["$datetime"])
    return obj


def dumps(row: dict) -> bytes:
    return json.dumps(row, default=_encode, separators=(",", ":")).encode() + b"\n"


def loads(data: bytes) -> tuple[list[dict], int]:
    """The rows of a journal's bytes, and how many lines were torn (unreadable)."""
    rows, torn = [], 0
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line, object_hook=_decode))
        except ValueError:
            torn += 1
    return rows, torn


class _Batch:
    __slots__ = ("done", "ok", "rows")

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.done = trio.Event()
        self.ok = False


class DiskJournal:
    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self.path = directory / f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        self._fd: int | None = None
        self._next = _Batch()  # rows waiting for the write after the one in flight
        self._writing = False
        self._lock = trio.Lock()  # one file operation at a time: an append's write, an emptying
        self.appended = 0  # rows fsync'd here
        self.failed = 0  # rows the disk refused (they stay written behind, in memory only)
        self.has_rows = False

    def _open(self) -> int:
        if self._fd is None:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours for the process's life
            self._fd = fd
        return self._fd

    def _write_sync(self, data: bytes) -> None:
        fd = self._open()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)

    async def append(self, row: dict) -> bool:
        """Write ``row`` durably (with whatever else is waiting); whether the disk took it."""
        batch = self._next
        batch.rows.append(row)
        if not self._writing:
            # This caller writes batches until none waits. Shielded: a cancelled request must not leave
            # the rows that joined its batch with nobody to write them (a write is one fsync).
            self._writing = True
            try:
                with trio.CancelScope(shield=True):
                    while self._next.rows:
                        taken, self._next = self._next, _Batch()
                        taken.ok = await self._write(taken.rows)
                        taken.done.set()
            finally:
                self._writing = False
        await batch.done.wait()
        return batch.ok

    async def _write(self, rows: list[dict]) -> bool:
        data = b"".join(dumps(r) for r in rows)
        async with self._lock:
            try:
                await trio.to_thread.run_sync(self._write_sync, data)
            except OSError as exc:
                self.failed += len(rows)
                log.error("the %s journal could not write %d rows (%s); they wait in memory only",
                          self.name, len(rows), exc.strerror or type(exc).__name__)
                return False
        self.appended += len(rows)
        self.has_rows = True
        return True

    async def empty(self) -> None:
        """Every row journaled here is in PostgreSQL now: the file starts over."""
        async with self._lock:
            if self._fd is not None and self.has_rows:
                fd = self._fd
                await trio.to_thread.run_sync(lambda: (os.ftruncate(fd, 0), os.fsync(fd)))
                self.has_rows = False

    async def orphans(self) -> list[dict]:
        """The rows of journals left by processes that are gone, moved into this one's journal."""
        return await trio.to_thread.run_sync(self._adopt)

    def _adopt(self) -> list[dict]:
        if not self.directory.is_dir():
            return []
        adopted: list[dict] = []
        for path in sorted(self.directory.glob(f"{self.name}-*.jsonl")):
            if path == self.path:
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue  # another process adopted it meanwhile
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live process's
                data = b""
                while chunk := os.read(fd, 1 << 20):
                    data += chunk
                rows, torn = loads(data)
                if torn:
                    log.warning("the %s journal %s had %d torn lines (a crash mid-write); skipped",
                                self.name, path.name, torn)
                if rows:
                    self._write_sync(b"".join(dumps(r) for r in rows))  # ours first, then theirs goes
                    self.appended += len(rows)
                    self.has_rows = True
                path.unlink()
                adopted += rows
            finally:
                os.close(fd)
        if adopted:
            log.warning("the %s journal: %d rows left by a process that stopped before PostgreSQL had "
                        "them are written now", self.name, len(adopted))
        return adopted

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if not self.has_rows:
                self.path.unlink(missing_ok=True)
