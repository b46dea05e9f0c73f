"""Cluster nodes' liveness (migration 0018): a row per node, renewed by the node; an expired one is a
dead node, whose devices are marked offline by whichever node finds it first, unless the finder heard
it on the bus lately (hub/cluster/nodes.py: a node cut off from PostgreSQL alone is not dead). Every time here is the
database's clock (``now()``), never a node's: nodes whose clocks disagree still agree on who is silent."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

import asyncpg

from storage.db import Database


class ClusterNodes:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def renew(self, node: str) -> dt.datetime:
        """Renew ``node``'s row; returns the database's time it was renewed at."""
        return await self.db.fetchval(
            "INSERT INTO cluster_nodes (node, seen_at) VALUES ($1, now()) "
            "ON CONFLICT (node) DO UPDATE SET seen_at = EXCLUDED.seen_at RETURNING seen_at", node)

    async def reap(self, node: str, silent_since: dt.datetime, spared: Collection[str]) -> dict[str, int]:
        """Take every other node's row not renewed since ``silent_since`` (a database time), but those of
        the ``spared`` nodes (alive by other evidence than their row, however old it is): each taken
        node's devices (those whose last link it accepted, ``devices.link_node``) go offline in the same
        transaction, so a node dying between the two cannot leave them online. Returns {dead node:
        devices marked offline}; a dead node is found by one node only (its row is deleted)."""
        async def body(conn: asyncpg.Connection) -> dict[str, int]:
            dead = [r["node"] for r in await conn.fetch(
                "DELETE FROM cluster_nodes WHERE seen_at < $1 AND node <> $2 AND node <> ALL($3::text[]) "
                "RETURNING node", silent_since, node, list(spared))]
            marked = {}
            for gone in dead:
                status = await conn.execute(
                    "UPDATE devices SET online = false, state = 'offline' "
                    "WHERE link_node = $1 AND (online OR state <> 'offline')", gone)
                marked[gone] = int(status.split()[-1])
                # its open streams ended with it: they no longer count against the cluster-wide cap
                await conn.execute("DELETE FROM cluster_streams WHERE node = $1", gone)
            return marked

        return await self.db.run(body, transaction=True)
