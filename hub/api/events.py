"""GET /v1/events: the organisation's event log from a cursor, as CloudEvents (docs/events.md).

A member reads the events of the devices and fleets they may view (storage/events.py
``Visibility``); an organisation viewer reads them all. ``after`` is the cursor (the ``sequence`` of
the last event the caller has); the answer's ``next`` is the cursor to ask with next time, also when
filters left the page empty, so a caller polling with a filter moves forward through the log.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint

from hub.api.common import errors, org, services
from hub.api.validation import query, responds
from hub.auth.authz import scope_for_list
from hub.errors import BadRequest, Gone, Unavailable
from hub.eventlog import TYPE_PREFIX, envelope
from storage.events import MAX_PAGE, Visibility

bp = Blueprint("events", __name__, url_prefix="/v1")


class EventsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    after: int = Field(0, ge=0, le=2**62, description="the cursor: events with a greater sequence are returned")
    type: str | None = Field(None, min_length=1, max_length=1000,
                             description="comma-separated event types; one ending in * is a prefix "
                                         "(io.fleethub.device.*)")
    subject: str | None = Field(None, min_length=1, max_length=200, description="devices/<id> or rollouts/<id>")
    limit: int = Field(100, ge=1, le=MAX_PAGE)


class CloudEvent(BaseModel):
    """A CloudEvents 1.0 event in its structured JSON form; ``sequence`` is the organisation's cursor."""
    specversion: str
    id: str
    source: str
    type: str
    subject: str
    time: str
    datacontenttype: str
    sequence: str
    data: Any


class EventsPage(BaseModel):
    data: list[CloudEvent]
    next: int = Field(description="the cursor to pass as after for the events that follow")
    oldestCursor: int = Field(description="the oldest cursor still held: retention removed the events "
                                          "up to it (0: none removed)")


def kinds_of(raw: str | None) -> list[str]:
    """The type filter as stored kinds (without the io.fleethub. prefix)."""
    if raw is None:
        return []
    kinds = []
    for item in (t.strip() for t in raw.split(",")):
        if not item.startswith(TYPE_PREFIX) or len(item) == len(TYPE_PREFIX) or "*" in item[:-1]:
            raise BadRequest(f"event types start with {TYPE_PREFIX} and may end in * (docs/events.md)",
                             code="invalid_type")
        kinds.append(item[len(TYPE_PREFIX):])
    return kinds


@bp.get("/events")
@query(EventsQuery)
@responds(EventsPage)
@errors(400, 401, 403, 410, 503)
async def list_events(query_args: EventsQuery):
    """The organisation's events after a cursor, oldest first, with the caller's visibility (410
    cursor_expired when retention removed events after the cursor: details.oldestCursor)."""
    s = services()
    if not s.settings.event_log:
        raise Unavailable("the event log is off on this hub (FLEETHUB_EVENT_LOG=0)", code="event_log_off")
    q = query_args
    kinds = kinds_of(q.type)
    org_id = org().org_id
    everything, ids, fleets = await scope_for_list(s, "viewer", "device")
    last, pruned = await s.stores.event_log.cursors(org_id)
    if q.after < pruned:
        raise Gone(f"events after cursor {q.after} are past the event log's retention; the oldest cursor "
                   f"to resume from is {pruned}", details={"oldestCursor": pruned})
    if q.after > last:
        raise BadRequest(f"cursor {q.after} is ahead of this organisation's event log (at {last})",
                         code="invalid_cursor")
    page = await s.stores.event_log.page(org_id, q.after, limit=q.limit, types=kinds, subject=q.subject,
                                  visibility=Visibility(everything, frozenset(ids), frozenset(fleets)))
    # A full page ends at its last event. A short one holds every match up to ``last`` (read before
    # it, and an organisation's events commit in cursor order) and maybe some after it.
    upto = page[-1].org_seq if len(page) == q.limit else max([last, *(e.org_seq for e in page)])
    return {"data": [envelope(e) for e in page], "next": upto, "oldestCursor": pruned}
