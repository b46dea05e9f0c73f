"""Metering: what the hub did, counted for billing, written in batches.

``Meter.add`` and ``Meter.device_seen`` never block and never cross into storage: quantities are
summed in memory per (organisation, UTC day, product, key) and flushed every few seconds in one
statement (storage/usage.py). A hub that stops flushes under a shield; a hub killed with SIGKILL
loses at most one interval of counts.

Exactly once: each flushed batch carries an id, stored in the same transaction as its sums. A batch
whose outcome is unknown (the write failed, or was cancelled at the instant of its COMMIT) is kept
as it is and sent again under the same id, so it counts once whether or not the first try committed;
newer counts go in a later batch.

Products (the catalogue in hub/billing names their prices):

    active_device            devices seen connected, per day (device_active_days, not usage_daily)
    tunnel_minutes           tunnel session minutes          key ''
    tunnel_bytes             tunnel bytes, direct            key ''
    tunnel_relayed_bytes     tunnel bytes through the relay  key ''
    registry_fallback_bytes  registry-proxy bytes            key fleet id
    assistant_prompt_tokens, assistant_completion_tokens, assistant_tool_tokens   key user id
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import logging

import trio

from storage.behind import WriteBehind
from storage.db import DatabaseUnavailable
from storage.usage import Usage

log = logging.getLogger("fleethub.metering")

PRODUCTS = ("active_device", "tunnel_minutes", "tunnel_bytes", "tunnel_relayed_bytes",
            "registry_fallback_bytes", "assistant_prompt_tokens", "assistant_completion_tokens",
            "assistant_tool_tokens")


class Meter:
    def __init__(self, usage: Usage, *, interval: float = 2.0) -> None:
        self.usage = usage
        self.interval = interval
        self._sums: dict[tuple, Decimal] = {}
        self._unsent: tuple[uuid.UUID, dict[tuple, Decimal]] | None = None  # (batch id, sums) not known stored
        self._seen = WriteBehind(usage.mark_active_many, interval=interval, name="active-device rows")
        self.failures = 0

    def add(self, org_id: uuid.UUID, product: str, quantity: float | int | Decimal, *,
            day: dt.date, key: str = "") -> None:
        if product not in PRODUCTS or product == "active_device":
            raise ValueError(f"not a summed product: {product!r}")
        if quantity <= 0:
            return
        k = (org_id, day, product, key)
        self._sums[k] = self._sums.get(k, Decimal(0)) + Decimal(str(quantity))

    def device_seen(self, org_id: uuid.UUID, device_id: uuid.UUID, day: dt.date) -> None:
        self._seen.put((org_id, day, device_id), {"org_id": org_id, "day": day, "device_id": device_id},
                       merge=False)

    def pending(self) -> int:
        return len(self._sums) + (len(self._unsent[1]) if self._unsent else 0)

    @property
    def active_writer(self) -> WriteBehind:
        """The write-behind of active-device rows (its counters are on /metrics)."""
        return self._seen

    async def flush(self) -> None:
        """Write what is pending now (tests, shutdown, and every ``interval``)."""
        while self._unsent is not None or self._sums:
            if self._unsent is None:
                self._unsent, self._sums = (uuid.uuid4(), self._sums), {}
            batch_id, taken = self._unsent
            rows = [{"org_id": o, "day": d, "product": p, "key": k, "quantity": q}
                    for (o, d, p, k), q in taken.items()]
            try:
                await self.usage.add_many(rows, batch_id=batch_id)
            except DatabaseUnavailable:
                # Kept, with its id, for the next flush (a cancellation leaves it there too).
                self.failures += 1
                log.warning("metering write of %d rows: the database is unreachable; kept for the next flush",
                            len(rows))
                break
            except Exception:
                self.failures += 1
                log.exception("metering write of %d rows failed; kept for the next flush", len(rows))
                break
            self._unsent = None
        await self._seen.flush()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._seen.run)
            task_status.started()
            try:
                while True:
                    await trio.sleep(self.interval)
                    await self.flush()
            finally:
                with trio.CancelScope(shield=True):
                    await self.flush()
