"""Bounded broadcast of hub events per topic (an organisation, a device), for SSE subscribers.

A subscriber whose buffer is full is dropped, never buffered without bound: its stream ends and
``dropped`` tells the SSE endpoint to send a final event saying so.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import trio


class Subscriber:
    def __init__(self, hub: "EventHub", topic: Hashable, size: int) -> None:
        self.hub, self.topic = hub, topic
        self.send, self.receive = trio.open_memory_channel[dict[str, Any]](size)
        self.dropped = False

    def close(self) -> None:
        self.hub._remove(self)
        self.send.close()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EventHub:
    def __init__(self, buffer: int = 256) -> None:
        self.buffer = buffer
        self._topics: dict[Hashable, set[Subscriber]] = {}
        self.published = 0
        self.dropped = 0

    def subscribe(self, topic: Hashable) -> Subscriber:
        sub = Subscriber(self, topic, self.buffer)
        self._topics.setdefault(topic, set()).add(sub)
        return sub

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
