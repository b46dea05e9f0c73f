"""One connection per device across the cluster.

A node that accepts a device's link claims the device's next link epoch in PostgreSQL (one UPDATE ...
RETURNING) before the device's actor hears of the link, then broadcasts a takeover on NATS. Every node
holding an older link of that device closes it (4xxx superseded, as a takeover within one process
does), within the NATS round trip. The epoch also fences presence: the old node's late LinkDown or
heartbeat timeout carries its older epoch and its write matches no row (storage Devices.write_presence),
so it never marks the device offline behind the new node's back, even when the broadcast was lost.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from actors.bus import Subscription
from device_client.shared.linkcodes import Close

if TYPE_CHECKING:
    from hub.cluster.topology import ClusterNode

log = logging.getLogger("fleethub.cluster")

TAKEOVER_SUBJECTS = "cluster.takeover.*"


def subscribe(c: ClusterNode) -> Subscription:
    """Listen for other nodes' takeovers (once per process, at start)."""
    async def on_takeover(subject: str, payload: dict[str, Any]) -> None:
        try:
            device_id = uuid.UUID(subject.rsplit(".", 1)[1])
            epoch, node = int(payload["epoch"]), str(payload["node"])
        except (ValueError, KeyError, TypeError):
            log.warning("a malformed takeover on %s was ignored", subject)
            return
        taken_over(c, device_id, epoch, node)

    return c.bus.subscribe(TAKEOVER_SUBJECTS, on_takeover)


def taken_over(c: ClusterNode, device_id: uuid.UUID, epoch: int, node: str) -> bool:
    """Another node claimed ``epoch``: close our link of the device if it is older. Returns whether
    a link was closed."""
    if node == c.node_id or c.link_epochs.get(device_id, 0) >= epoch:
        return False  # ours, or a claim older than our own newer link
    link = c.s.links.get(device_id)
    if link is None:
        return False
    c.s.metrics.cluster_takeovers += 1
    link.close(Close.SUPERSEDED, "another connection with this device's token took over (on another hub node)")
    return True


async def claim(c: ClusterNode, device_id: uuid.UUID) -> None:
    """Before a device's link is registered here (the link handler, through Topology.link_up)."""
    epoch = await c.s.stores.devices.claim_link(device_id, c.node_id)
    c.link_epochs[device_id] = epoch
    c.bus.publish(f"cluster.takeover.{device_id}", {"node": c.node_id, "epoch": epoch})
