"""Delivering the event log to webhook endpoints: one task per endpoint, on the node holding its lease.

``keep_delivering`` runs for the node's life: every ``SCAN`` seconds (and when the API pokes it) it
tries to take the lease of each enabled endpoint it does not already serve (storage/webhooks.py:
free, expired or its own) and starts a task for each it gets. The task renews the lease every third
of ``LEASE_SECONDS``; when a renewal or a write finds the lease gone (another node took it, the
endpoint was disabled or deleted), it stops, and nothing of its own is written after the takeover.

Order: a subject's events (a device's, a rollout's) go out one after another in cursor order, and an
event is sent only once every earlier event of its subject was taken. An endpoint's events go one at
a time; while it is healthy and its receiver's answers take ``LANES_ABOVE_MS`` or more, a page's
subjects go in parallel lanes (``_lanes``). The event after the cursor that failed is retried
(``schedule.py``) one at a time until the receiver takes it; a receiver that keeps failing holds up
its own endpoint only. At least once: the cursor moves only over events taken (2xx), so an event
whose answer was lost (a timeout, a node killed mid-request) is sent again with the same
``webhook-id``, the event's id.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import uuid
from typing import TYPE_CHECKING, Any, Protocol

import trio

from device_client.shared.clock import rfc3339
from hub.eventlog import TYPE_PREFIX, envelope
from hub.webhooks import sender, signing
from hub.webhooks.schedule import Schedule
from storage.db import DatabaseUnavailable
from storage.webhooks import Attempt, Stale, WebhookFence

if TYPE_CHECKING:
    from device_client.shared.clock import Clock
    from hub.eventlog import Journal
    from hub.events import EventHub
    from hub.settings import Settings
    from storage.stores import Stores


class Delivering(Protocol):
    """What webhook delivery uses of the process (hub/services.py ``Services`` provides it; mypy checks
    that it does): read at each use, since a cluster node's event hub is made after the Deliverer."""

    @property
    def stores(self) -> "Stores": ...  # webhooks, the secret box that opens their secrets, the event log
    @property
    def events(self) -> "EventHub": ...
    @property
    def journal(self) -> "Journal": ...
    @property
    def settings(self) -> "Settings": ...
    @property
    def clock(self) -> "Clock": ...
    @property
    def node_id(self) -> str: ...

log = logging.getLogger("fleethub.webhooks")

SCAN = 2.0
LEASE_SECONDS = 30.0
IDLE_POLL = 5.0  # seconds an idle endpoint waits for a wake-up before reading the log anyway
PAGE = 100
LANES = 8  # subjects of one endpoint sent at once while it is healthy (``Deliverer._lanes``)
# Lanes pay when a delivery's time is spent waiting for the receiver (a round trip), not when it is
# the hub's own CPU: with the receiver on the same machine (about 1 ms an answer) one at a time
# delivered more (bench/events.py). So an endpoint goes by lanes once its answers take this long.
LANES_ABOVE_MS = 5.0


def kinds(event_types: list[str]) -> list[str]:
    """An endpoint's type patterns as the log stores kinds; ``*`` alone is every type."""
    if "*" in event_types:
        return []
    return [t[len(TYPE_PREFIX):] for t in event_types]


