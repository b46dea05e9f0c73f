"""``fleethub mcp --hub URL``: MCP over stdio, for an agent that starts its servers as processes.

A bridge, not a second server: it opens one session with the hub's /v1/mcp (the SDK's Streamable
HTTP client, with the caller's credential) and answers every stdio request with the same request
on that session. Why the remote tools rather than a second set calling REST from here: the tools,
their schemas, their checks and their audit exist once, on the hub, and an agent sees exactly the
same server through either transport; this process holds no tool of its own to drift from them.
Credentials as ``fleethub tunnel`` takes them: FLEETHUB_PAT_ID and FLEETHUB_PAT_SECRET (sent as
X-API-Token-ID and X-API-Secret-Key), or FLEETHUB_TOKEN (a service-account token or a PAT secret,
sent as a bearer token), with FLEETHUB_ORG_ID as X-Organization-ID.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import mcp_types as types
import trio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from hub.mcp.endpoint import PATH
from hub.mcp.listen import Updates, acknowledge, listen_request
from hub.mcp.server import INSTRUCTIONS, NAME

log = logging.getLogger("fleethub.mcp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hub", default=None, help="the hub's base URL (default $FLEETHUB_HUB_URL)")
    parser.add_argument("--org", default=None, help="organisation id (default $FLEETHUB_ORG_ID)")
    parser.add_argument("--pat-id", default=None, help="PAT id (default $FLEETHUB_PAT_ID)")
    parser.add_argument("--pat-secret", default=None, help="PAT secret (visible in ps; prefer $FLEETHUB_PAT_SECRET)")


def headers_from(args: argparse.Namespace) -> dict[str, str]:
    pat_id = args.pat_id or os.environ.get("FLEETHUB_PAT_ID")
    pat_secret = args.pat_secret or os.environ.get("FLEETHUB_PAT_SECRET")
    bearer = os.environ.get("FLEETHUB_TOKEN")
    org = args.org or os.environ.get("FLEETHUB_ORG_ID")
    if pat_id and pat_secret:
        headers = {"X-API-Token-ID": pat_id, "X-API-Secret-Key": pat_secret}
    elif bearer:
        headers = {"Authorization": f"Bearer {bearer}"}
    else:
        raise SystemExit("no credentials: set FLEETHUB_PAT_ID and FLEETHUB_PAT_SECRET, or FLEETHUB_TOKEN")
    if org:
        headers["X-Organization-ID"] = org
    return headers


def hub_url(args: argparse.Namespace) -> str:
    hub = args.hub or os.environ.get("FLEETHUB_HUB_URL")
    if not hub:
        raise SystemExit("no hub: give --hub URL (or FLEETHUB_HUB_URL)")
    if not hub.startswith(("http://", "https://")):
        raise SystemExit(f"--hub {hub!r} is not a URL; give the hub's base URL, e.g. http://127.0.0.1:8080")
    return hub.rstrip("/")


Deliver = Callable[[str], Awaitable[None]]


class Relay:
    """A device's state followed over stdio: one ``resources/subscribe`` on the hub per URI, however many
    stdio subscriptions and listen streams hold it, and each of the hub's updates for it passed to them
    all. ``on_message`` is the hub session's message handler."""

    def __init__(self) -> None:
        self.remote: ClientSession | None = None
        self.holders: dict[str, list[Deliver]] = {}
        self._lock = trio.Lock()

    async def hold(self, uri: str, deliver: Deliver) -> None:
        """Follow ``uri``; the hub's refusal (a device the caller may not view, a URI that is not a
        device's state) is raised as it gave it."""
        assert self.remote is not None
        async with self._lock:
            if uri not in self.holders:
                await self.remote.subscribe_resource(uri)
                self.holders[uri] = []
            self.holders[uri].append(deliver)

    async def release(self, uri: str, deliver: Deliver) -> None:
        assert self.remote is not None
        with trio.CancelScope(shield=True):
            async with self._lock:
                held = self.holders.get(uri)
                if held is None or deliver not in held:
                    return
                held.remove(deliver)
                if not held:
                    del self.holders[uri]
                    with trio.move_on_after(10), contextlib.suppress(Exception):
                        await self.remote.unsubscribe_resource(uri)  # the session may be gone: nothing to undo

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            uri = str(message.params.uri)
            for deliver in list(self.holders.get(uri, ())):
                try:
                    await deliver(uri)
                except Exception:  # noqa: BLE001 — a closed stdio session must not end the others' updates
                    log.debug("an update for %s was not passed on", uri, exc_info=True)


def bridge(remote: ClientSession, relay: Relay | None = None) -> Server:
    """A server whose every handler is the same request on ``remote``; with ``relay`` (the hub
    session's message handler) it also follows device states, as subscriptions (2025-11-25) and as
    listen streams (2026-07-28)."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return await remote.list_tools(params=params)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        meta = ctx.meta or {}
        if meta.get("progress_token", meta.get("progressToken")) is None:
            return await remote.call_tool(params.name, params.arguments)

        # the client asked for progress: the hub's notifications are passed on with its token
        async def relay(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

        return await remote.call_tool(params.name, params.arguments, progress_callback=relay)

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return await remote.list_resources(params=params)

    async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return await remote.list_resource_templates(params=params)

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await remote.read_resource(params.uri)

    if relay is None:
        return Server(NAME, version="1", instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool,
                      on_list_resources=list_resources, on_list_resource_templates=list_templates,
                      on_read_resource=read_resource)
    subscribed: dict[tuple[int, str], Deliver] = {}  # (stdio session, uri): its deliverer

    async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri, session = str(params.uri), ctx.session
        if (id(session), uri) not in subscribed:
            async def deliver(updated: str) -> None:
                await session.send_resource_updated(updated)

            await relay.hold(uri, deliver)
            subscribed[(id(session), uri)] = deliver
        return types.EmptyResult()

    async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        deliver = subscribed.pop((id(ctx.session), uri), None)
        if deliver is not None:
            await relay.release(uri, deliver)
        return types.EmptyResult()

    async def listen(ctx: Any, params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
        """As the hub's own listen (hub/mcp/listen.py, whose pieces these are): the URIs the hub lets this
        caller follow are acknowledged, the others left out; updates are coalesced per URI."""
        uris, meta = listen_request(ctx, params)
        updates = Updates()

        async def deliver(updated: str) -> None:
            updates.changed(updated)

        honored: list[str] = []
        try:
            for uri in uris:
                try:
                    await relay.hold(uri, deliver)
                except MCPError:
                    continue  # the hub refused it: left out, as the hub's own listen leaves it out
                honored.append(uri)
            await acknowledge(ctx, params, honored, meta)
            await updates.send(ctx, meta)  # until the client ends the stream
        finally:
            for uri in honored:
                await relay.release(uri, deliver)
        return types.SubscriptionsListenResult(_meta=meta)  # not reached: nothing here ends it

    return Server(NAME, version="1", instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool,
                  on_list_resources=list_resources, on_list_resource_templates=list_templates,
                  on_read_resource=read_resource, on_subscribe_resource=subscribe,
                  on_unsubscribe_resource=unsubscribe, on_subscriptions_listen=listen)


async def run(args: argparse.Namespace) -> None:
    url, headers = hub_url(args) + PATH, headers_from(args)
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as client:
        async with streamable_http_client(url, http_client=client) as streams:
            relay = Relay()
            async with ClientSession(streams[0], streams[1], message_handler=relay.on_message) as remote:
                await remote.initialize()
                relay.remote = remote
                print(f"fleethub mcp: connected to {url}", file=sys.stderr, flush=True)
                server = bridge(remote, relay)
                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())
