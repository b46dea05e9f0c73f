"""Server-sent event streams over the event hub's bounded subscriptions (devices, rollouts).

With the event log on (hub/eventlog.py), a stream sends what the log holds, not what the event hub
carries: an event published on the stream's topic only wakes it, and it then reads the log after the
last cursor it sent (``Replay``). Every event goes out with its cursor as ``id:``; a client that
reconnects with ``Last-Event-ID`` (what EventSource does by itself) gets what it missed from the log
and then the live events, with no gap (an organisation's events commit in cursor order,
storage/events.py) and no duplicate (each read starts after the last cursor sent). The snapshot a
fresh stream begins with carries the cursor read before it was built.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from quart import make_response, request

from hub.api.common import jsonable
from hub.auth.streams import StreamAccess
from hub.errors import BadRequest, FleethubError, Gone
from hub.eventlog import record_of
from hub.events import RESYNC, Subscriber, UnsafeEventName, sse_frame
from storage.db import DatabaseUnavailable
from storage.events import EventLog

log = logging.getLogger("fleethub.sse")
KEEPALIVE = 15.0
REPLAY_PAGE = 500
RETRY_LOG = 1.0  # seconds before a stream reads the log again after PostgreSQL did not answer


def sse(event: dict, id: int | None = None) -> bytes:
    """The event's kind names it; its whole record is the data (framed line by line by sse_frame)."""
    return sse_frame(json.dumps(jsonable(event), separators=(",", ":")), event=str(event["kind"]), id=id)


def _frame_or_skip(event: dict, id: int | None = None) -> bytes:
    # Kinds are checked where they enter (device_client/shared/protocol.py): one that is still unsafe here is
    # a bug elsewhere. It is left out of the stream (logged), never written raw.
    try:
        return sse(event, id)
    except UnsafeEventName as exc:
        log.error("an event with an unsafe name was left out of a stream: %s", exc)
        return b""


@dataclass
class Replay:
    """A stream's place in the event log: the organisation, the subject it follows (None: all of the
    organisation's), the last cursor sent, and whether the stream begins with its snapshot (a fresh
    stream) or with what a reconnecting client missed."""
    log: EventLog
    org_id: uuid.UUID
    subject: str | None
    after: int
    snapshot: bool

    async def missed(self) -> AsyncIterator[bytes]:
        """Every event of the log after ``after``, page by page, moving ``after`` as each is framed."""
        while True:
            page = await self.log.page(self.org_id, self.after, limit=REPLAY_PAGE, subject=self.subject)
            for e in page:
                self.after = e.org_seq
                yield _frame_or_skip(record_of(e), e.org_seq)
            if len(page) < REPLAY_PAGE:
                return


def _last_event_id() -> int | None:
    raw = request.headers.get("Last-Event-ID")
    if raw is None or not raw.strip():
        return None
    raw = raw.strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise BadRequest("Last-Event-ID must be an event cursor (a number this hub sent as id:)",
                         code="invalid_cursor")
    return int(raw)


async def resume_point(s: Any, subscription: Subscriber, org_id: uuid.UUID, subject: str | None) -> Replay | None:
    """Where a stream opened now begins, from the request's ``Last-Event-ID``: 410 cursor_expired with
    the oldest cursor still held when retention removed events after it, 400 invalid_cursor for one
    this organisation's log never reached. None with the event log off (no ids, no replay). Call it
    after subscribing and before building the snapshot, so nothing falls between them; the
    subscription is closed when the stream is refused."""
    try:
        return await _resume_point(s, org_id, subject)
    except BaseException:
        subscription.close()
        raise


async def _resume_point(s: Any, org_id: uuid.UUID, subject: str | None) -> Replay | None:
    if not s.settings.event_log:
        return None
    asked = _last_event_id()
    last, pruned = await s.stores.event_log.cursors(org_id)
    if asked is None:
        return Replay(s.stores.event_log, org_id, subject, last, snapshot=True)
    if asked < pruned:
        raise Gone(f"events after cursor {asked} are past the event log's retention; the oldest cursor "
                   f"to resume from is {pruned}", details={"oldestCursor": pruned})
    if asked > last:
        raise BadRequest(f"cursor {asked} is ahead of this organisation's event log (at {last})",
                         code="invalid_cursor")
    return Replay(s.stores.event_log, org_id, subject, asked, snapshot=False)


