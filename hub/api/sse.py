"""Server-sent event streams over the event hub's bounded subscriptions (devices, rollouts)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

import trio
from quart import make_response

from hub.api.common import jsonable
from hub.auth.streams import StreamAccess
from hub.errors import FleethubError
from hub.events import RESYNC, Subscriber, UnsafeEventName, sse_frame
from storage.db import DatabaseUnavailable

log = logging.getLogger("fleethub.sse")
KEEPALIVE = 15.0


def sse(event: dict) -> bytes:
    """The event's kind names it; its whole record is the data (framed line by line by sse_frame)."""
    return sse_frame(json.dumps(jsonable(event), separators=(",", ":")), event=str(event["kind"]))


def _frame_or_skip(event: dict) -> bytes:
    # Kinds are checked where they enter (device_client/shared/protocol.py): one that is still unsafe here is
    # a bug elsewhere. It is left out of the stream (logged), never written raw.
    try:
        return sse(event)
    except UnsafeEventName as exc:
        log.error("an event with an unsafe name was left out of a stream: %s", exc)
        return b""


async def stream_response(subscription: Subscriber, first: dict, dropped: dict,
                          access: StreamAccess | None = None,
                          snapshot: Callable[[], Awaitable[dict]] | None = None):
    """The first event (a snapshot), then every event as it comes. A client that reads too slowly is
    dropped with a final ``dropped`` event rather than buffered without bound; a comment line every
    15 s keeps proxies from closing an idle stream. With ``access`` (hub/auth/streams.py), the
    stream re-checks the caller's credential and relation whenever access changes and ends with a
    final ``access_revoked`` event saying why when they no longer hold. With ``snapshot`` (it reads the
    first event anew), a stream that may have missed events (a cluster node's bus was cut off) sends
    a fresh snapshot; one that cannot be read ends the stream (a client's reconnect starts with one)."""

    async def stream():
        with subscription, (access.watch() if access is not None else contextlib.nullcontext()) as watch:
            yield sse(first)
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
                event, ended = None, False
                # Nothing is yielded inside the cancel scope: an access change cancels only the wait.
                with trio.move_on_at(deadline) as waiting:
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
                if event is RESYNC:
                    subscription.resync_pending = False  # before the read: a loss after it asks again
                    if snapshot is not None:
                        try:
                            fresh = await snapshot()
                        except (FleethubError, DatabaseUnavailable) as exc:
                            log.info("a stream ended: its snapshot could not be read again (%s)", type(exc).__name__)
                            return
                        yield sse(fresh)
                elif event is not None:
                    yield _frame_or_skip(event)
                elif not waiting.cancel_called or trio.current_time() >= deadline:
                    yield b": keepalive\n\n"
            if subscription.dropped:
                yield sse({"kind": "dropped", **dropped,
                           "payload": {"reason": "the client did not keep up with the stream"}})

    response = await make_response(stream(), 200, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                    "X-Accel-Buffering": "no"})
    response.timeout = None
    return response
