"""Webhook endpoints of an organisation (organisation admins): register, list, change, delete, the
delivery log, a ping, redelivery (docs/events.md). The signing secret is answered once, at creation.
Delivery itself runs in hub/webhooks/worker.py."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, g

from device_client.shared.clock import rfc3339
from hub.api.common import errors, jsonable, org, parse_uuid, services
from hub.api.validation import DeletedOut, body, enveloped, query, responds
from hub.auth.authz import require_admin
from hub.errors import BadRequest, NotFound
from hub.eventlog import TYPE_PREFIX, envelope
from hub.webhooks import sender, signing
from hub.webhooks.worker import attempt_of, kinds, send

bp = Blueprint("webhooks", __name__, url_prefix="/v1")

MAX_REDELIVER = 100
EventType = str


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(..., min_length=1, max_length=2000)
    event_types: list[EventType] = Field(..., min_length=1, max_length=64,
                                         description="io.fleethub.<kind>, a prefix ending in *, or * for all")
    fleet_ids: list[uuid.UUID] | None = Field(None, max_length=256,
                                              description="only events of these fleets (default: every event)")


class WebhookPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, min_length=1, max_length=2000)
    event_types: list[EventType] | None = Field(None, min_length=1, max_length=64)
    fleet_ids: list[uuid.UUID] | None = Field(None, max_length=256, description="null: every fleet")
    enabled: bool | None = Field(None, description="true re-enables a disabled endpoint from where it stopped")


class WebhookHealth(BaseModel):
    failingAttempts: int = Field(description="failed attempts at the event after the cursor")
    failingSince: str | None
    nextAttemptAt: str | None


class WebhookOut(BaseModel):
    id: str
    url: str
    eventTypes: list[str]
    fleetIds: list[str] | None
    enabled: bool
    disabledReason: str | None
    cursor: int = Field(description="the last event (sequence) this endpoint has handled")
    health: WebhookHealth
    createdAt: str
    updatedAt: str
    secret: str | None = Field(None, description="the Standard Webhooks signing secret: in the creation's "
                                                 "answer only")


class DeliveryOut(BaseModel):
    id: int
    sequence: int | None
    eventId: str
    type: str
    attempt: int
    status: int | None
    ok: bool
    latencyMs: float
    responseExcerpt: str
    error: str | None
    manual: bool = Field(description="a ping or a redelivery asked for, not the endpoint's own delivery")
    at: str


class DeliveriesQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit: int = Field(50, ge=1, le=500)
    before: int | None = Field(None, ge=1, description="the delivery log's id: older entries than it")


class RedeliverIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    from_: int = Field(..., alias="from", ge=1, description="the first event's sequence")
    to: int | None = Field(None, ge=1, description="the last event's sequence (default: from)")


class RedeliverOut(BaseModel):
    sent: int
    delivered: int
    deliveries: list[DeliveryOut]


def _json(row: dict, secret: str | None = None) -> dict:
    out = jsonable({
        "id": row["id"], "url": row["url"], "eventTypes": list(row["event_types"]),
        "fleetIds": None if row["fleet_ids"] is None else [str(f) for f in row["fleet_ids"]],
        "enabled": row["enabled"], "disabledReason": row["disabled_reason"], "cursor": row["cursor"],
        "health": {"failingAttempts": row["attempts"], "failingSince": row["failing_since"],
                   "nextAttemptAt": row["next_attempt_at"]},
        "createdAt": row["created_at"], "updatedAt": row["updated_at"]})
    if secret is not None:
        out["secret"] = secret
    return out


def _delivery_json(a: dict[str, Any]) -> dict:
    return jsonable({"id": a["id"], "sequence": a["org_seq"], "eventId": a["event_id"], "type": a["type"],
                     "attempt": a["attempt"], "status": a["status"], "ok": a["ok"],
                     "latencyMs": round(a["latency_ms"], 3), "responseExcerpt": a["excerpt"], "error": a["error"],
                     "manual": a["manual"], "at": a["at"]})


def _types(event_types: list[str]) -> list[str]:
    for t in event_types:
        pattern = t == "*" or (t.startswith(TYPE_PREFIX) and len(t) > len(TYPE_PREFIX) and "*" not in t[:-1])
        if not pattern or not t.isascii() or not t.isprintable():
            raise BadRequest(f"event types are {TYPE_PREFIX}<kind>, a prefix ending in *, or * (docs/events.md)",
                             code="invalid_type")
    return list(dict.fromkeys(event_types))


async def _url(url: str) -> str:
    s = services()
    try:
        sender.check_url(url)
        await sender.check_address(url, s.settings.webhooks_allow_private)
    except sender.Refused as exc:
        raise BadRequest(str(exc), code="invalid_url") from None
    return url


async def _fleets(fleet_ids: list[uuid.UUID] | None) -> list[uuid.UUID] | None:
    if fleet_ids is None:
        return None
    s = services()
    for fid in fleet_ids:
        if await s.stores.fleets.get(org().org_id, fid) is None:
            raise BadRequest(f"fleet {fid} is not in this organisation", code="unknown_fleet")
    return list(dict.fromkeys(fleet_ids))


async def _endpoint(webhook_id: str) -> dict:
    row = await services().stores.webhooks.get(org().org_id, parse_uuid(webhook_id, "webhook_id"))
    if row is None:
        raise NotFound("no such webhook endpoint in this organisation")
    return row


def _deliverer() -> Any:
    return services().deliverer  # None where delivery does not run (the event log off)


@bp.post("/webhooks")
@body(WebhookIn)
@responds(enveloped(WebhookOut), 201)
@errors(400, 401, 403)
async def create_webhook(data: WebhookIn):
    """Register an endpoint (organisation admins). It receives the events that happen from now on;
    the answer holds its signing secret, shown this once."""
    s = services()
    await require_admin()
    types = _types(data.event_types)
    fleets = await _fleets(data.fleet_ids)
    url = await _url(data.url)  # last: it may ask DNS
    secret = signing.new_secret()
    row = await s.stores.webhooks.create(org().org_id, url, types, fleets, s.stores.secret_box.seal(secret.encode()),
                                  s.clock.now())
    g.audit_details = {"webhookId": str(row["id"]), "eventTypes": types}
    if (deliverer := _deliverer()) is not None:
        deliverer.poke()
    return {"data": _json(row, secret)}, 201


@bp.get("/webhooks")
@responds(enveloped(WebhookOut, many=True))
@errors(400, 401, 403)
async def list_webhooks():
    """The organisation's webhook endpoints with their health (organisation admins)."""
    await require_admin()
    return {"data": [_json(r) for r in await services().stores.webhooks.list(org().org_id)]}


