"""Documents a hub serves unchanged for its whole life, built once off the event loop.

Two public paths answer a document that only the code decides: GET /v1/openapi.json (hub/openapi.py)
and GET /v1/device/protocol.json (hub/api/link.py). Building either is pure CPU in pydantic and
quart-schema: the OpenAPI document 0.6 s and 494 KB on the bench machine (2026-11-29), the device
protocol's JSON Schema 0.18-0.26 s and 106 KB (found holding the loop by the stall watch's run through
the suite, device_client/shared/loopwatch.py). Built on the event loop, that time holds every device
link and request of the process; quart-schema built the OpenAPI one again on every request, so any
caller could hold the process again and again (under load, pooled connections whose keep-alive ran out
meanwhile were closed with a request on them).

``CachedDocument``: the first request builds the document in a worker thread (the loop keeps
serving), requests meanwhile wait for that one build, and every later one gets the same bytes, with
an ETag so that a client holding them gets a 304.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import trio
from quart import Response, request


class CachedDocument:
    """``build()`` (the document as JSON-able data) encoded by ``dumps``, once, in a worker thread."""

    def __init__(self, build: Callable[[], Any], dumps: Callable[[Any], str]) -> None:
        self.build, self._dumps = build, dumps
        self._lock = trio.Lock()
        self._built: tuple[bytes, str] | None = None  # the body and its ETag, set together

    def _encode(self) -> tuple[bytes, str]:
        body = (self._dumps(self.build()) + "\n").encode()  # as quart's JSON answers end
        return body, hashlib.sha256(body).hexdigest()[:32]

    async def built(self) -> tuple[bytes, str]:
        if self._built is None:
            async with self._lock:
                if self._built is None:
                    self._built = await trio.to_thread.run_sync(self._encode)
        return self._built

    async def response(self) -> Response:
        """The answer to the request being handled: the document, or 304 when the client holds it."""
        body, etag = await self.built()
        headers = {"ETag": f'"{etag}"', "Cache-Control": "no-cache"}
        if request.if_none_match.contains(etag):
            return Response(b"", 304, headers, content_type="application/json")
        return Response(body, 200, headers, content_type="application/json")