async def stream_response(subscription: Subscriber, first: dict, dropped: dict,
                          access: StreamAccess | None = None, replay: Replay | None = None,
                          snapshot: Callable[[], Awaitable[dict]] | None = None):
    """The first event (a snapshot), then every event as it comes. A client that reads too slowly is
    dropped with a final ``dropped`` event rather than buffered without bound; a comment line every
    15 s keeps proxies from closing an idle stream. With ``access`` (hub/auth/streams.py), the
    stream re-checks the caller's credential and relation whenever access changes and ends with a
    final ``access_revoked`` event saying why when they no longer hold. With ``replay``
    (``resume_point``), events come from the event log with their cursors (the module's docstring).
    A stream that may have missed events (``RESYNC``: a cluster node's bus was cut off) reads the log
    after its last cursor with ``replay``; without it, with ``snapshot`` (it reads the first event
    anew), it sends a fresh snapshot, and one that cannot be read ends the stream (a client's
    reconnect starts with one)."""
    owed = replay is not None  # the log may hold events this stream has not sent

    async def catch_up() -> AsyncIterator[bytes]:
        """What the log holds after the last cursor sent; a keepalive when that is nothing, so a
        client gone meanwhile is noticed at this write as it would be at an event's."""
        nonlocal owed
        sent = False
        try:
            async for frame in replay.missed():
                sent = True
                yield frame
            owed = False
        except DatabaseUnavailable:
            owed = True  # read again in RETRY_LOG seconds, from the last cursor sent
        if not sent:
            yield b": keepalive\n\n"

    async def stream():
        with subscription, (access.watch() if access is not None else contextlib.nullcontext()) as watch:
            if replay is None or replay.snapshot:
                yield sse(first, None if replay is None else replay.after)
            if replay is not None:
                async for frame in catch_up():
                    yield frame
            while True:
                if access is not None and (watch.changed or trio.current_time() >= access.recheck_at):
                    watch.rearm()
                    reason = await access.check()
                    if reason is not None:
                        yield sse({"kind": "access_revoked", **dropped, "payload": {"reason": reason}})
                        return
                deadline = trio.current_time() + KEEPALIVE
                if access is not None:
                    deadline = min(deadline, access.recheck_at)
                retry_at = trio.current_time() + RETRY_LOG if owed else None
                event, ended = None, False
                # Nothing is yielded inside the cancel scope: an access change cancels only the wait.
                with trio.move_on_at(deadline if retry_at is None else min(deadline, retry_at)) as waiting:
                    if watch is not None:
                        watch.on_change = waiting.cancel
                        if watch.changed:  # changed while the last check ran
                            waiting.cancel()
                    try:
                        event = await subscription.receive.receive()
                    except trio.EndOfChannel:
                        ended = True
                if watch is not None:
                    watch.on_change = None
                if ended:
                    break
                if replay is not None and (event is not None or owed):
                    # the event is in the log already (hub/eventlog.py): read it, and what came with it;
                    # a RESYNC too: the log holds what the bus may have lost
                    subscription.resync_pending = False  # before the read: a loss after it asks again
                    _drain(subscription)
                    async for frame in catch_up():
                        yield frame
                elif event is RESYNC:
                    subscription.resync_pending = False
                    if snapshot is not None:
                        try:
                            fresh = await snapshot()
                        except (FleethubError, DatabaseUnavailable) as exc:
                            log.info("a stream ended: its snapshot could not be read again (%s)", type(exc).__name__)
                            return
                        yield sse(fresh)
                elif event is not None:
                    yield _frame_or_skip(event)
                if event is None and (not waiting.cancel_called or trio.current_time() >= deadline):
                    yield b": keepalive\n\n"
            if subscription.dropped:
                yield sse({"kind": "dropped", **dropped,
                           "payload": {"reason": "the client did not keep up with the stream"}})

    response = await make_response(stream(), 200, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                    "X-Accel-Buffering": "no"})
    response.timeout = None
    return response


def _drain(subscription: Subscriber) -> None:
    """Take every wake-up already queued: one read of the log covers them all."""
    while True:
        try:
            subscription.receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return
