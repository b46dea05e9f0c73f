"""A POST's body at ``/v1/mcp``: read before the SDK sees it, replayed to the SDK, parsed once, and what it
asks of the endpoint (hub/mcp/endpoint.py): a JSON or an SSE answer, the request id it holds in flight."""

from __future__ import annotations

import json
from typing import Any

import orjson


def parsed(body: bytes) -> dict | None:
    """One JSON-RPC message's object, or None (a batch, a body that is not JSON: the SDK refuses it its way)."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:  # nested past its depth, or what only json reads (an integer past 64 bits)
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):
            return None
    return message if isinstance(message, dict) else None


def request_key(session_id: str, message: dict | None) -> tuple[str, int | str] | None:
    """(session, id) of a JSON-RPC request, with the id as the SDK reads it (1.0 is 1); None for a
    notification, for the client's answer to a request of the server (its id is the server's), or for
    an id no request can have (the SDK refuses that request itself)."""
    request_id = message.get("id") if message is not None and "method" in message else None
    if isinstance(request_id, float) and request_id.is_integer():
        request_id = int(request_id)
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        return None
    return session_id, request_id


def json_answer(message: dict | None) -> bool:
    """Whether a JSON-RPC request's answer can be a JSON body: it did not ask for progress. Anything
    else (a notification, a batch, a body that is not JSON) is left to the SDK on its SSE default."""
    if message is None or "id" not in message:
        return False
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return not (isinstance(meta, dict) and "progressToken" in meta)


async def read_body(receive: Any, limit: int) -> tuple[list[dict], bool]:
    """The request's body messages, read until its end or past ``limit`` bytes (then the rest is
    left on the connection for the SDK, which refuses the body as too large); True when complete
    and within ``limit``."""
    messages, size = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, False
        size += len(message.get("body", b""))
        if size > limit:
            return messages, False
        if not message.get("more_body", False):
            return messages, True


def replaying(messages: list[dict], receive: Any) -> Any:
    pending = list(messages)

    async def replay() -> dict:
        if pending:
            return pending.pop(0)
        return await receive()
    return replay
