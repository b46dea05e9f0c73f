"""The SDK's own MCP client (``mcp.ClientSession``) against a hub's /v1/mcp, for the tests and bench."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


def pat_headers(pat: tuple[str, str], org_id: str | None) -> dict[str, str]:
    """A PAT in its bearer form: what an MCP client configured with one header sends."""
    out = {"Authorization": f"Bearer {pat[1]}"}
    if org_id is not None:
        out["X-Organization-ID"] = org_id
    return out


@asynccontextmanager
async def http_session(base_url: str, headers: dict[str, str]):
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as client:
        async with streamable_http_client(base_url + "/v1/mcp", http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                yield session


async def call(session: ClientSession, name: str, **arguments: Any) -> tuple[bool, dict]:
    """(is_error, the structured answer) of one tool call."""
    result = await session.call_tool(name, arguments)
    if result.structured_content is not None:
        return bool(result.is_error), result.structured_content
    return bool(result.is_error), json.loads(result.content[0].text)
