"""Tells for a device's actor that must reach the node holding the device's link, at least once.

A configuration assigned, a secret file saved or deleted, a registry login or a fleet's proxy changed:
whichever node handled it tells the device's actor there if the device is linked there; otherwise (``deliver``) it reads which node accepted the
device's last link (``devices.last_link_node``, written at link time, before the link's hello reads
anything) and asks that node, on its own subject ``cluster.node.<node>.tell``, to hand the tell to its
actor. The answer says whether it held the link. No answer (the bus down or stalled, the node gone) is
tried again with backoff, re-reading the holder each time, for up to ``PERSIST`` seconds.

Why this is at least once and not "maybe": the change is committed before the holder is read, and a
node claims a link (``claim_link``) before that link's hello reads storage. So either the holder read
is the node whose link's hello will not see the change (and it is told, until it acknowledges), or the
device's next hello (on whichever node) sees the change itself. A holder that answers "not held" means
the device left it; its next link's hello syncs. Only a tell still unanswered after ``PERSIST`` is
dropped, counted (``dropped``) and logged: the device gets the change at its next hello.

Delivery may repeat (an answer lost after the holder acted): every tell here is idempotent (apply the
assigned version unless it runs; push what is pending; remove paths the hub no longer has).
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import trio

from actors.bus import BusError, Subscription
from actors.device import ApplyConfig, RemoveFiles, SendPullSettings, SyncFiles
from actors.errors import AskError
from device_client.shared.backoff import Backoff
from storage.db import DatabaseUnavailable

if TYPE_CHECKING:
    from hub.cluster.topology import ClusterNode
    from hub.services import Services

log = logging.getLogger("fleethub.cluster")

PERSIST = 60.0  # seconds a tell is tried before it is left to the device's next hello
ANSWER_TIMEOUT = 2.0  # handing a tell to an actor takes no device round trip


def _message(payload: dict[str, Any]) -> object | None:
    kind = payload.get("kind")
    if kind == "ApplyConfig":
        return ApplyConfig()
    if kind == "SyncFiles":
        return SyncFiles()
    if kind == "SendPullSettings":
        return SendPullSettings()
    if kind == "RemoveFiles" and isinstance(payload.get("paths"), list):
        return RemoveFiles(tuple(str(p) for p in payload["paths"]))
    return None


def payload_of(msg: object) -> dict[str, Any]:
    """The bus form of a tell (the inverse of ``_message``)."""
    if isinstance(msg, RemoveFiles):
        return {"kind": "RemoveFiles", "paths": list(msg.paths)}
    return {"kind": type(msg).__name__}


class Tells:
    """This node's side of cross-node tells: answering other nodes' and delivering its own."""

    def __init__(self, s: Services) -> None:
        self.s = s
        self.delivered = 0
        self.retries = 0
        self.dropped = 0

    async def on_tell(self, subject: str, payload: dict[str, Any]) -> dict[str, Any]:
        msg = _message(payload)
        try:
            device_id = uuid.UUID(str(payload.get("device")))
        except ValueError:
            msg = None
        if msg is None:
            return {"held": False, "error": "not a tell this node takes"}
        if device_id not in self.s.links:
            return {"held": False}  # the device left this node: its next hello syncs
        (await self.s.device_actor(device_id)).tell(msg)
        return {"held": True}

    def send(self, device_id: uuid.UUID, msg: object) -> None:
        """Deliver in the background (callers are request handlers and actors: neither waits out an
        outage of the bus)."""
        self.s.spawn(self.deliver, device_id, msg, name=f"tell {type(msg).__name__}")

    async def deliver(self, device_id: uuid.UUID, msg: object) -> bool:
        """True when a node holding the link took it, or none holds it (the next hello syncs)."""
        s = self.s
        backoff = Backoff(0.25, 5.0)
        deadline = trio.current_time() + PERSIST
        payload = {**payload_of(msg), "device": str(device_id)}
        while True:
            if device_id in s.links:
                (await s.device_actor(device_id)).tell(msg)
                self.delivered += 1
                return True
            try:
                node = await s.stores.devices.last_link_node(device_id)
                if node is None or node == s.node_id:
                    return True  # linked nowhere, or it left this node: its next hello syncs
                await s.bus.request(f"cluster.node.{node}.tell", payload, timeout=ANSWER_TIMEOUT)
                self.delivered += 1
                return True
            except (BusError, AskError, DatabaseUnavailable) as exc:
                reason = type(exc).__name__
            if trio.current_time() >= deadline:
                self.dropped += 1
                log.warning("device %s: %s not delivered for %.0f s (%s): left to its next hello",
                            device_id, type(msg).__name__, PERSIST, reason)
                return False
            self.retries += 1
            await trio.sleep(backoff.next_delay())


def subscribe(c: ClusterNode) -> Subscription:
    return c.bus.subscribe(f"cluster.node.{c.node_id}.tell", c.tells.on_tell)
