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
from typing import Any

from device_client.shared.linkcodes import Close

log = logging.getLogger("fleethub.cluster")

TAKEOVER_SUBJECTS = "cluster.takeover.*"


def install(s: Any) -> None:
    """Listen for other nodes' takeovers (once per process, at start)."""
    async def on_takeover(subject: str, payload: dict[str, Any]) -> None:
        try:
            device_id = uuid.UUID(subject.rsplit(".", 1)[1])
            epoch, node = int(payload["epoch"]), str(payload["node"])
        except (ValueError, KeyError, TypeError):
            log.warning("a malformed takeover on %s was ignored", subject)
            return
        taken_over(s, device_id, epoch, node)

    s.extras["cluster_takeovers"] = s.bus.subscribe(TAKEOVER_SUBJECTS, on_takeover)


def taken_over(s: Any, device_id: uuid.UUID, epoch: int, node: str) -> bool:
    """Another node claimed ``epoch``: close our link of the device if it is older. Returns whether
    a link was closed."""
    if node == s.node_id or s.link_epochs.get(device_id, 0) >= epoch:
        return False  # ours, or a claim older than our own newer link
    link = s.links.get(device_id)
    if link is None:
        return False
    s.metrics.cluster_takeovers += 1
    link.close(Close.SUPERSEDED, "another connection with this device's token took over (on another hub node)")
    return True


async def link_up(s: Any, device_id: uuid.UUID) -> None:
    """The link handler's hook before a device's link is registered (no-op outside a cluster)."""
    if not getattr(s, "clustered", False):
        return
    epoch = await s.devices.claim_link(device_id, s.node_id)
    s.link_epochs[device_id] = epoch
    s.bus.publish(f"cluster.takeover.{device_id}", {"node": s.node_id, "epoch": epoch})
