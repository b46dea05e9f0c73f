"""The organisation-wide event stream the console's device list follows (SSE).

Every DeviceActor and RolloutActor already publishes each event on its organisation's topic
(actors/device.py ``publish``, actors/rollout.py); this serves that topic. It carries every device's
events, so it needs the viewer relation on the organisation itself: a member who sees only some
fleets or devices gets 403 here, and the console falls back to reloading its page of devices (the
per-device streams stay open to them). The stream re-checks that access like the other streams.
"""

from __future__ import annotations

from quart import Blueprint
from quart_schema import hide

from hub.api.common import errors, org, services
from hub.api.sse import resume_point, stream_response
from hub.auth.authz import Obj, require_org
from hub.auth.streams import StreamAccess

bp = Blueprint("console_stream", __name__)


@bp.get("/console/api/events")
@hide
@errors(400, 401, 403, 410, 429)
async def organisation_events():
    s = services()
    await require_org(s, "viewer")
    org_id = org().org_id
    subscription = await s.events.open(("org", org_id), owner=("org", org_id))
    replay = await resume_point(s, subscription, org_id, None)
    first = {"kind": "org.snapshot", "organizationId": str(org_id), "payload": {}}
    return await stream_response(subscription, first, {"organizationId": str(org_id)},
                                 StreamAccess.of_request(s, "viewer", Obj("organization", org_id)), replay)
