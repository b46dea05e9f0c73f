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

A silent row is not enough on its own, though: a node cut off from PostgreSQL alone (its NATS link and
its device links up) cannot renew its row, yet its devices are linked and answer commands, which reach
them over NATS. So every node also says it is alive on the bus (``ALIVE_SUBJECT``, every third of the
lease, from a task of its own: a renewal blocked by a frozen database for up to the storage call bound
must not silence it), and every node notes when it last heard each other one (``Heard``). A node is
dead only when it was silent on both for a lease: the reaper spares the rows of the nodes heard on the
bus within the last lease. That window is also the rule for a reaper cut off from NATS itself: what it
heard before its cut-off ages out within a lease, so a stale view never keeps a killed node alive for
longer than that; a node silent on PostgreSQL and unheard on the bus (killed, frozen, or cut off from
both) is reaped as before.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

import trio

from storage.db import DatabaseUnavailable

if TYPE_CHECKING:
    from hub.cluster.topology import ClusterNode

log = logging.getLogger("fleethub.cluster")

ALIVE_SUBJECT = "cluster.nodes.alive"


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


class Heard:
    """The other nodes this node heard say they are alive on the bus, and when (trio's monotonic
    clock: a node's own, never compared with another's). Pure: ``heard`` is told each heartbeat,
    ``alive`` says which nodes were heard within the last lease; those are not to be reaped."""

    def __init__(self, node: str, lease: float) -> None:
        self.node, self.lease = node, lease
        self.last: dict[str, float] = {}

    def heard(self, node: str, at: float) -> None:
        if node != self.node:  # our own heartbeat, echoed by the server, says nothing of the others
            self.last[node] = at

    def alive(self, now: float) -> frozenset[str]:
        # Older evidence is forgotten: a node started under a generated id leaves no entry behind for good.
        self.last = {node: at for node, at in self.last.items() if now - at <= self.lease}
        return frozenset(self.last)


async def keep(c: ClusterNode, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    s = c.s
    lease = s.settings.node_lease_seconds
    contact = Contact(lease)
    heard = Heard(s.node_id, lease)

    async def on_alive(_subject: str, payload: dict[str, Any]) -> None:
        if isinstance(payload.get("node"), str):
            heard.heard(payload["node"], trio.current_time())

    c.subscriptions.append(c.bus.subscribe(ALIVE_SUBJECT, on_alive))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_say_alive, c, lease)
        task_status.started()
        while True:
            try:
                silent_since = contact.renewed(await s.stores.cluster_nodes.renew(s.node_id))
                marked = {} if silent_since is None else await s.stores.cluster_nodes.reap(
                    s.node_id, silent_since, heard.alive(trio.current_time()))
            except DatabaseUnavailable:
                log.info("cluster nodes: the database is unreachable; trying again next round")
            else:
                for node, devices in marked.items():
                    s.stores.devices.cache.clear()  # rows read before it say online
                    s.metrics.cluster_dead_nodes += 1
                    log.warning("cluster node %s silent on the database and the bus for more than %.0f s: %d "
                                "devices whose link it held are offline now", node, lease, devices)
            await trio.sleep(lease / 3)


async def _say_alive(c: ClusterNode, lease: float) -> None:
    while True:
        c.bus.publish(ALIVE_SUBJECT, {"node": c.node_id})  # dropped (and counted) while NATS is away
        await trio.sleep(lease / 3)
