"""Which nodes of the cluster are alive, and what happens to the devices of one that is not.

Every node renews its row in ``cluster_nodes`` every third of ``node_lease_seconds`` (storage/nodes.py)
and, in the same transaction, takes the rows of nodes silent for longer than that lease: the devices
whose last link such a node accepted are marked offline then. A killed node's devices are therefore
offline (or online again on another node, whose link epoch fences the old one's writes) within one
lease plus one renewal interval, whatever the dead node's id and whether or not it ever comes back.
Like the rollout leases, it compares the nodes' clocks: keep them in sync (NTP).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import trio

from storage.db import DatabaseUnavailable

log = logging.getLogger("fleethub.cluster")


async def keep(s: Any, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    lease = s.settings.node_lease_seconds
    task_status.started()
    while True:
        try:
            marked = await s.cluster_nodes.beat(s.node_id, s.clock.now(), dt.timedelta(seconds=lease))
        except DatabaseUnavailable:
            log.info("cluster nodes: the database is unreachable; trying again next round")
        else:
            for node, devices in marked.items():
                s.devices.cache.clear()  # rows read before it say online
                s.metrics.cluster_dead_nodes += 1
                log.warning("cluster node %s silent for more than %.0f s: %d devices whose link it held are "
                            "offline now", node, lease, devices)
        await trio.sleep(lease / 3)
