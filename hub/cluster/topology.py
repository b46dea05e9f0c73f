"""hub/topology.py's Topology for one node of a cluster: the state only a cluster has (link epochs,
rollout leases, cross-node tells, shared limits, the bus subscriptions) and the work only it does,
each in the module named after it (presence.py, leases.py, tells.py, asks.py, limits.py, nodes.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from actors.bus import Subscription
from hub.cluster import asks, leases, limits, nodes, presence, tells
from hub.cluster.limits import LimitedClusterEventHub, SharedLimits
from storage.leases import Fence
from storage.limits import ClusterLimits

if TYPE_CHECKING:
    from actors.natsbus import NatsBus
    from hub.services import Services


class ClusterNode:
    def __init__(self, s: Services, bus: NatsBus) -> None:
        self.s = s
        self.node_id = s.node_id
        self.bus = bus
        s.bus = bus  # commands reach devices held by other nodes
        self.lease_seconds = s.settings.rollout_lease_seconds
        self.registry, self.rollouts, self.rollout_leases = s.registry, s.stores.rollouts, s.stores.rollout_leases
        # device -> the link epoch this node last claimed for it (presence.py)
        self.link_epochs: dict[uuid.UUID, int] = {}
        # rollout -> the lease this node holds on it, and when (trio time) it lapses unless renewed (leases.py)
        self.fences: dict[uuid.UUID, Fence] = {}
        self.lease_expiries: dict[uuid.UUID, float] = {}
        # One take at a time on this node: a rollout's creation and keep()'s round may find it together.
        self.lease_lock = trio.Lock()
        self.limits = SharedLimits(ClusterLimits(s.db), self.node_id, s.access.login_throttle)
        # SSE streams hear every node's events; their cap counts every node's streams
        s.events = LimitedClusterEventHub(bus, self.node_id, self.limits, s.clock)
        s.journal.hub = s.events
        self.tells = tells.Tells(s)
        self.subscriptions: list[Subscription] = [
            presence.subscribe(self),  # other nodes' takeovers close our older links
            tells.subscribe(self),  # ApplyConfig & co. reach the node holding the device
            asks.subscribe(self),  # a reboot asked of any node reaches the holder's actor
            asks.subscribe_rollouts(self),  # so do pause/resume/cancel, to the lease holder
        ]

    # -- the actors' Placement -------------------------------------------------------------------
    def tell_elsewhere(self, device_id: uuid.UUID, msg: object) -> None:
        self.tells.send(device_id, msg)  # at least once, in the background (tells.py)

    def link_epoch(self, device_id: uuid.UUID) -> int | None:
        return self.link_epochs.get(device_id)

    def rollout_fence(self, rollout_id: uuid.UUID) -> Fence | None:
        return self.fences.get(rollout_id)

    # -- the hub's Topology ----------------------------------------------------------------------
    def actor_is_live(self, device_id: uuid.UUID) -> bool:
        return device_id in self.s.links

    def presence_from_row(self, row: dict) -> dict | None:
        return {"online": row["online"], "facts": row.get("facts") or {}}  # the holding node wrote it

    async def link_up(self, device_id: uuid.UUID) -> None:
        await presence.claim(self, device_id)

    async def holder(self, device_id: uuid.UUID) -> str | None:
        if device_id in self.s.links:
            return None
        node = await self.s.stores.devices.link_node(device_id)
        return node if node and node != self.node_id else None

    async def create_rollout(self, row: dict, steps: list) -> dict:
        return await leases.create_held(self, row, steps)

    async def hold_rollout(self, rollout_id: uuid.UUID) -> None:
        await leases.hold(self, rollout_id)

    async def start(self, nursery: trio.Nursery, *, serving: bool) -> None:
        if not serving:
            return
        s = self.s
        # a node restarted under its id (killed before): what it held is offline now; the other nodes
        # hold theirs, and link epochs settle who is online
        await s.stores.devices.mark_node_offline(self.node_id)
        await nursery.start(leases.keep, self)  # each node runs the rollouts whose lease it holds
        await nursery.start(nodes.keep, self)  # a dead node's devices go offline
        await nursery.start(limits.keep, self)  # rate limits and stream caps, cluster-wide

    def readiness(self) -> dict[str, Any]:
        return {"cluster": {"node": self.node_id, "nats": "connected" if self.bus.connected else "disconnected",
                            "devices": len(self.s.links), "rollout_leases": len(self.fences)}}

    def metric_families(self) -> Iterable[Any]:
        from hub.metrics import family
        G, C = GaugeMetricFamily, CounterMetricFamily
        bus, m = self.bus, self.s.metrics
        yield family(G, "fleethub_cluster_node", "This cluster node (its id in the label).", labels=["node"],
                     samples=[([self.node_id], 1)])
        yield family(G, "fleethub_cluster_nats_connected", "1 while the node's NATS connection is up.",
                     int(bus.connected))
        yield family(C, "fleethub_cluster_nats_stale",
                     "NATS connections the bus's probe found dead (no PONG in time) and replaced.", bus.stale)
        yield family(C, "fleethub_cluster_nats_stalls",
                     "NATS round trips slower than 1 s: requests failed fast (bus_unavailable) meanwhile.",
                     bus.stalls)
        yield family(C, "fleethub_cluster_nats_local_requests",
                     "Commands answered in this process, not over NATS (the device's link is here).", bus.local)
        yield family(C, "fleethub_cluster_nats_publish_dropped",
                     "Broadcasts (events, takeovers) not sent: NATS down, the outbox full, or refused.",
                     bus.publish_dropped + bus.publish_failed)
        yield family(G, "fleethub_cluster_rollout_leases", "Rollout leases this node holds.", len(self.fences))
        yield family(C, "fleethub_cluster_takeovers",
                     "Device links closed because another node took the device.", m.cluster_takeovers)
        yield family(C, "fleethub_cluster_dead_nodes",
                     "Silent nodes this node found (their devices marked offline).", m.cluster_dead_nodes)
        yield family(C, "fleethub_cluster_limit_sync_failures",
                     "Rounds of the cluster-wide rate-limit sync that could not reach the database.",
                     self.limits.sync_failures)
