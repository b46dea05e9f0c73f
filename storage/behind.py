"""Write-behind: coalesce high-rate rows (presence, audit) and write them in batches.

``put`` never blocks and never crosses into storage; ``run`` flushes every ``interval`` seconds (or
sooner when ``max_batch`` rows wait), one crossing per batch. Rows with the same key are merged, so
a device sending a heartbeat every second costs one row per flush, not one write per heartbeat.
On shutdown the last batch is flushed under a shield.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import trio

from storage.db import DatabaseUnavailable

log = logging.getLogger("fleethub.storage")


def merge_newer(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Newer values win, but a None never erases a value the older row carried."""
    merged = dict(old)
    merged.update({k: v for k, v in new.items() if v is not None or k not in old})
    return merged


class WriteBehind:
    def __init__(self, flush: Callable[[list[dict]], Awaitable[None]], *, interval: float = 0.5,
                 max_batch: int = 2000, name: str = "rows") -> None:
        self._flush = flush
        self.interval = interval
        self.max_batch = max_batch
        self.name = name
        self._pending: dict[Hashable, dict] = {}
        self._wake = trio.Event()
        self.written = 0
        self.failures = 0
        self.retries = 0  # flushes put back because the database was unreachable

    def put(self, key: Hashable, row: dict, *, merge: bool = True) -> None:
        old = self._pending.get(key)
        self._pending[key] = merge_newer(old, row) if (merge and old is not None) else row
        if len(self._pending) >= self.max_batch:
            self._wake.set()

    def append(self, row: dict) -> None:
        """A row that is never merged (audit events)."""
        self._pending[id(row)] = row
        if len(self._pending) >= self.max_batch:
            self._wake.set()

    async def flush(self) -> None:
        while self._pending:
            taken, self._pending = self._pending, {}
            batch = list(taken.values())
            try:
                await self._flush(batch)
                self.written += len(batch)
            except trio.Cancelled:
                # Shutting down mid-write: put the batch back (under anything newer) so the final,
                # shielded flush in run() writes it.
                self._put_back(taken)
                raise
            except DatabaseUnavailable:
                # PostgreSQL is down or restarting: keep the rows for the next flush.
                self._put_back(taken)
                self.retries += 1
                return
            except Exception:
                # Keep the hub running; the rows are lost and counted, and the log says why.
                self.failures += 1
                log.exception("write-behind of %d %s failed", len(batch), self.name)
                return

    def _put_back(self, taken: dict) -> None:
        for key, row in taken.items():
            newer = self._pending.get(key)
            self._pending[key] = merge_newer(row, newer) if newer is not None else row

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                with trio.move_on_after(self.interval):
                    await self._wake.wait()
                self._wake = trio.Event()
                await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                await self.flush()
