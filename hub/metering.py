"""Metering: what the hub did, counted for billing, written in batches.

``Meter.add`` and ``Meter.device_seen`` never block and never cross into storage: quantities are
summed in memory per (organisation, UTC day, product, key) and flushed every few seconds in one
statement (storage/usage.py). A hub that stops flushes under a shield; a hub killed with SIGKILL
loses at most one interval of counts.

Both are outboxes (storage/behind.py), /metrics kinds ``metering`` and ``active_device``. While
PostgreSQL is away the sums wait, one per key, up to 100,000 keys (``MAX_PENDING``; past that the
oldest are dropped, counted in ``fleethub_write_behind_dropped_total{kind="metering"}``; they had no
cap before the outbox). The sums' outbox is the one with batch ids. Exactly once: each flushed batch
carries an id, stored in the same transaction as its sums. A batch whose outcome is unknown
(PostgreSQL unreachable, or the flush cancelled at the instant of its COMMIT) is kept as it is and
sent again under the same id, so it counts once whether or not the first try committed; newer counts
go in a later batch.

One bad row costs only itself: a batch PostgreSQL refuses for another reason (a row it cannot store:
an organisation that is not there, text it cannot hold, a key too long for the index) rolled back
whole, so it is written again in halves, and halves of halves, down to single rows; a row refused on
its own is set aside (counted in ``set_aside``, /metrics ``fleethub_write_behind_set_aside_total
{kind="metering"}``, logged by organisation, product and day, never its key). Each half has its own
id, derived from its parent's id and its place (storage/behind.py ``piece_id``), and is kept with
that id until its outcome is known, so a half whose outcome was lost is sent again under the same id
and adds nothing twice either.

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
import logging
import uuid
from collections.abc import Hashable
from decimal import Decimal

import trio

from storage.behind import WriteBehind
from storage.usage import Usage

log = logging.getLogger("fleethub.metering")

PRODUCTS = ("active_device", "tunnel_minutes", "tunnel_bytes", "tunnel_relayed_bytes",
            "registry_fallback_bytes", "assistant_prompt_tokens", "assistant_completion_tokens",
            "assistant_tool_tokens")


# Rows in one statement; more wait for the next batch of the same flush.
MAX_BATCH = 5000
# One count above this is a broken counter, not usage (tunnel bytes are bigint, below 9.3e18).
MAX_QUANTITY = Decimal(10) ** 20


def _add(old: dict, new: dict) -> dict:
    return {**old, "quantity": old["quantity"] + new["quantity"]}


def _sum_named(key: Hashable, row: dict) -> str:
    """A refused sum in the log: organisation, product and day, never its key (a user's, a fleet's)."""
    return f"the {row['product']} sum of organisation {row['org_id']} for {row['day']}"


class Meter:
    def __init__(self, usage: Usage, *, interval: float = 2.0, max_batch: int = MAX_BATCH) -> None:
        self.usage = usage
        self.interval = interval
        # Sums merge per key by adding, so a key never counts against the cap twice; a batch whose
        # outcome is unknown stays apart from newer counts, under its id.
        self.sums = WriteBehind(usage.add_many, interval=interval, max_batch=max_batch, name="metering sums",
                                merge=_add, batch_ids=True, describe=_sum_named)
        self._seen = WriteBehind(usage.mark_active_many, interval=interval, name="active-device rows")

    def add(self, org_id: uuid.UUID, product: str, quantity: float | int | Decimal, *,
            day: dt.date, key: str = "") -> None:
        if product not in PRODUCTS or product == "active_device":
            raise ValueError(f"not a summed product: {product!r}")
        quantity = Decimal(str(quantity))
        if not quantity.is_finite() or quantity > MAX_QUANTITY:
            # Made storable here, not in the batch: numeric would keep NaN or Infinity in every later
            # sum of the day, and asyncpg writes a numeric past 10**131072 as a wrong number, silently.
            # A caller is a device's report or an actor: it is told nothing, the count is set aside.
            self.sums.set_aside += 1
            log.error("metering: a %s quantity of organisation %s for %s is not a count (%s); set aside",
                      product, org_id, day, "not finite" if not quantity.is_finite() else "too large")
            return
        if quantity <= 0:
            return
        self.sums.put((org_id, day, product, key),
                      {"org_id": org_id, "day": day, "product": product, "key": key, "quantity": quantity})

    def device_seen(self, org_id: uuid.UUID, device_id: uuid.UUID, day: dt.date) -> None:
        self._seen.put((org_id, day, device_id), {"org_id": org_id, "day": day, "device_id": device_id},
                       merge=False)

    def pending(self) -> int:
        return self.sums.pending()

    @property
    def written(self) -> int:
        """Sums stored (a batch sent again that had been stored counts once)."""
        return self.sums.written

    @property
    def set_aside(self) -> int:
        """Sums refused (by PostgreSQL on their own, or by add()): never stored, logged."""
        return self.sums.set_aside

    @property
    def active_writer(self) -> WriteBehind:
        """The write-behind of active-device rows (its counters are on /metrics)."""
        return self._seen

    async def flush(self) -> None:
        """Write what is pending now (tests, shutdown, billing reads, and every ``interval``)."""
        await self.sums.flush()
        await self._seen.flush()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._seen.run)
            await nursery.start(self.sums.run)
            task_status.started()
