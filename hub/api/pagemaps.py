"""A memory test's full per-page error map: uploaded by the device over HTTP, read by operators.

A result lists the pages with the most errors and sums up the rest (device_client/memtest/bounds.py);
when there are more, the device uploads the whole map here instead of in a frame of the link
(device_client/shared/pagemap.py has the format):

- ``PUT /v1/device/memory-tests/{runId}/page-map``: the device's own token (``Authorization: Bearer
  dev_…``), a gzip body of at most 1 MiB that must inflate to at most 16 MiB of a valid map; stored
  once per (device, runId), a repeated upload replaces it. 201 with what was stored. A map belongs to
  a run of that device whose result the hub stored (404 ``run_not_found`` otherwise: the agent uploads
  after the result's ack); a device keeps its ``KEEP_PER_DEVICE`` newest maps, and uploads at most
  ``UPLOADS_PER_MINUTE`` a minute (429 with Retry-After). So one device token holds at most 8 MiB of
  maps, however it is used.
- ``GET /v1/devices/{id}/memory-test/results/{runId}/page-map``: viewer access; the map, or 404.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint, request
from quart_schema import document_response

from device_client.shared import pagemap
from hub.api.common import errors, jsonable, org, services
from hub.api.memtests import MemtestErrorBody, _device
from hub.auth.routes import public
from hub.auth.pat import digest
from hub.errors import BadRequest, NotFound, PayloadTooLarge, RateLimited, Unauthenticated

bp = Blueprint("pagemaps", __name__)

RUN_ID_MAX = 200
# A device keeps as many maps as it keeps results in its own history (device_client/memtest/store.py).
KEEP_PER_DEVICE = 8
UPLOADS_PER_MINUTE = 6


class PageMapStored(BaseModel):
    runId: str
    pagesWithErrors: int
    complete: bool
    bytes: int = Field(description="the stored (gzip) size")


class PageMapStoredEnvelope(BaseModel):
    data: PageMapStored


class PageMap(BaseModel):
    runId: str
    pageSize: int
    addressKind: str = Field(description="physical or virtual")
    pagesWithErrors: int
    errorCount: int
    complete: bool = Field(description="false: the runs with the fewest errors were left out to fit 1 MiB")
    encoding: str = Field(description="runs")
    runs: list[list[int]] = Field(description="[firstAddress, pageCount, errorsPerPage], in address order")
    uploadedAt: str


class PageMapEnvelope(BaseModel):
    data: PageMap


def _run_id(value: str) -> str:
    if not 1 <= len(value) <= RUN_ID_MAX or "\x00" in value:
        raise BadRequest(f"runId: 1 to {RUN_ID_MAX} characters", code="invalid")
    return value


async def _device_from_token() -> dict[str, Any]:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    row = await services().stores.devices.find_by_token(digest(token)) if scheme.lower() == "bearer" and token else None
    if row is None:
        raise Unauthenticated("a valid device token is required")
    return row


async def _throttle(device_id) -> None:
    """Count one upload of this device, on every node of a cluster (hub/cluster/limits.py)."""
    s = services()
    key = ("page-map", str(device_id))
    decision = await s.topology.limits.hit_burst(s.access.upload_limiter, key, UPLOADS_PER_MINUTE, s.clock.now())
    if not decision.allowed:
        raise RateLimited(f"at most {UPLOADS_PER_MINUTE} page-map uploads a minute per device",
                          code="rate_limited", retry_after=decision.retry_after)


@bp.put("/v1/device/memory-tests/<run_id>/page-map")
@public
@document_response(PageMapStoredEnvelope, 201)
@errors(400, 401, 404, 413, 429)
async def upload_page_map(run_id: str):
    """The device uploads a run's full page map (its own token; gzip JSON, at most 1 MiB)."""
    s = services()
    device = await _device_from_token()
    run_id = _run_id(run_id)
    await _throttle(device["id"])
    body = await request.get_data(as_text=False)
    if len(body) > pagemap.MAX_UPLOAD_BYTES:
        raise PayloadTooLarge(f"a page map is at most {pagemap.MAX_UPLOAD_BYTES} bytes", code="too_large")
    try:
        doc = pagemap.parse(body, run_id)
    except pagemap.Invalid as exc:
        raise BadRequest(f"page map: {exc}", code="invalid") from None
    if not await s.stores.memtests.save_page_map(device["org_id"], device["id"], run_id, pages=doc["pagesWithErrors"],
                                          complete=doc["complete"], body=body, at=s.clock.now(),
                                          keep=KEEP_PER_DEVICE):
        raise NotFound("this device has no stored result of that run", code="run_not_found")
    return {"data": {"runId": run_id, "pagesWithErrors": doc["pagesWithErrors"], "complete": doc["complete"],
                     "bytes": len(body)}}, 201


@bp.get("/v1/devices/<device_id>/memory-test/results/<run_id>/page-map")
@document_response(PageMapEnvelope)
@document_response(MemtestErrorBody, 404)
async def read_page_map(device_id: str, run_id: str):
    """A run's full per-page error map, as the device uploaded it (404 when it did not)."""
    s = services()
    row = await _device(device_id, "viewer")
    stored = await s.stores.memtests.page_map(org().org_id, row["id"], _run_id(run_id))
    if stored is None:
        raise NotFound("no page map was uploaded for this run")
    doc = pagemap.parse(bytes(stored["body"]), run_id)  # checked when stored: bounded
    return {"data": jsonable({**doc, "uploadedAt": stored["at"]})}
