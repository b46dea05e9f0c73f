"""``subscriptions/listen`` (MCP 2026-07-28): a device's live state for clients of the stateless revision.

The 2026-07-28 revision dropped ``resources/subscribe``: a client that wants change notifications sends
``subscriptions/listen`` with the URIs it follows, and the answer to that request is the stream (SSE),
each frame stamped with the request's id. The SDK's default client (``mcp.Client``) negotiates that
revision, so without this a device's state could be followed only from a 2025-11-25 session.

What a listen stream gets here, as ``resources/subscribe`` does on a session (server.py):

- ``fleethub://devices/{id}/state`` for a device the caller may view: a ``notifications/resources/updated``
  for its URI whenever its SSE stream has an event (the same EventHub topic). Bursts are coalesced: a
  URI already waiting to be sent is not queued twice (the client reads the resource again anyway).
- A device the caller may not view, a missing one and an unknown URI are left out of the acknowledged
  filter alike (nothing tells them apart); the hub's fixed documents are honoured and never change.
- ``tools_list_changed`` and ``resources_list_changed`` are honoured and never fire: a hub's tools and
  resources are fixed for the life of its process. The hub serves no prompts.

Bounds: at most ``MAX_URIS`` URIs per listen (more is ``INVALID_PARAMS``, before the acknowledgement);
every stream holds one slot of its organisation's event-stream cap, and every device it follows one more
(``hub/events.py``: the cap SSE streams and session subscriptions count against), so listens cannot
outgrow what the organisation may hold open. A device's feed that ends (the device deleted, the
subscriber dropped for falling behind) stops that URI; when none is left the stream ends with the
listen's result, the protocol's graceful close, and the client may listen again.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import mcp_types as types
import trio
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

from hub.errors import FleethubError

if TYPE_CHECKING:
    from hub.events import EventHub, Subscriber

MAX_URIS = 32  # as resources/subscribe's MAX_SUBSCRIPTIONS_PER_SESSION

Visible = Callable[[Any, str], Awaitable[bool]]  # (ctx, device id) -> may the caller view it


def listen_handler(events: "EventHub", fixed_uris: frozenset[str], device_of: Callable[[str], str | None],
                   visible: Visible, org_of: Callable[[Any], uuid.UUID | None]):
    """The ``subscriptions/listen`` handler for the lowlevel Server (``on_subscriptions_listen``)."""

    async def listen(ctx: Any, params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(code=types.INVALID_REQUEST, message="subscriptions/listen needs a request id")
        asked = params.notifications
        uris = list(dict.fromkeys(asked.resource_subscriptions or ()))
        if len(uris) > MAX_URIS:
            raise MCPError(code=types.INVALID_PARAMS, message=f"at most {MAX_URIS} resources per listen")
        org = org_of(ctx)
        if org is None:
            raise MCPError(code=types.INVALID_PARAMS, message="X-Organization-ID is required to listen")
        feeds: list[tuple[str, Subscriber]] = []
        owned: list[Subscriber] = []
        try:
            try:
                # the stream's own slot first: a listen of nothing still counts against the cap
                owned.append(await events.open(("mcp-listen", uuid.uuid4()), owner=("org", org)))
                honored: list[str] = []
                for uri in uris:
                    device_id = device_of(uri)
                    if device_id is None:
                        if uri in fixed_uris:
                            honored.append(uri)
                        continue
                    if not await visible(ctx, device_id):
                        continue  # not viewable answers like missing: left out of the filter
                    feed = await events.open(("device", uuid.UUID(device_id)), owner=("org", org))
                    owned.append(feed)
                    feeds.append((uri, feed))
                    honored.append(uri)
            except FleethubError as exc:  # the organisation's stream cap
                raise MCPError(code=types.INVALID_REQUEST, message=exc.message) from None
            meta = {SUBSCRIPTION_ID_META_KEY: subscription_id}
            acknowledged = types.SubscriptionFilter(
                tools_list_changed=True if asked.tools_list_changed else None,
                resources_list_changed=True if asked.resources_list_changed else None,
                resource_subscriptions=honored or None)
            await ctx.session.send_notification(
                types.SubscriptionsAcknowledgedNotification(
                    params=types.SubscriptionsAcknowledgedNotificationParams(notifications=acknowledged, _meta=meta)),
                related_request_id=subscription_id)
            if feeds:
                await _forward(ctx, feeds, meta, subscription_id)
            else:
                await trio.sleep_forever()  # nothing here ever changes; the client ends it
        finally:
            for feed in owned:
                feed.close()
        return types.SubscriptionsListenResult(_meta=meta)

    return listen


async def _forward(ctx: Any, feeds: list[tuple[str, "Subscriber"]], meta: dict[str, Any], subscription_id: Any) -> None:
    """Send an update for each URI whose feed has events, coalesced, until every feed has ended."""
    pending: dict[str, None] = {}  # ordered: URIs waiting to be sent, each at most once
    wake = trio.Event()
    open_feeds = len(feeds)

    async def watch(uri: str, feed: "Subscriber") -> None:
        nonlocal wake, open_feeds
        try:
            async for _event in feed.receive:
                pending[uri] = None
                wake.set()
        finally:
            open_feeds -= 1
            wake.set()

    async with trio.open_nursery() as nursery:
        for uri, feed in feeds:
            nursery.start_soon(watch, uri, feed)
        while True:
            await wake.wait()
            wake = trio.Event()
            while pending:
                uri = next(iter(pending))
                del pending[uri]
                await ctx.session.send_notification(
                    types.ResourceUpdatedNotification(params=types.ResourceUpdatedNotificationParams(uri=uri, _meta=meta)),
                    related_request_id=subscription_id)
            if open_feeds == 0:
                nursery.cancel_scope.cancel()
                return
