"""Hub events on every node: the SSE streams of one node hear what the actors of any node publish.

Each (kind, id) topic of the event hub — ("device", id), ("org", id), ("rollout", id) — is the NATS
subject ``events.<kind>.<id>``. A node publishes every event locally and on NATS; it subscribes a
topic's subject only while a stream of its own is open on that topic, so a node with no org stream
open hears none of that org's events. An event that comes back to the node that sent it is dropped
(the local subscribers had it already). Delivery is at most once, like the in-process hub's: a
subscriber that needs everything reads the snapshot the stream begins with.

Events published while a bus is cut off (disconnected or stalled) are lost, on the node that
published them and on the node that would have heard them (issue 38 item 4). So when a node's bus
carries messages again, every stream open on it is given RESYNC (it sends a fresh snapshot), and the
node says so on ``events.resync``: every other node does the same for its streams, since events this
node published meanwhile never reached them.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable
from typing import Any

import trio

from hub.events import RESYNC, EventHub, Subscriber

KINDS = frozenset({"device", "org", "rollout"})
RESYNC_SUBJECT = "events.resync"


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
        self.resyncs = 0  # streams given a fresh snapshot after a bus outage

        async def other_node_back(_subject: str, payload: dict[str, Any]) -> None:
            if payload.get("origin") != self.node:
                self.resync()

        self._resync_sub = bus.subscribe(RESYNC_SUBJECT, other_node_back)
        bus.on_restored(self._back)

    def _back(self) -> None:
        self.resync()
        self.bus.publish(RESYNC_SUBJECT, {"origin": self.node})

    def resync(self) -> None:
        """Every stream of a cluster-wide topic on this node sends a fresh snapshot (once, however many
        outages it missed before it read the first RESYNC)."""
        for topic in list(self._remote):
            for sub in list(self._topics.get(topic, ())):
                if sub.resync_pending:
                    continue
                sub.resync_pending = True
                self.resyncs += 1
                try:
                    sub.send.send_nowait(RESYNC)
                except trio.WouldBlock:  # too far behind to catch up anyway: dropped, as by publish
                    sub.dropped = True
                    self.dropped += 1
                    sub.close()
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    self._remove(sub)

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
