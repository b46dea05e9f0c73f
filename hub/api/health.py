"""Process health, readiness (the database answers) and Prometheus metrics."""

from __future__ import annotations

import trio
from quart import Blueprint, Response

from pydantic import BaseModel

from hub.api.common import services
from hub.api.validation import enveloped, responds
from hub.auth.middleware import public
from hub.cluster.node import cluster_state
from hub.errors import Unavailable
from hub.metrics import CONTENT_TYPE

bp = Blueprint("health", __name__)


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
    with trio.move_on_after(2):
        await services().db.fetchval("SELECT 1")
        data = {"status": "ready", "database": "ok"}
        s = services()
        if s.clustered:
            data["cluster"] = cluster_state(s)
        return {"data": data}
    raise Unavailable("the database did not answer within 2 s", code="not_ready")


@bp.get("/metrics")
@public
async def metrics():
    s = services()
    return Response(s.metrics.render(s), content_type=CONTENT_TYPE)
