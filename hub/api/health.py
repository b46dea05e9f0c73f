"""Process health, readiness (the database answers) and Prometheus metrics."""

from __future__ import annotations

from quart import Blueprint, Response

from pydantic import BaseModel

from hub.api.common import services
from hub.api.validation import enveloped, responds
from hub.auth.routes import public
from hub.errors import Unavailable
from hub.metrics import CONTENT_TYPE
from storage.db import DatabaseUnavailable

bp = Blueprint("health", __name__)

# Seconds /readyz gives the database: a balancer's health check expects its answer within a second.
READY_TIMEOUT = 0.8


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: str
    # a cluster node only (docs/cluster.md): node id, NATS state, device links and rollout leases held
    cluster: dict | None = None


@bp.get("/healthz")
@public
@responds(enveloped(Health))
async def healthz():
    return {"data": {"status": "ok"}}


@bp.get("/readyz")
@public
@responds(enveloped(Readiness))
async def readyz():
    if services().draining:
        raise Unavailable("this hub is shutting down", code="draining")
    s = services()
    try:
        # Bounded by the storage call itself rather than a cancel from here: a cancelled crossing waits
        # for asyncpg's cancel request, which a frozen server never answers (12 s in issue 38).
        await s.db.run(_select_one, timeout=READY_TIMEOUT)
    except DatabaseUnavailable:
        raise Unavailable(f"the database did not answer within {READY_TIMEOUT} s", code="not_ready") from None
    return {"data": {"status": "ready", "database": "ok", **s.topology.readiness()}}


async def _select_one(conn) -> object:
    return await conn.fetchval("SELECT 1")


@bp.get("/metrics")
@public
async def metrics():
    s = services()
    return Response(s.metrics.render(s), content_type=CONTENT_TYPE)