def body_of(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


async def send(s: Delivering, url: str, secret: str, event: dict[str, Any], using: Any = None) -> sender.Outcome:
    """One signed POST of a CloudEvent (``webhook-id`` is the event's id: a retry repeats it)."""
    body = body_of(event)
    stamp = int(s.clock.now().timestamp())
    return await sender.post(url, body, signing.headers(secret, event["id"], stamp, body),
                             allow_private=s.settings.webhooks_allow_private, using=using)


def attempt_of(event: dict[str, Any], outcome: sender.Outcome, number: int, now: dt.datetime, *,
               manual: bool = False) -> Attempt:
    seq = event.get("sequence")
    return Attempt(event_id=uuid.UUID(event["id"]), type=event["type"], org_seq=int(seq) if seq else None,
                   attempt=number, status=outcome.status, ok=outcome.ok, latency_ms=outcome.latency_ms,
                   excerpt=outcome.excerpt, error=outcome.error, manual=manual, at=now)


class Disabled(Exception):
    """The endpoint kept failing and was disabled: its task ends."""


class Deliverer:
    """This node's webhook delivery: the endpoints it holds and their tasks."""

    def __init__(self, s: Delivering, *, schedule: Schedule | None = None, rand: random.Random | None = None,
                 owner: str | None = None, lease_seconds: float = LEASE_SECONDS) -> None:
        self.s = s
        self.schedule = schedule or Schedule()
        self.rand = rand or random.Random()
        self.owner = owner or s.node_id or "hub"
        self.lease_seconds = lease_seconds
        self.running: dict[uuid.UUID, trio.CancelScope] = {}
        self._poke = trio.Event()
        self.delivered = 0
        self.failed = 0

    def poke(self) -> None:
        """An endpoint was created or changed: scan now rather than at the next round."""
        self._poke.set()

    def restart(self, endpoint_id: uuid.UUID) -> None:
        """An endpoint was changed, disabled or deleted: its task here (if any) stops now, rather than
        at its next lease renewal, and the next scan starts it again from storage if it is enabled.
        (On another node, its task sees the change at its next renewal: within a third of the lease.)"""
        scope = self.running.get(endpoint_id)
        if scope is not None:
            scope.cancel()
        self.poke()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    for endpoint_id in await self.s.stores.webhooks.enabled_ids():
                        if endpoint_id in self.running:
                            continue
                        fence = await self.s.stores.webhooks.acquire(endpoint_id, self.owner, self.lease_seconds)
                        if fence is not None:
                            scope = self.running[endpoint_id] = trio.CancelScope()
                            nursery.start_soon(self._serve, fence, scope)
                except DatabaseUnavailable:
                    pass  # the next round tries again
                with trio.move_on_after(SCAN):
                    await self._poke.wait()
                self._poke = trio.Event()

    async def _serve(self, fence: WebhookFence, scope: trio.CancelScope) -> None:
        try:
            with scope:
                await self._deliver(fence)
        except Disabled:
            pass
        except Stale:
            log.info("webhook endpoint %s: this node no longer holds its lease", fence.endpoint_id)
        except DatabaseUnavailable:
            log.info("webhook endpoint %s: the database is away; its lease lapses", fence.endpoint_id)
        finally:
            if self.running.get(fence.endpoint_id) is scope:  # not a successor started meanwhile
                del self.running[fence.endpoint_id]
            with trio.move_on_after(2, shield=True):
                try:
                    await self.s.stores.webhooks.release(fence)  # the next holder need not wait out the lease
                except DatabaseUnavailable:
                    pass

    async def _deliver(self, fence: WebhookFence) -> None:
        s = self.s
        ttl = self.lease_seconds
        row = await s.stores.webhooks.renew(fence, ttl)
        renew_at = trio.current_time() + ttl / 3
        secret = s.stores.secret_box.open(await s.stores.webhooks.secret(fence.endpoint_id)).decode()
        subscription = s.events.subscribe(("org", row["org_id"]))
        done: list[Attempt] = []  # taken by the receiver, not yet written
        answer_ms = [0.0]  # the receiver's answer time, smoothed: lanes or one at a time
        http = sender.client(allow_private=s.settings.webhooks_allow_private)
        try:
            while True:
                if trio.current_time() >= renew_at:
                    # Stale when the lease is gone. A renewal that cannot reach the database ends the
                    # task too (DatabaseUnavailable): past the lease's own expiry this node must send
                    # nothing more, since another may have taken the endpoint over.
                    asked = trio.current_time()
                    row = await s.stores.webhooks.renew(fence, ttl)
                    renew_at = asked + ttl / 3
                due = row["next_attempt_at"]
                if due is not None and due > s.clock.now():
                    await trio.sleep(min((due - s.clock.now()).total_seconds(), renew_at - trio.current_time()))
                    continue
                if subscription.dropped:  # it fell behind and was closed: the log has what it missed
                    subscription = s.events.subscribe(("org", row["org_id"]))
                _drain(subscription)
                last, _ = await s.stores.event_log.cursors(row["org_id"])
                page = await s.stores.event_log.page(row["org_id"], row["cursor"], limit=PAGE, types=kinds(row["event_types"]),
                                              fleets_any=row["fleet_ids"])
                if not page:
                    if last > row["cursor"]:
                        await s.stores.webhooks.skip_to(fence, last)
                        row["cursor"] = last
                    with trio.move_on_at(min(renew_at, trio.current_time() + IDLE_POLL)):
                        try:
                            await subscription.receive.receive()
                        except (trio.EndOfChannel, trio.ClosedResourceError):
                            pass
                    continue
                if row["attempts"] == 0 and answer_ms[0] >= LANES_ABOVE_MS and len({e.subject for e in page}) > 1:
                    await self._lanes(fence, row, secret, page, http, done, renew_at, answer_ms)
                else:
                    for e in page:
                        if not await self._one(fence, row, secret, envelope(e), http, done, answer_ms):
                            break
                        if trio.current_time() >= renew_at:
                            break
                await self._write_done(fence, row, done)
        finally:
            subscription.close()
            with trio.move_on_after(2, shield=True):
                await http.aclose()

    async def _write_done(self, fence: WebhookFence, row: dict, done: list[Attempt]) -> None:
        """The deliveries taken since the last write, logged, and the cursor moved to ``row``'s, in one
        transaction. Written after each page (at most ``PAGE`` events) and before a failure is: a
        node killed before it sends them again (at least once)."""
        taken = list(done)
        done.clear()
        await self.s.stores.webhooks.delivered(fence, taken, row["cursor"])

    async def _lanes(self, fence: WebhookFence, row: dict, secret: str, page: list, http: Any,
                     done: list[Attempt], stop_at: float, answer_ms: list[float]) -> None:
        """A healthy endpoint's page, one lane per subject, ``LANES`` at a time: each lane sends its
        subject's events in order and stops at its first failure, so a subject's events never
        overtake each other. The cursor then moves over the events that all succeeded from its start;
        the first failure in cursor order is retried as one at a time would have it (``_failed``),
        and the events after it that other lanes delivered are sent again after it (at least once,
        same webhook-id; each subject's events still in order). Lanes start no request past
        ``stop_at`` (the lease's renewal): the cursor stops at the first event left unsent."""
        s = self.s
        lanes: dict[str, list] = {}
        for e in page:
            lanes.setdefault(e.subject, []).append(e)
        results: dict[int, tuple[dict[str, Any], sender.Outcome, dt.datetime]] = {}
        limiter = trio.CapacityLimiter(LANES)

        async def lane(events: list) -> None:
            async with limiter:
                for e in events:
                    if trio.current_time() >= stop_at:
                        return
                    event = envelope(e)
                    outcome = await send(s, row["url"], secret, event, http)
                    _smooth(answer_ms, outcome)
                    results[e.org_seq] = (event, outcome, s.clock.now())
                    if not outcome.ok:
                        return

        async with trio.open_nursery() as nursery:
            for events in lanes.values():
                nursery.start_soon(lane, events)
        moving, first_failure = True, None
        for e in page:
            if e.org_seq not in results:
                moving = False  # unsent: its lane stopped (a failure of its subject, or stop_at)
                continue
            event, outcome, at = results[e.org_seq]
            if outcome.ok:
                done.append(attempt_of(event, outcome, 1, at))
                self.delivered += 1
                if moving:
                    row["cursor"] = e.org_seq
            elif first_failure is None:
                moving, first_failure = False, (event, outcome, at)
            else:
                done.append(attempt_of(event, outcome, 1, at))  # logged; retried after the first
                self.failed += 1
        if first_failure is not None:
            event, outcome, at = first_failure
            await self._failed(fence, row, attempt_of(event, outcome, 1, at), outcome, done)

    async def _one(self, fence: WebhookFence, row: dict, secret: str, event: dict[str, Any], http: Any,
                   done: list[Attempt], answer_ms: list[float]) -> bool:
        """Send one event; True when the receiver took it (written with the page, ``_write_done``)."""
        s = self.s
        outcome = await send(s, row["url"], secret, event, http)
        _smooth(answer_ms, outcome)
        now = s.clock.now()
        number = row["attempts"] + 1
        attempt = attempt_of(event, outcome, number, now)
        if outcome.ok:
            done.append(attempt)
            self.delivered += 1
            row.update(cursor=attempt.org_seq, attempts=0, failing_since=None, next_attempt_at=None)
            return True
        await self._failed(fence, row, attempt, outcome, done)
        return False

    async def _failed(self, fence: WebhookFence, row: dict, attempt: Attempt, outcome: sender.Outcome,
                      done: list[Attempt]) -> None:
        """The event after the cursor failed: what was taken before is written, then the failure and
        its retry time, or the endpoint is disabled when it has failed for the schedule's give-up time."""
        s = self.s
        await self._write_done(fence, row, done)
        self.failed += 1
        now, number = attempt.at, attempt.attempt
        failing_since = row["failing_since"] or now
        if self.schedule.exhausted(failing_since, now):
            reason = (f"every delivery failed since {rfc3339(failing_since)}; last: "
                      f"{outcome.error or outcome.status}")
            await s.stores.webhooks.failed(fence, attempt, None, disable_reason=reason)
            log.warning("webhook endpoint %s disabled after failing since %s", fence.endpoint_id,
                        rfc3339(failing_since))
            s.journal.record(row["org_id"], {
                "kind": "webhook.disabled", "webhookId": str(fence.endpoint_id), "at": rfc3339(now),
                "payload": {"reason": reason, "failingSince": rfc3339(failing_since), "attempts": number,
                            "stoppedAtSequence": attempt.org_seq}})
            raise Disabled(fence.endpoint_id)
        retry = now + dt.timedelta(seconds=self.schedule.delay(number, self.rand))
        await s.stores.webhooks.failed(fence, attempt, retry)
        row.update(attempts=number, failing_since=failing_since, next_attempt_at=retry)


def _smooth(answer_ms: list[float], outcome: sender.Outcome) -> None:
    answer_ms[0] += (outcome.latency_ms - answer_ms[0]) / 8


def _drain(subscription: Any) -> None:
    while True:
        try:
            subscription.receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return
