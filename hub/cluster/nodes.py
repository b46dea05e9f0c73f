"""Which nodes of the cluster are alive, and what happens to the devices of one that is not.

Every node renews its row in ``cluster_nodes`` every third of ``node_lease_seconds`` (storage/nodes.py)
and then takes the rows of nodes silent for longer than that lease: the devices whose last link such a
node accepted are marked offline then. A killed node's devices are therefore offline (or online again
on another node, whose link epoch fences the old one's writes) within one lease plus one renewal
interval, whatever the dead node's id and whether or not it ever comes back.

Silence is judged on the database's clock (``now()``), so nodes' clocks may disagree. And a node judges
only silence it was there to witness (``Contact``): while PostgreSQL was down or frozen no node could
renew its row, so the first node back would find every other row stale. Their silence was the
outage's, not theirs, and the reaper cannot tell one from the other; what it can tell is that it was
cut off itself (its own renewals stopped). So it counts the others' silence only from the moment its
own contact resumed: a live node has had a whole lease of renewal rounds since then.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import trio

from storage.db import DatabaseUnavailable

log = logging.getLogger("fleethub.cluster")


class Contact:
    """This node's unbroken contact with the database, on the database's clock. Pure: ``renewed`` is
    told each time the node's own row was renewed, and says from what time on another node's row that
    was not renewed is a dead node (None: not long enough in contact to judge)."""

    def __init__(self, lease: float) -> None:
        self.lease = dt.timedelta(seconds=lease)
        # Two renewal rounds without one of ours: we missed a round, so the others may have missed theirs.
        self.broken_after = 2 * self.lease / 3
        self.since: dt.datetime | None = None  # when the current unbroken contact began
        self.last: dt.datetime | None = None  # our last renewal

    def renewed(self, at: dt.datetime) -> dt.datetime | None:
        if self.last is None or at - self.last > self.broken_after:
            self.since = at
        self.last = at
        if at - self.since < self.lease:
            return None
        return at - self.lease


async def keep(s: Any, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    lease = s.settings.node_lease_seconds
    contact = Contact(lease)
    task_status.started()
    while True:
        try:
            silent_since = contact.renewed(await s.cluster_nodes.renew(s.node_id))
            marked = {} if silent_since is None else await s.cluster_nodes.reap(s.node_id, silent_since)
        except DatabaseUnavailable:
            log.info("cluster nodes: the database is unreachable; trying again next round")
        else:
            for node, devices in marked.items():
                s.devices.cache.clear()  # rows read before it say online
                s.metrics.cluster_dead_nodes += 1
                log.warning("cluster node %s silent for more than %.0f s: %d devices whose link it held are "
                            "offline now", node, lease, devices)
        await trio.sleep(lease / 3)
