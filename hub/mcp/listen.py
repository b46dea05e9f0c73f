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


def listen_request(ctx: Any, params: types.SubscriptionsListenRequestParams) -> tuple[list[str], dict[str, Any]]:
    """A listen's URIs (each once) and the ``_meta`` every frame of its stream carries; refused as the
    protocol says (no request id, more than ``MAX_URIS``) before anything is held. Also stdio.py's."""
    if ctx.request_id is None:
        raise MCPError(code=types.INVALID_REQUEST, message="subscriptions/listen needs a request id")
    uris = list(dict.fromkeys(params.notifications.resource_subscriptions or ()))
    if len(uris) > MAX_URIS:
        raise MCPError(code=types.INVALID_PARAMS, message=f"at most {MAX_URIS} resources per listen")
    return uris, {SUBSCRIPTION_ID_META_KEY: ctx.request_id}


async def acknowledge(ctx: Any, params: types.SubscriptionsListenRequestParams, honored: list[str],
                      meta: dict[str, Any]) -> None:
    """The stream's first frame: what it will deliver. The list-changed kinds are honoured as asked (a
    hub's tools and resources are fixed for its process: they never fire); of the URIs, ``honored``."""
    asked = params.notifications
    await ctx.session.send_notification(types.SubscriptionsAcknowledgedNotification(
        params=types.SubscriptionsAcknowledgedNotificationParams(notifications=types.SubscriptionFilter(
            tools_list_changed=True if asked.tools_list_changed else None,
            resources_list_changed=True if asked.resources_list_changed else None,
            resource_subscriptions=honored or None), _meta=meta)), related_request_id=ctx.request_id)


class Updates:
    """The URIs a listen stream has yet to announce, each once however often it changed meanwhile, and
    the loop that announces them. Also stdio.py's."""

    def __init__(self) -> None:
        self._pending: dict[str, None] = {}  # ordered
        self._wake = trio.Event()
        self._ended = False

    def changed(self, uri: str) -> None:
        self._pending[uri] = None
        self._wake.set()

    def end(self) -> None:
        """Nothing more will change: ``send`` returns once what is pending is out."""
        self._ended = True
        self._wake.set()

    async def send(self, ctx: Any, meta: dict[str, Any]) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._pending:
                uri = next(iter(self._pending))
                del self._pending[uri]
                await ctx.session.send_notification(types.ResourceUpdatedNotification(
                    params=types.ResourceUpdatedNotificationParams(uri=uri, _meta=meta)),
                    related_request_id=ctx.request_id)
            if self._ended:
                return


def listen_handler(events: "EventHub", fixed_uris: frozenset[str], device_of: Callable[[str], str | None],
                   visible: Visible, org_of: Callable[[Any], uuid.UUID | None]):
    """The ``subscriptions/listen`` handler for the lowlevel Server (``on_subscriptions_listen``)."""

    async def listen(ctx: Any, params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
        uris, meta = listen_request(ctx, params)
        org = org_of(ctx)
        if org is None:
            raise MCPError(code=types.INVALID_PARAMS, message="X-Organization-ID is required to listen")
        feeds: list[tuple[str, Subscriber]] = []
        honored: list[str] = []
        stream: Subscriber | None = None
        try:
            try:
                # the stream's own slot first: a listen of nothing still counts against the cap
                stream = await events.open(("mcp-listen", uuid.uuid4()), owner=("org", org))
                for uri in uris:
                    device_id = device_of(uri)
                    if device_id is None:
                        if uri in fixed_uris:
                            honored.append(uri)
                        continue
                    if not await visible(ctx, device_id):
                        continue  # not viewable answers like missing: left out of the filter
                    feeds.append((uri, await events.open(("device", uuid.UUID(device_id)), owner=("org", org))))
                    honored.append(uri)
            except FleethubError as exc:  # the organisation's stream cap
                raise MCPError(code=types.INVALID_REQUEST, message=exc.message) from None
            await acknowledge(ctx, params, honored, meta)
            if feeds:
                await _forward(ctx, feeds, meta)
            else:
                await trio.sleep_forever()  # nothing here ever changes; the client ends it
        finally:
            for feed in [f for _, f in feeds] + ([stream] if stream is not None else []):
                feed.close()
        return types.SubscriptionsListenResult(_meta=meta)

    return listen


async def _forward(ctx: Any, feeds: list[tuple[str, "Subscriber"]], meta: dict[str, Any]) -> None:
    """Announce each URI whose feed has events, coalesced, until every feed has ended."""
    updates = Updates()
    open_feeds = len(feeds)

    async def watch(uri: str, feed: "Subscriber") -> None:
        nonlocal open_feeds
        try:
            async for _event in feed.receive:
                updates.changed(uri)
        finally:
            open_feeds -= 1
            if open_feeds == 0:
                updates.end()

    async with trio.open_nursery() as nursery:
        for uri, feed in feeds:
            nursery.start_soon(watch, uri, feed)
        await updates.send(ctx, meta)
        nursery.cancel_scope.cancel()
