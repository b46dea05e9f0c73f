"""Metering: what the hub did, counted for billing, written in batches.

``Meter.add`` and ``Meter.device_seen`` never block and never cross into storage: quantities are
summed in memory per (organisation, UTC day, product, key) and flushed every few seconds in one
statement (storage/usage.py). A hub that stops flushes under a shield; a hub killed with SIGKILL
loses at most one interval of counts.

Exactly once: each flushed batch carries an id, stored in the same transaction as its sums. A batch
whose outcome is unknown (PostgreSQL unreachable, or the flush cancelled at the instant of its
COMMIT) is kept as it is and sent again under the same id, so it counts once whether or not the
first try committed; newer counts go in a later batch.

One bad row costs only itself: a batch PostgreSQL refuses for another reason (a row it cannot store:
an organisation that is not there, text it cannot hold, a key too long for the index) rolled back
whole, so it is written again in halves, and halves of halves, down to single rows; a row refused on
its own is set aside (counted in ``set_aside``, /metrics ``fleethub_write_behind_set_aside_total
{kind="metering"}``, logged by organisation, product and day, never its key). Each half has its own
id, derived from its parent's id and its place (``piece_id``), and is kept with that id until its
outcome is known, so a half whose outcome was lost is sent again under the same id and adds nothing
twice either.

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
from storage.behind import _reason  # class and SQLSTATE only: a message may quote the row
from storage.db import DatabaseUnavailable
from storage.usage import Usage

log = logging.getLogger("fleethub.metering")

PRODUCTS = ("active_device", "tunnel_minutes", "tunnel_bytes", "tunnel_relayed_bytes",
            "registry_fallback_bytes", "assistant_prompt_tokens", "assistant_completion_tokens",
            "assistant_tool_tokens")


# Rows in one statement; more wait for the next batch of the same flush.
MAX_BATCH = 5000
# One count above this is a broken counter, not usage (tunnel bytes are bigint, below 9.3e18).
MAX_QUANTITY = Decimal(10) ** 20


def piece_id(parent: uuid.UUID, half: int) -> uuid.UUID:
    """The id of half 0 or 1 of a refused batch: a function of the parent's id, so a half is always
    sent under the same id, and never under an id another batch or half could have."""
    return uuid.uuid5(parent, str(half))


class Meter:
    def __init__(self, usage: Usage, *, interval: float = 2.0, max_batch: int = MAX_BATCH) -> None:
        self.usage = usage
        self.interval = interval
        self.max_batch = max_batch
        self._sums: dict[tuple, Decimal] = {}
        # Pieces taken from the sums and not known stored, in order: (id, rows). A piece whose write
        # was refused is replaced by its two halves; one whose outcome is unknown stays, with its id.
        self._unsent: list[tuple[uuid.UUID, list[dict]]] = []
        self._seen = WriteBehind(usage.mark_active_many, interval=interval, name="active-device rows")
        self.failures = 0  # writes that failed: refused (then halved) or not reached (then kept)
        self.written = 0  # sums stored (a piece sent again that had been stored counts once)
        self.set_aside = 0  # sums refused (by PostgreSQL on their own, or by add()): never stored, logged
        # One flush at a time (the run loop, a billing read, shutdown): two would send the same piece
        # and then each take the other's outcome for its own.
        self._flushing = trio.Lock()

    def add(self, org_id: uuid.UUID, product: str, quantity: float | int | Decimal, *,
            day: dt.date, key: str = "") -> None:
        if product not in PRODUCTS or product == "active_device":
            raise ValueError(f"not a summed product: {product!r}")
        quantity = Decimal(str(quantity))
        if not quantity.is_finite() or quantity > MAX_QUANTITY:
            # Made storable here, not in the batch: numeric would keep NaN or Infinity in every later
            # sum of the day, and asyncpg writes a numeric past 10**131072 as a wrong number, silently.
            # A caller is a device's report or an actor: it is told nothing, the count is set aside.
            self.set_aside += 1
            log.error("metering: a %s quantity of organisation %s for %s is not a count (%s); set aside",
                      product, org_id, day, "not finite" if not quantity.is_finite() else "too large")
            return
        if quantity <= 0:
            return
        k = (org_id, day, product, key)
        self._sums[k] = self._sums.get(k, Decimal(0)) + quantity

    def device_seen(self, org_id: uuid.UUID, device_id: uuid.UUID, day: dt.date) -> None:
        self._seen.put((org_id, day, device_id), {"org_id": org_id, "day": day, "device_id": device_id},
                       merge=False)

    def pending(self) -> int:
        return len(self._sums) + sum(len(rows) for _, rows in self._unsent)

    @property
    def active_writer(self) -> WriteBehind:
        """The write-behind of active-device rows (its counters are on /metrics)."""
        return self._seen

    def _take(self) -> None:
        """Move up to ``max_batch`` sums into a new piece with a fresh id."""
        keys = list(self._sums)[:self.max_batch]
        rows = [{"org_id": o, "day": d, "product": p, "key": k, "quantity": self._sums.pop((o, d, p, k))}
                for (o, d, p, k) in keys]
        self._unsent.append((uuid.uuid4(), rows))

    async def flush(self) -> None:
        """Write what is pending now (tests, shutdown, billing reads, and every ``interval``)."""
        async with self._flushing:
            await self._flush_pending()
        await self._seen.flush()

    async def _flush_pending(self) -> None:
        while self._unsent or self._sums:
            if not self._unsent:
                self._take()
            ident, rows = self._unsent[0]
            try:
                await self.usage.add_many(rows, batch_id=ident)
            except DatabaseUnavailable:
                # Kept, with its id, for the next flush (a cancellation leaves it there too).
                self.failures += 1
                log.warning("metering write of %d rows: the database is unreachable; kept for the next flush",
                            len(rows))
                return
            except Exception as exc:  # noqa: BLE001 — refused: the transaction rolled back whole
                self.failures += 1
                self._refused(exc)
                continue
            self._unsent.pop(0)
            self.written += len(rows)

    def _refused(self, exc: BaseException) -> None:
        """The first piece was refused (nothing of it stored): halve it, or set a single row aside."""
        ident, rows = self._unsent[0]
        if len(rows) == 1:
            self._unsent.pop(0)
            self.set_aside += 1
            r = rows[0]
            log.error("metering: the database refused the %s sum of organisation %s for %s (%s); set aside",
                      r["product"], r["org_id"], r["day"], _reason(exc))
            return
        log.warning("metering write of %d rows was refused (%s); writing it again in halves",
                    len(rows), _reason(exc))
        half = len(rows) // 2
        self._unsent[0:1] = [(piece_id(ident, 0), rows[:half]), (piece_id(ident, 1), rows[half:])]

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