@bp.get("/webhooks/<webhook_id>")
@responds(enveloped(WebhookOut))
@errors(400, 401, 403, 404)
async def get_webhook(webhook_id: str):
    """One webhook endpoint with its health (organisation admins)."""
    await require_admin()
    return {"data": _json(await _endpoint(webhook_id))}


@bp.patch("/webhooks/<webhook_id>")
@body(WebhookPatch)
@responds(enveloped(WebhookOut))
@errors(400, 401, 403, 404)
async def update_webhook(webhook_id: str, data: WebhookPatch):
    """Change an endpoint's URL, types or fleets, or enable or disable it (organisation admins)."""
    s = services()
    await require_admin()
    row = await _endpoint(webhook_id)
    url = await _url(data.url) if data.url is not None else None
    types = _types(data.event_types) if data.event_types is not None else None
    clear = "fleet_ids" in data.model_fields_set and data.fleet_ids is None
    fleets = await _fleets(data.fleet_ids)
    row = await s.stores.webhooks.update(org().org_id, row["id"], s.clock.now(), url=url, event_types=types,
                                  fleet_ids=fleets, clear_fleets=clear, enabled=data.enabled)
    if row is None:
        raise NotFound("no such webhook endpoint in this organisation")
    g.audit_details = {"webhookId": str(row["id"]), "enabled": row["enabled"]}
    if (deliverer := _deliverer()) is not None:
        deliverer.restart(row["id"])  # its new URL, types or state take effect at once
    return {"data": _json(row)}


