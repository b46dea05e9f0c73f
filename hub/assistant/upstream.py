"""A streaming client for any OpenAI-compatible chat-completions server (the configured model).

``FLEETHUB_ASSISTANT_UPSTREAM`` is the server's base URL (``…/v1``; ``/chat/completions`` is
appended unless already there) and ``FLEETHUB_ASSISTANT_KEY`` its bearer key. httpx runs under trio.
Every read has a timeout (``FLEETHUB_ASSISTANT_TIMEOUT``), so a silent upstream is a failure, not a
hang. Failures never carry the key or the upstream's own error text to the caller.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from device_client.shared import outbound_tls


class UpstreamFailed(Exception):
    """The model server failed: refused, unreachable, too slow, or spoke something else than SSE chunks."""


@dataclass(frozen=True)
class Upstream:
    url: str
    key: str | None = field(default=None, repr=False)
    model: str | None = None
    timeout: float = 60.0

    @property
    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith("/chat/completions") else base + "/chat/completions"

    async def client(self) -> httpx.AsyncClient:
        t = self.timeout
        # the shared TLS context (device_client/shared/outbound_tls.py): httpx would load certifi's
        # bundle on the loop for every chat
        return httpx.AsyncClient(timeout=httpx.Timeout(t, connect=min(t, 10.0)), follow_redirects=False,
                                 verify=await outbound_tls.httpx_default())


async def stream_chunks(client: httpx.AsyncClient, upstream: Upstream, payload: dict) -> AsyncIterator[tuple[str, dict]]:
    """Each chunk as (its data text exactly as received, parsed); ends at ``data: [DONE]``."""
    headers = {"Accept": "text/event-stream"}
    if upstream.key:
        headers["Authorization"] = f"Bearer {upstream.key}"
    try:
        async with client.stream("POST", upstream.endpoint, json=payload, headers=headers) as resp:
            if resp.status_code != 200:
                raise UpstreamFailed(f"the model server answered HTTP {resp.status_code}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue  # comments, event names, blank separators
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise UpstreamFailed("the model server sent a malformed chunk") from None
                if not isinstance(chunk, dict):
                    raise UpstreamFailed("the model server sent a malformed chunk")
                if chunk.get("error"):
                    raise UpstreamFailed("the model server reported an error")
                yield data, chunk
    except httpx.TimeoutException:
        raise UpstreamFailed("the model server did not answer in time") from None
    except httpx.HTTPError as exc:
        raise UpstreamFailed(f"the model server could not be reached or broke off ({type(exc).__name__})") from None
    raise UpstreamFailed("the model server ended the stream without [DONE]")
