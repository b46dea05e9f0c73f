"""Rollout leases (migration 0016): which cluster node runs a rollout, fenced by an epoch.

``acquire`` takes a lease that is free, expired, or already this node's (a restarted node with the
same id), and always moves the epoch on; ``renew`` extends only the exact (owner, epoch) held.
Every time here is the database's clock (``clock_timestamp()``), never a node's: a node whose clock runs
ahead by more than the lease would otherwise find every other node's lease expired and take it, and one
behind would hold a lease the others see lapsed (the same rule as storage/nodes.py).
``check`` runs inside a rollout write's transaction and locks the lease row FOR SHARE, so a takeover
(an UPDATE of that row) waits for a write in flight and every write after it sees the new epoch.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg

from storage.db import Database


class LeaseLost(Exception):
    """This node's lease epoch is no longer the rollout's: another node took it over."""


@dataclass(frozen=True)
class Fence:
    rollout_id: uuid.UUID
    owner: str
    epoch: int


async def check(conn: asyncpg.Connection, fence: Fence | None) -> None:
    if fence is None:
        return  # one process, no leases
    held = await conn.fetchval(
        "SELECT 1 FROM rollout_leases WHERE rollout_id = $1 AND owner = $2 AND epoch = $3 FOR SHARE",
        fence.rollout_id, fence.owner, fence.epoch)
    if held is None:
        raise LeaseLost(f"rollout {fence.rollout_id}: lease epoch {fence.epoch} of {fence.owner} is gone")


class RolloutLeases:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def acquire(self, rollout_id: uuid.UUID, owner: str, ttl: float) -> Fence | None:
        epoch = await self.db.fetchval(
            """INSERT INTO rollout_leases AS l (rollout_id, owner, epoch, expires_at)
               VALUES ($1, $2, 1, clock_timestamp() + make_interval(secs => $3))
               ON CONFLICT (rollout_id) DO UPDATE SET owner = $2, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
               WHERE l.expires_at < clock_timestamp() OR l.owner = $2
               RETURNING epoch""", rollout_id, owner, ttl)
        return Fence(rollout_id, owner, int(epoch)) if epoch is not None else None

    @staticmethod
    async def born(conn: asyncpg.Connection, rollout_id: uuid.UUID, owner: str, ttl: float) -> Fence:
        """The first lease of a rollout, inserted in the transaction that creates it: a rollout is never
        active and unowned, so no other node's lease round can take it between its creation and its
        creator's first take."""
        await conn.execute("INSERT INTO rollout_leases (rollout_id, owner, epoch, expires_at) "
                           "VALUES ($1, $2, 1, clock_timestamp() + make_interval(secs => $3))", rollout_id, owner, ttl)
        return Fence(rollout_id, owner, 1)

    async def renew(self, fence: Fence, ttl: float) -> bool:
        status = await self.db.execute(
            "UPDATE rollout_leases SET expires_at = clock_timestamp() + make_interval(secs => $4) "
            "WHERE rollout_id = $1 AND owner = $2 AND epoch = $3", fence.rollout_id, fence.owner, fence.epoch, ttl)
        return status.endswith(" 1")

    async def release(self, fence: Fence) -> None:
        """A settled rollout's lease goes (a stopping node's too: another takes it at once)."""
        await self.db.execute("DELETE FROM rollout_leases WHERE rollout_id = $1 AND owner = $2 AND epoch = $3",
                              fence.rollout_id, fence.owner, fence.epoch)

    async def owner(self, rollout_id: uuid.UUID) -> str | None:
        return await self.db.fetchval(
            "SELECT owner FROM rollout_leases WHERE rollout_id = $1 AND expires_at >= clock_timestamp()", rollout_id)
