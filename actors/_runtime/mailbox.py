"""An actor's mailbox: a bounded queue with one reader (the actor's own loop) and any number of writers.

Every online device has an actor, so the mailbox's own size is paid 15,000 times per process. A trio
memory channel does this job with about 6 KiB per actor (its MemoryChannelState, the two channel ends
and their parking lots: bench/memory_profile.py, per device); this does it with a list and a slot for
the one waiting reader, under 0.5 KiB. The semantics are the channel's, for what the runtime uses:

- ``send_nowait`` raises ``trio.WouldBlock`` when full and ``trio.ClosedResourceError`` once closed;
- ``send`` waits for room (the actor's own background tasks: they must not drop their outcome);
- ``receive`` waits for an item and is cancellable (the loop waits under ``move_on_at(deadline)``):
  an item handed to a reader that was cancelled meanwhile is never lost, because items are handed
  over only by rescheduling a reader still parked, which trio does not cancel after the fact;
- ``close`` refuses further sends and wakes waiting senders with ``ClosedResourceError``; what is
  queued stays readable (the runtime closes only an empty mailbox, ``Actor._stop``).
"""

from __future__ import annotations

from typing import Any

import outcome
import trio


class Mailbox:
    __slots__ = ("size", "_items", "_closed", "_reader", "_room")

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: list[Any] = []  # at most ``size``; an empty list is 56 bytes, a deque 600
        self._closed = False
        self._reader: trio.lowlevel.Task | None = None  # the loop, parked in ``receive``
        self._room: trio.lowlevel.ParkingLot | None = None  # senders waiting for room (rare: made on need)

    def __len__(self) -> int:
        return len(self._items)

    def send_nowait(self, item: Any) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the mailbox is closed")
        if self._reader is not None:  # the reader waits: hand it over (the list must be empty)
            reader, self._reader = self._reader, None
            trio.lowlevel.reschedule(reader, outcome.Value(item))
            return
        if len(self._items) >= self.size:
            raise trio.WouldBlock
        self._items.append(item)

    async def send(self, item: Any) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                self.send_nowait(item)
            except trio.WouldBlock:
                if self._room is None:
                    self._room = trio.lowlevel.ParkingLot()
                await self._room.park()
                continue
            await trio.lowlevel.cancel_shielded_checkpoint()
            return

    async def receive(self) -> Any:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._items:
            item = self._items.pop(0)
            if self._room is not None:
                self._room.unpark()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return item
        if self._reader is not None:
            raise trio.BusyResourceError("a mailbox has one reader")
        self._reader = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._reader = None
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    def take_all(self) -> list[Any]:
        """Everything still queued, removed (an actor given up answers each asker)."""
        items, self._items = self._items, []
        if self._room is not None:
            self._room.unpark_all()
        return items

    def close(self) -> None:
        self._closed = True
        if self._room is not None:
            self._room.unpark_all()  # each waiting sender retries and meets the closed mailbox
