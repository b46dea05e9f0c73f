"""Rollout ownership across the cluster: the node holding a rollout's lease runs its RolloutActor.

``hold`` is called before a RolloutActor starts on a cluster node (hub/services.py): it takes the lease
(free, expired, or this node's own) or raises ``HeldElsewhere``. ``keep`` runs for the node's life:
every third of the lease time it renews the leases it holds (dropping one that another node took, or
whose rollout settled), and starts the actors of active rollouts whose lease expired, so a killed
node's rollouts go on elsewhere within one lease time plus a renewal interval. The fencing itself is
in storage (storage/leases.py): every rollout write checks the epoch in its own transaction.

A node cut off from NATS but not from PostgreSQL could go on renewing its leases while it cannot
reach the devices other nodes hold, and its rollouts would stall there. So a node whose bus is
disconnected renews nothing and takes nothing: its leases lapse, other nodes take them over (a new
epoch fences off its writes), and once a lease's own expiry has passed here its actor stops too, so
the node no longer acts as owner even before anyone else has taken over.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import trio

from actors.errors import Conflict
from storage.db import DatabaseUnavailable

if TYPE_CHECKING:
    from hub.cluster.topology import ClusterNode

log = logging.getLogger("fleethub.cluster")


class HeldElsewhere(Conflict):
    """Another node runs this rollout."""
    code = "rollout_elsewhere"


async def hold(c: ClusterNode, rollout_id: uuid.UUID) -> None:
    actor = c.registry.lookup(("rollout", rollout_id))
    if actor is not None and actor.lost:
        raise HeldElsewhere(f"another hub node runs rollout {rollout_id}")  # ours ends; theirs goes on
    if rollout_id in c.fences:
        return  # ours, renewed by keep()
    # One take at a time on this node. A rollout just created is asked for by its POST and can be
    # found by keep()'s round in the same moment; both took the lease, the second bumping the epoch
    # over the first (its own lease), and whichever fence was kept last could be the stale one.
    async with c.lease_lock:
        if rollout_id in c.fences:
            return  # the other caller took it
        await _take(c, rollout_id)


async def create_held(c: ClusterNode, row: dict, steps: list) -> dict:
    """Store a new rollout with this node's lease on it, in one transaction. Were the lease taken after
    the rollout's commit, another node's lease round could find it active and unowned in between and
    run it: the node that answered the POST would not own what it created, and each node's view of
    who runs it would depend on timing. Under the holding lock, so this node's own round cannot take
    it a second time (a new epoch) before its fence is kept here."""
    async with c.lease_lock:
        if not c.bus.connected:
            return await c.rollouts.create(row, steps)  # cut off: another node's round takes it (see _take)
        ttl, asked = c.lease_seconds, trio.current_time()
        created = await c.rollouts.create(row, steps, lease=(c.node_id, ttl))
        c.fences[created["id"]] = created.pop("fence")
        c.lease_expiries[created["id"]] = asked + ttl
        return created


async def _take(c: ClusterNode, rollout_id: uuid.UUID) -> None:
    if not c.bus.connected:
        raise HeldElsewhere(f"this node is cut off from NATS; another hub node is to run rollout {rollout_id}")
    ttl, asked = c.lease_seconds, trio.current_time()  # the lease runs from before the ask
    fence = await c.rollout_leases.acquire(rollout_id, c.node_id, ttl)
    if fence is None:
        raise HeldElsewhere(f"another hub node runs rollout {rollout_id}")
    c.fences[rollout_id] = fence
    c.lease_expiries[rollout_id] = asked + ttl


def _drop(c: ClusterNode, rollout_id: uuid.UUID) -> None:
    del c.fences[rollout_id]
    c.lease_expiries.pop(rollout_id, None)


async def keep(c: ClusterNode, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        await trio.sleep(c.lease_seconds / 3)
        try:
            await _round(c)
        except DatabaseUnavailable:
            log.info("rollout leases: the database is unreachable; trying again next round")


async def _round(c: ClusterNode) -> None:
    ttl = c.lease_seconds
    expiries = c.lease_expiries
    cut_off = not c.bus.connected
    for rollout_id, fence in list(c.fences.items()):
        actor = c.registry.lookup(("rollout", rollout_id))
        # An actor still starting (its on_start reads storage) is not in the registry yet: its lease is
        # kept and renewed like any other, not taken for a settled rollout's and released under it.
        if actor.lost if actor is not None else not c.registry.starting(("rollout", rollout_id)):
            # settled (the actor ended) or taken over: let the lease go
            _drop(c, rollout_id)
            await c.rollout_leases.release(fence)
            continue
        if cut_off:
            if trio.current_time() >= expiries.get(rollout_id, 0.0):
                log.warning("rollout %s: this node is cut off from NATS and its lease (epoch %d) lapsed; it "
                            "stops running it and another node takes it over", rollout_id, fence.epoch)
                if actor is not None:
                    actor.lost = True  # one still starting finds its fence gone at its first write
                _drop(c, rollout_id)
            continue
        asked = trio.current_time()  # the renewed lease runs from before the ask
        if await c.rollout_leases.renew(fence, ttl):
            expiries[rollout_id] = asked + ttl
        else:
            log.warning("rollout %s: lease epoch %d was taken over; this node stops running it",
                        rollout_id, fence.epoch)
            if actor is not None:
                actor.lost = True  # one still starting is refused at its first fenced write
            _drop(c, rollout_id)
    if cut_off:
        return  # take no lease while cut off: a node that can reach the devices should run them
    for rollout_id in await c.rollouts.active_ids():
        if rollout_id in c.fences:
            continue
        try:
            await c.s.rollout_actor(rollout_id)  # takes the lease if it is free or expired
            log.info("rollout %s: this node runs it now", rollout_id)
        except HeldElsewhere:
            pass
