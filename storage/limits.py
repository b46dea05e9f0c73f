"""Cluster-wide limit counters (migration 0019): API request counts per rate-limit window, credential
attempts, and open event streams. Used only by the nodes of a cluster (hub/cluster/limits.py); one hub
process counts in memory."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

import asyncpg

from storage.db import Database


@dataclass(frozen=True)
class Attempts:
    """What ``reserve_attempts`` decided: ``wait`` > 0 is a refusal (nothing was recorded)."""
    wait: float
    used: dict[str, int]        # attempts per key inside the window, this one included when recorded
    oldest: dict[str, dt.datetime]  # the oldest attempt per key inside the window


class ClusterLimits:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- API request counts ------------------------------------------------------------------
    async def sync_counts(self, node: str, window_start: int, mine: dict[str, int]) -> dict[str, int]:
        """Write this node's counts for ``window_start`` (each a SET: a retry cannot count twice) and
        return every key's count on the other nodes in that window. Rows of earlier windows go."""
        async def body(conn: asyncpg.Connection) -> dict[str, int]:
            if mine:
                keys, used = list(mine), list(mine.values())
                await conn.execute(
                    "INSERT INTO cluster_rate_counts (key, window_start, node, used) "
                    "SELECT k, $2, $3, u FROM unnest($1::text[], $4::int[]) AS t(k, u) "
                    "ON CONFLICT (window_start, key, node) DO UPDATE SET used = EXCLUDED.used",
                    keys, window_start, node, used)
            await conn.execute("DELETE FROM cluster_rate_counts WHERE window_start < $1", window_start)
            rows = await conn.fetch(
                "SELECT key, sum(used)::bigint AS used FROM cluster_rate_counts "
                "WHERE window_start = $1 AND node <> $2 GROUP BY key", window_start, node)
            return {r["key"]: int(r["used"]) for r in rows}

        return await self.db.run(body)

    # -- credential attempts ------------------------------------------------------------------
    async def reserve_attempts(self, limits: dict[str, int], window: dt.timedelta, now: dt.datetime,
                               node: str) -> Attempts:
        """Record one attempt under every key of ``limits`` ({key: most attempts in ``window``}) unless
        one key is at its limit; then nothing is recorded and ``wait`` says for how long. Keys are
        locked in a fixed order for the transaction, so concurrent reservations on any node are counted
        one after the other and never deadlock."""
        keys = sorted(limits)

        async def reserve(conn: asyncpg.Connection) -> Attempts:
            for key in keys:
                await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 17))", key)
            await conn.execute("DELETE FROM cluster_attempts WHERE key = ANY($1::text[]) AND at <= $2",
                               keys, now - window)
            rows = await conn.fetch(
                "SELECT key, array_agg(at ORDER BY at) AS ats FROM cluster_attempts "
                "WHERE key = ANY($1::text[]) GROUP BY key", keys)
            held = {r["key"]: list(r["ats"]) for r in rows}
            wait = 0.0
            for key in keys:
                ats = held.get(key, [])
                if len(ats) >= limits[key]:
                    # the attempt that must leave the window before one more fits
                    frees_at = ats[len(ats) - limits[key]] + window
                    wait = max(wait, (frees_at - now).total_seconds(), 0.001)
            if wait <= 0:
                await conn.execute(
                    "INSERT INTO cluster_attempts (key, at, node) SELECT k, $2, $3 FROM unnest($1::text[]) AS k",
                    keys, now, node)
                for key in keys:
                    held.setdefault(key, []).append(now)
            return Attempts(wait, {k: len(held.get(k, [])) for k in keys},
                            {k: held[k][0] for k in keys if held.get(k)})

        return await self.db.run(reserve, transaction=True)

    async def forget_attempts(self, key: str) -> None:
        await self.db.execute("DELETE FROM cluster_attempts WHERE key = $1", key)

    async def give_back_attempt(self, key: str, at: dt.datetime, node: str) -> None:
        """Remove one attempt recorded at ``at`` (a sign-in that turned out right)."""
        await self.db.execute(
            "DELETE FROM cluster_attempts WHERE ctid = (SELECT ctid FROM cluster_attempts "
            "WHERE key = $1 AND at = $2 AND node = $3 LIMIT 1)", key, at, node)

    async def prune_attempts(self, before: dt.datetime) -> int:
        status = await self.db.execute("DELETE FROM cluster_attempts WHERE at <= $1", before)
        return int(status.split()[-1])

    # -- open event streams -----------------------------------------------------------------------
    async def open_stream(self, owner: str, stream: uuid.UUID, node: str, cap: int, now: dt.datetime) -> int | None:
        """Record an open stream of ``owner`` if fewer than ``cap`` are open on all nodes; returns how many
        are open with it, or None when the cap is reached (nothing recorded)."""
        async def body(conn: asyncpg.Connection) -> int | None:
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 19))", owner)
            held = await conn.fetchval("SELECT count(*) FROM cluster_streams WHERE owner = $1", owner)
            if held >= cap:
                return None
            await conn.execute("INSERT INTO cluster_streams (stream, owner, node, opened_at) VALUES ($1, $2, $3, $4)",
                               stream, owner, node, now)
            return int(held) + 1

        return await self.db.run(body, transaction=True)

    async def close_streams(self, streams: list[uuid.UUID]) -> None:
        await self.db.execute("DELETE FROM cluster_streams WHERE stream = ANY($1::uuid[])", streams)

    async def drop_node_streams(self, node: str) -> int:
        """A node starting under its id again: streams it recorded before are gone with its old process."""
        status = await self.db.execute("DELETE FROM cluster_streams WHERE node = $1", node)
        return int(status.split()[-1])
