"""Hub events on every node: the SSE streams of one node hear what the actors of any node publish.

Each (kind, id) topic of the event hub — ("device", id), ("org", id), ("rollout", id) — is the NATS
subject ``events.<kind>.<id>``. A node publishes every event locally and on NATS; it subscribes a
topic's subject only while a stream of its own is open on that topic, so a node with no org stream
open hears none of that org's events. An event that comes back to the node that sent it is dropped
(the local subscribers had it already). Delivery is at most once, like the in-process hub's: a
subscriber that needs everything reads the snapshot the stream begins with.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable
from typing import Any

from hub.events import EventHub, Subscriber

KINDS = frozenset({"device", "org", "rollout"})


def subject_for(topic: Hashable) -> str | None:
    if isinstance(topic, tuple) and len(topic) == 2 and topic[0] in KINDS and isinstance(topic[1], uuid.UUID):
        return f"events.{topic[0]}.{topic[1]}"
    return None  # a local-only topic


class ClusterEventHub(EventHub):
    def __init__(self, bus: Any, node: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.bus, self.node = bus, node
        self._remote: dict[Hashable, Any] = {}  # topic -> bus subscription, while a local stream is open
        self.from_other_nodes = 0

    def publish(self, topic: Hashable, event: dict[str, Any]) -> None:
        super().publish(topic, event)
        subject = subject_for(topic)
        if subject is not None:
            self.bus.publish(subject, {"origin": self.node, "event": event})

    def subscribe(self, topic: Hashable, owner: Hashable = None) -> Subscriber:
        sub = super().subscribe(topic, owner)
        subject = subject_for(topic)
        if subject is not None and topic not in self._remote:
            async def heard(_subject: str, payload: dict[str, Any], topic: Hashable = topic) -> None:
                if payload.get("origin") != self.node and isinstance(payload.get("event"), dict):
                    self.from_other_nodes += 1
                    EventHub.publish(self, topic, payload["event"])
            self._remote[topic] = self.bus.subscribe(subject, heard)
        return sub

    def _remove(self, sub: Subscriber) -> None:
        super()._remove(sub)
        if sub.topic not in self._topics:
            remote = self._remote.pop(sub.topic, None)
            if remote is not None:
                remote.close()
