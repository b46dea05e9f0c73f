"""The one timer of a Supervisor's parked actors (actors/_runtime/actor.py, "Parking").

    ParkTimer    ``schedule(actor, at)`` wakes the parked ``actor`` at trio time ``at`` through the
                 ``wake`` it was given (``Supervisor._wake``). One task for all parked actors, started
                 by the first entry and ending when the heap is empty; one live heap entry per actor
                 (its earliest), kept in ``actor._timer_entry`` as [at, seq, actor, due].

A device between heartbeats parks with its offline deadline (30 s away, moved on by every heartbeat).
Pushing a new heap entry per heartbeat would grow the heap with 15,000 devices; instead an actor
keeps its earliest entry and records in ``due`` the deadline it parked with last. When the entry falls
due, the timer wakes the actor if ``due`` has come, schedules ``due`` if it is later, and drops the
entry if the actor is awake (an awake actor waits for its own deadline) or stopped.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from actors._runtime.actor import Actor


class ParkTimer:
    """Parked actors' deadlines, in a heap, woken by one task."""

    def __init__(self, spawn: Callable[..., Any], wake: Callable[[Actor, float], None]) -> None:
        self._spawn = spawn  # starts a task in the Supervisor's nursery
        self._wake = wake  # starts a parked actor's task again, for the deadline it is woken for
        self._heap: list[list] = []  # [at, seq, actor or None once superseded or stopped, due]
        self._seq = 0
        self._running = False
        self._sleep: trio.CancelScope | None = None  # the timer's sleep, moved earlier when needed

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, actor: Actor, at: float) -> None:
        """Wake the parked ``actor`` at ``at``: one entry per actor, the earliest; when an entry falls
        due the timer compares it with the deadline the actor parked with last, and schedules that."""
        entry = actor._timer_entry
        if entry is not None:
            if entry[0] <= at:
                entry[3] = at  # its entry comes first: the timer looks again then
                return
            entry[2] = None  # superseded by the earlier one
        self._seq += 1
        entry = actor._timer_entry = [at, self._seq, actor, at]
        heapq.heappush(self._heap, entry)
        if not self._running:
            self._running = True
            self._spawn(self._run_timer)
        elif self._sleep is not None and at < self._sleep.deadline:
            self._sleep.deadline = at

    async def _run_timer(self) -> None:
        # One task for all parked actors' deadlines; it ends when the heap is empty and the next
        # _schedule starts it again.
        timers = self._heap
        try:
            while timers:
                with trio.CancelScope(deadline=timers[0][0]) as self._sleep:
                    await trio.sleep_forever()
                self._sleep = None
                now = trio.current_time()
                while timers and timers[0][0] <= now:
                    entry = heapq.heappop(timers)
                    actor = entry[2]
                    if actor is None:
                        continue  # superseded, or its actor stopped
                    actor._timer_entry = None
                    if actor._awake or actor.stopped:
                        continue  # an awake actor waits for its own deadline and schedules again if it parks
                    # The entry may be older than the actor's last park (it was kept, being earlier):
                    # what counts is the deadline it parked with last.
                    due = entry[3]
                    if due <= now:
                        self._wake(actor, due)
                    elif due < math.inf:
                        self.schedule(actor, due)
        finally:
            self._sleep = None
            self._running = False
