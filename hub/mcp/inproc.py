"""One REST request sent through the hub's own app, in this process, on an MCP caller's behalf.

Why through the app and not by calling the view: the request then passes the same hooks as any
other (hub/app.py ``_before``/``_after``): authentication with the caller's own credential, the
organisation check, authorisation in the view, validation, the error bodies and the audit row.
The scope is marked ``fleethub.channel = "mcp"`` (a key no client can send: it is not a header):
the audit row then names the MCP server and the tool, and the request is not counted against the
rate limit a second time (its MCP request was, in hub/mcp/endpoint.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlencode

import orjson
import trio

from hub.auth.middleware import MCP_CHANNEL as CHANNEL_KEY, MCP_TOOL as TOOL_KEY

# Larger answers than this are not given to a model whole (the pages are bounded well below it).
MAX_ANSWER_BYTES = 1024 * 1024
# The request headers a tool call carries on from its MCP request: the credential and organisation.
FORWARDED = ("authorization", "x-api-token-id", "x-api-secret-key", "x-organization-id")

Asgi = Callable[[dict, Callable, Callable], Awaitable[None]]


@dataclass(frozen=True)
class Answer:
    status: int
    body: object  # the JSON body, or None when there was none
    text: str = ""  # the body as it was sent: a tool's text content, not serialised a second time


class AnswerTooLarge(Exception):
    pass


def headers_from(pairs: Iterable[tuple[str, str]], org_id: uuid.UUID | None) -> list[tuple[bytes, bytes]]:
    """The credential and organisation headers of the MCP request, the organisation replaced by a
    tool's ``organization_id`` argument when it gives one."""
    out = []
    for name, value in pairs:
        name = name.lower()
        if name in FORWARDED and not (org_id is not None and name == "x-organization-id"):
            out.append((name.encode("latin-1"), value.encode("latin-1")))
    if org_id is not None:
        out.append((b"x-organization-id", str(org_id).encode()))
    return out


async def call(app: Asgi, *, method: str, path: str, query: dict[str, str], body: dict | None,
               headers: list[tuple[bytes, bytes]], client: tuple[str, int] | None, tool: str) -> Answer:
    raw = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
    head = [*headers, (b"host", b"mcp.internal"), (b"user-agent", b"fleethub-mcp")]
    if body is not None:
        head += [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": urlencode(query).encode(), "root_path": "", "headers": head,
             "client": client, "server": ("mcp.internal", 80), "extensions": {},
             CHANNEL_KEY: "mcp", TOOL_KEY: tool}
    sent = False
    done = trio.Event()

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await done.wait()  # the client "disconnects" only once its answer is complete
        return {"type": "http.disconnect"}

    status = 500
    chunks: list[bytes] = []
    size = 0

    async def send(message: dict) -> None:
        nonlocal status, size
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise AnswerTooLarge(f"the answer is over {MAX_ANSWER_BYTES} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                done.set()

    try:
        await app(scope, receive, send)
    finally:
        done.set()
    raw_answer = b"".join(chunks)
    text = raw_answer.decode("utf-8", "replace")
    try:
        # orjson reads the app's own answers (hub/answers.py writes them with it) at a third of json's
        # cost; json reads what orjson refuses (a lone surrogate the app escaped, an integer past 64 bits).
        parsed = orjson.loads(raw_answer) if raw_answer else None
    except orjson.JSONDecodeError:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = {"text": text[:2000]}
    return Answer(status, parsed, text)
