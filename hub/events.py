"""Bounded broadcast of hub events per topic (an organisation, a device), for SSE subscribers, and
``sse_frame``, the one writer of server-sent event frames (device, rollout and assistant streams).

A subscriber whose buffer is full is dropped, never buffered without bound: its stream ends and
``dropped`` tells the SSE endpoint to send a final event saying so. Streams held open at once are
capped per owner (an organisation): a client opening stream after stream gets 429, not the hub's
memory (``MAX_STREAMS_PER_OWNER``, docs/operations.md).
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import trio

from hub.errors import RateLimited

MAX_STREAMS_PER_OWNER = 100

# What ends a line in an event stream (the SSE grammar): CRLF, LF or CR alone.
_LINE_END = re.compile(r"\r\n|\r|\n")


class UnsafeEventName(ValueError):
    """An event name holding a line break: written out, it would end the ``event:`` line and let the
    rest of the name forge fields and whole events in the stream."""


def sse_frame(data: str, *, event: str | None = None, id: int | None = None) -> bytes:
    """One server-sent event: an optional ``event:`` line, an optional ``id:`` line (an event log
    cursor, a number: nothing a client sends back can hold a line break), then every line of ``data``
    framed as its own ``data:`` line (a reader joins them with LF), then the blank line that ends the
    event. Nothing in ``data`` can end the event early or add a field; an event name with CR or LF is
    refused."""
    head = ""
    if event is not None:
        if "\r" in event or "\n" in event:
            raise UnsafeEventName(f"an event name may not hold a line break: {event[:40]!r}")
        head = f"event: {event}\n"
    if id is not None:
        head += f"id: {int(id)}\n"
    body = "".join(f"data: {line}\n" for line in _LINE_END.split(data))
    return f"{head}{body}\n".encode()


# Put in a subscriber's channel, never written out: events for its topic may have been lost (a
# cluster node's bus was cut off, hub/cluster/events.py), so its stream sends a fresh snapshot.
RESYNC: dict[str, Any] = {"kind": "resync"}


class Subscriber:
    stream_id: Any = None  # a cluster node's row for the cluster-wide stream cap (hub/cluster/limits.py)
    resync_pending = False  # a RESYNC waits in the channel: one snapshot answers any number of losses

    def __init__(self, hub: "EventHub", topic: Hashable, size: int, owner: Hashable = None) -> None:
        self.hub, self.topic, self.owner = hub, topic, owner
        self.send, self.receive = trio.open_memory_channel[dict[str, Any]](size)
        self.dropped = False

    def close(self) -> None:
        self.hub._remove(self)
        self.send.close()
        self.hub._release(self)

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EventHub:
    def __init__(self, buffer: int = 256, max_per_owner: int = MAX_STREAMS_PER_OWNER) -> None:
        self.buffer = buffer
        self.max_per_owner = max_per_owner
        self._topics: dict[Hashable, set[Subscriber]] = {}
        self._owned: dict[Hashable, set[Subscriber]] = {}
        self.published = 0
        self.dropped = 0

    def subscribe(self, topic: Hashable, owner: Hashable = None) -> Subscriber:
        """``owner`` (an organisation) is counted against ``max_per_owner``: RateLimited over it."""
        if owner is not None:
            held = self._owned.setdefault(owner, set())
            if len(held) >= self.max_per_owner:
                raise RateLimited(f"at most {self.max_per_owner} event streams may be open at once",
                                  code="too_many_streams", retry_after=5)
        sub = Subscriber(self, topic, self.buffer, owner)
        self._topics.setdefault(topic, set()).add(sub)
        if owner is not None:
            self._owned[owner].add(sub)
        return sub

    async def open(self, topic: Hashable, owner: Hashable = None) -> Subscriber:
        """``subscribe`` for an SSE endpoint; a cluster node also counts the stream on every node."""
        return self.subscribe(topic, owner)

    def _release(self, sub: Subscriber) -> None:
        held = self._owned.get(sub.owner)
        if held is not None:
            held.discard(sub)
            if not held:
                del self._owned[sub.owner]

    def publish(self, topic: Hashable, event: dict[str, Any]) -> None:
        subs = self._topics.get(topic)
        if not subs:
            return
        self.published += 1
        for sub in list(subs):
            try:
                sub.send.send_nowait(event)
            except trio.WouldBlock:
                sub.dropped = True
                self.dropped += 1
                sub.close()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self._remove(sub)

    def _remove(self, sub: Subscriber) -> None:
        subs = self._topics.get(sub.topic)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._topics[sub.topic]

    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._topics.values())
