"""The hub's side of the event log (storage/events.py): what an event looks like outside, and the
writer that appends device events before the SSE streams hear of them.

Device events (``DeviceActor.publish``) describe changes that are themselves written behind (the
presence row, hub/services.py) or not stored at all (telemetry, heartbeats), so there is no
transaction of the change to join: ``Journal.record`` queues the event without blocking the actor and
the writer appends queued events in batches, one transaction per batch, then publishes each on its
topics. Rollout events are appended in the rollout's own save transaction (actors/rollout.py) and
published after it commits. Either way an event reaches a stream only once it is in the log, so a
stream's ``id:`` is always a cursor a client can resume from.

While PostgreSQL is away the queue waits (capped at ``MAX_PENDING``: past it the oldest event is
dropped, counted in ``dropped`` and logged once per outage). A batch PostgreSQL refuses for another
reason is written again by halves; an event refused on its own is set aside (counted, logged by kind).

The envelope is CloudEvents 1.0 (``envelope``): ``type`` is ``io.fleethub.`` and the event's kind,
``subject`` is ``devices/<id>`` or ``rollouts/<id>``, and the extension ``sequence`` is the
organisation's cursor. docs/events.md is the catalogue.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import uuid
from typing import Any

import trio

from device_client.shared.clock import rfc3339
from hub.events import EventHub
from storage.db import DatabaseUnavailable
from storage.events import PRUNE_BATCH, Event, EventLog, new_event, subject_of

log = logging.getLogger("fleethub.events")

TYPE_PREFIX = "io.fleethub."
MAX_PENDING = 100_000
MAX_BATCH = 500
RETRY_AFTER = 0.5  # seconds between tries while PostgreSQL is away
# The least seconds between the starts of two batches. An event that finds the writer idle for longer
# is written at once; under a steady stream the events of one interval share a statement, so the log
# costs a device load at most 1/PACE round trips a second whatever its rate (bench/events.py's cost
# part measures it on REST: the crossing into the database thread is a fixed cost per batch that the
# hub's one core pays beside its requests). The price is an event's wait before streams and webhooks
# hear of it: nothing when events are sparse, at most PACE under a steady stream.
PACE = 0.1


def record_of(e: Event) -> dict[str, Any]:
    """The event as the SSE streams send it (the shape the actors publish)."""
    kind, _, ident = e.subject.partition("/")
    key = {"devices": "deviceId", "rollouts": "rolloutId", "webhooks": "webhookId", "organizations": "orgId"}[kind]
    return {"kind": e.kind, key: ident, "at": rfc3339(e.time), "payload": e.data}


def envelope(e: Event) -> dict[str, Any]:
    """The CloudEvents 1.0 structured form (JSON)."""
    return {"specversion": "1.0", "id": str(e.id), "source": f"/organizations/{e.org_id}",
            "type": TYPE_PREFIX + e.kind, "subject": e.subject, "time": rfc3339(e.time),
            "datacontenttype": "application/json", "sequence": str(e.org_seq), "data": e.data}


def topics(org_id: uuid.UUID, event: dict[str, Any]) -> list[tuple[str, Any]]:
    _, device_id, rollout_id = subject_of(event)
    if rollout_id is not None:
        return [("rollout", rollout_id), ("org", org_id)]
    if device_id is not None:
        return [("device", device_id), ("org", org_id)]
    return [("org", org_id)]  # a webhook's or the organisation's own: the organisation's stream alone


def publish_all(hub: EventHub, org_id: uuid.UUID, event: dict[str, Any]) -> None:
    for topic in topics(org_id, event):
        hub.publish(topic, event)


class Journal:
    """Appends device events in batches, then publishes them. ``enabled=False`` (the setting
    FLEETHUB_EVENT_LOG=0, for measuring what the log costs) publishes at once and writes nothing."""

    def __init__(self, events_log: EventLog | None, hub: EventHub, *, enabled: bool = True,
                 max_pending: int = MAX_PENDING, max_batch: int = MAX_BATCH) -> None:
        self.log, self.hub = events_log, hub
        self.enabled = enabled
        self.max_pending, self.max_batch = max_pending, max_batch
        self._pending: collections.deque[tuple[uuid.UUID, dict[str, Any]]] = collections.deque()
        self._wake = trio.Event()
        self.appended = 0
        self.dropped = 0
        self.set_aside = 0
        self._outage_logged = False
        self._idle = trio.Event()
        self._idle.set()

    def record(self, org_id: uuid.UUID, event: dict[str, Any]) -> None:
        """Queue an event (never blocks, never crosses into storage)."""
        if not self.enabled:
            publish_all(self.hub, org_id, event)
            return
        if len(self._pending) >= self.max_pending:
            self._pending.popleft()
            self.dropped += 1
            if not self._outage_logged:
                self._outage_logged = True
                log.warning("the event log's queue is full (%d events): the oldest are dropped until "
                            "PostgreSQL takes them again", self.max_pending)
        self._pending.append((org_id, event))
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._wake.set()

    def pending(self) -> int:
        return len(self._pending)

    async def wait_written(self) -> None:
        """Until every event queued so far is written (or set aside)."""
        await self._idle.wait()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        last_start = trio.current_time() - PACE
        try:
            while True:
                await self._wake.wait()
                await trio.sleep_until(last_start + PACE)
                self._wake = trio.Event()
                last_start = trio.current_time()
                # One batch per PACE; the next one at once only while a backlog of full batches waits
                # (after an outage). What arrives during a write sets _wake for the next paced round.
                while self._pending:
                    if not await self._flush_once():
                        await trio.sleep(RETRY_AFTER)
                    elif len(self._pending) < self.max_batch:
                        break
                if not self._pending:
                    self._idle.set()
        finally:
            with trio.move_on_after(5, shield=True):
                while self._pending and await self._flush_once():
                    pass

    async def _flush_once(self) -> bool:
        """Write one batch; False when PostgreSQL is away (what is not written stays queued, in order)."""
        batch = [self._pending[i] for i in range(min(self.max_batch, len(self._pending)))]
        try:
            await self._write(batch)
        except DatabaseUnavailable:
            return False
        self._outage_logged = False
        return True

    def _dequeue(self, written: list[tuple[uuid.UUID, dict[str, Any]]]) -> None:
        """Take written events off the queue as soon as they are written, so that an outage in the
        middle of a batch written by halves writes none of them twice. By identity: ``record`` may
        have dropped the oldest meanwhile (queue full)."""
        for item in written:
            if self._pending and self._pending[0] is item:
                self._pending.popleft()

    async def _write(self, batch: list[tuple[uuid.UUID, dict[str, Any]]]) -> None:
        try:
            await self.log.append([new_event(org_id, event) for org_id, event in batch])
        except DatabaseUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 — one event PostgreSQL refuses must not stop the others
            if len(batch) > 1:
                half = len(batch) // 2
                await self._write(batch[:half])
                await self._write(batch[half:])
                return
            self.set_aside += 1
            self._dequeue(batch)
            log.error("an event of kind %s was refused by the event log and set aside (%s)",
                      batch[0][1].get("kind"), type(exc).__name__)
            return
        self._dequeue(batch)
        self.appended += len(batch)
        for org_id, event in batch:
            publish_all(self.hub, org_id, event)


PRUNE_EVERY = 60.0  # seconds between rounds of pruning


async def keep_pruned(events_log: EventLog, clock: Any, retention_days: float, *,
                      task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Every minute, delete events older than the retention in batches until none is left (each
    batch its own short transaction, so appends wait for no long delete)."""
    task_status.started()
    while True:
        try:
            while await events_log.prune(clock.now() - dt.timedelta(days=retention_days)) >= PRUNE_BATCH:
                await trio.sleep(0)
        except DatabaseUnavailable:
            pass  # the next round prunes what this one could not
        await trio.sleep(PRUNE_EVERY)
