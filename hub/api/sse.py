"""Server-sent event streams over the event hub's bounded subscriptions (devices, rollouts)."""

from __future__ import annotations

import json

import trio
from quart import make_response

from hub.api.common import jsonable
from hub.events import Subscriber

KEEPALIVE = 15.0


def sse(event: dict) -> bytes:
    return f"event: {event['kind']}\ndata: {json.dumps(jsonable(event), separators=(',', ':'))}\n\n".encode()


async def stream_response(subscription: Subscriber, first: dict, dropped: dict):
    """The first event (a snapshot), then every event as it comes. A client that reads too slowly is
    dropped with a final ``dropped`` event rather than buffered without bound; a comment line every
    15 s keeps proxies from closing an idle stream."""

    async def stream():
        with subscription:
            yield sse(first)
            while True:
                with trio.move_on_after(KEEPALIVE):
                    try:
                        event = await subscription.receive.receive()
                    except trio.EndOfChannel:
                        break
                    yield sse(event)
                    continue
                yield b": keepalive\n\n"
            if subscription.dropped:
                yield sse({"kind": "dropped", **dropped,
                           "payload": {"reason": "the client did not keep up with the stream"}})

    response = await make_response(stream(), 200, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                    "X-Accel-Buffering": "no"})
    response.timeout = None
    return response
