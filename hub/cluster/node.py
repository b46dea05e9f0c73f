"""Which mode this process runs in, and the node's bus.

Without ``FLEETHUB_NATS_URL`` the hub is one process with the in-process bus (actors/bus.py), exactly
as before. With it the process is one node of a cluster: commands, takeovers and events travel over
NATS (actors/natsbus.py), and the database must be the one every node shares (FLEETHUB_DATABASE_URL):
an embedded PostgreSQL per node would be a cluster of strangers.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from hub.settings import Settings


class ClusterConfigError(ValueError):
    """The settings ask for a cluster that cannot work."""


def node_id(settings: Settings) -> str:
    """The configured node id, or a generated one (unique per start: a restarted node is a new holder)."""
    return settings.node_id or f"node-{uuid.uuid4().hex[:8]}"


def check(settings: Settings) -> None:
    if settings.nats_url and not settings.database_url:
        raise ClusterConfigError("FLEETHUB_NATS_URL needs FLEETHUB_DATABASE_URL: the nodes of a cluster "
                                 "share one PostgreSQL")


@contextlib.asynccontextmanager
async def open_cluster_bus(settings: Settings, name: str) -> AsyncIterator[object | None]:
    """The NATS bus when clustered, else None (the caller keeps its in-process bus)."""
    check(settings)
    if not settings.nats_url:
        yield None
        return
    from actors.natsbus import open_nats_bus
    async with open_nats_bus(settings.nats_url, name) as bus:
        yield bus