@bp.delete("/webhooks/<webhook_id>")
@responds(enveloped(DeletedOut))
@errors(400, 401, 403, 404)
async def delete_webhook(webhook_id: str):
    """Remove an endpoint and its delivery log (organisation admins)."""
    s = services()
    await require_admin()
    row = await _endpoint(webhook_id)
    if not await s.stores.webhooks.delete(org().org_id, row["id"]):
        raise NotFound("no such webhook endpoint in this organisation")
    g.audit_details = {"webhookId": str(row["id"])}
    if (deliverer := _deliverer()) is not None:
        deliverer.restart(row["id"])
    return {"data": {"id": str(row["id"]), "deleted": True}}


@bp.get("/webhooks/<webhook_id>/deliveries")
@query(DeliveriesQuery)
@responds(enveloped(DeliveryOut, many=True))
@errors(400, 401, 403, 404)
async def list_deliveries(webhook_id: str, query_args: DeliveriesQuery):
    """The endpoint's delivery log, newest first: each attempt's status, latency and answer excerpt."""
    await require_admin()
    row = await _endpoint(webhook_id)
    rows = await services().stores.webhooks.deliveries(row["id"], limit=query_args.limit, before=query_args.before)
    return {"data": [_delivery_json(r) for r in rows]}


async def _send_logged(row: dict, event: dict) -> dict:
    s = services()
    secret = s.stores.secret_box.open(await s.stores.webhooks.secret(row["id"])).decode()
    outcome = await send(s, row["url"], secret, event)
    attempt = attempt_of(event, outcome, 1, s.clock.now(), manual=True)
    logged = await s.stores.webhooks.log_manual(row["id"], attempt)
    return _delivery_json({"id": logged, "org_seq": attempt.org_seq, "event_id": attempt.event_id, "type": attempt.type,
                           "attempt": 1, "status": attempt.status, "ok": attempt.ok,
                           "latency_ms": attempt.latency_ms, "excerpt": attempt.excerpt, "error": attempt.error,
                           "manual": True, "at": attempt.at})


@bp.post("/webhooks/<webhook_id>/test")
@responds(enveloped(DeliveryOut))
@errors(400, 401, 403, 404)
async def ping_webhook(webhook_id: str):
    """Send a signed ``io.fleethub.webhook.ping`` event now (not in the event log) and answer how the
    receiver took it; logged in the delivery log."""
    s = services()
    await require_admin()
    row = await _endpoint(webhook_id)
    event = {"specversion": "1.0", "id": str(uuid.uuid4()), "source": f"/organizations/{org().org_id}",
             "type": TYPE_PREFIX + "webhook.ping", "subject": f"webhooks/{row['id']}",
             "time": rfc3339(s.clock.now()), "datacontenttype": "application/json",
             "data": {"webhookId": str(row["id"])}}
    return {"data": await _send_logged(row, event)}


@bp.post("/webhooks/<webhook_id>/redeliver")
@body(RedeliverIn)
@responds(enveloped(RedeliverOut))
@errors(400, 401, 403, 404)
async def redeliver(webhook_id: str, data: RedeliverIn):
    """Send the endpoint's events with sequences from ``from`` to ``to`` again (at most 100 that match
    its filters, in order; it stops at the first the receiver refuses). The endpoint's own delivery
    and cursor are untouched; each attempt is logged."""
    s = services()
    await require_admin()
    row = await _endpoint(webhook_id)
    last = data.to if data.to is not None else data.from_
    if last < data.from_:
        raise BadRequest("to must not be before from", code="invalid_range")
    events = await s.stores.event_log.page(org().org_id, data.from_ - 1, limit=MAX_REDELIVER + 1,
                                    types=kinds(list(row["event_types"])), fleets_any=row["fleet_ids"], upto=last)
    if len(events) > MAX_REDELIVER:
        raise BadRequest(f"at most {MAX_REDELIVER} events are redelivered at once: narrow the range",
                         code="invalid_range")
    deliveries = []
    for e in events:
        deliveries.append(await _send_logged(row, envelope(e)))
        if not deliveries[-1]["ok"]:
            break
    g.audit_details = {"webhookId": str(row["id"]), "from": data.from_, "to": last}
    return {"data": {"sent": len(deliveries), "delivered": sum(d["ok"] for d in deliveries),
                     "deliveries": deliveries}}
