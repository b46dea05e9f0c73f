"""The documented fake of the AI model: an OpenAI-compatible chat-completions server on 127.0.0.1.

It is a real HTTP server (hypercorn's trio worker, a raw ASGI app) speaking the OpenAI streaming
protocol — ``data: <chunk>`` events ending with ``data: [DONE]`` — so the hub's upstream client,
timeouts and error paths are exercised over real sockets. Only the model is fake: ``respond(body)``
decides the steps of each answer. The default behaves like a small tool-using model: asked about
devices with tools offered, it calls ``list_devices``; given a tool result, it repeats it; otherwise
it echoes the question. Every request is recorded (headers and JSON body) for assertions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio
import trio.lowlevel
from hypercorn.config import Config
from hypercorn.trio import serve


class Break(Exception):
    """Raised by the fake mid-answer: hypercorn drops the connection, like a crashed model server."""


def text_chunks(text: str, *, cid: str = "chatcmpl-fake", model: str = "fake-model", pieces: int = 3,
                usage: tuple[int, int] | None = (11, 7)) -> list[dict]:
    size = max(1, -(-len(text) // pieces))
    parts = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    base = {"id": cid, "object": "chat.completion.chunk", "created": 1700000000, "model": model,
            "system_fingerprint": "fp_fake"}
    out = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]}]
    out += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "logprobs": None, "finish_reason": None}]}
            for p in parts]
    out.append({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]})
    if usage is not None:
        out.append({**base, "choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                                      "total_tokens": usage[0] + usage[1]}})
    return out


def tool_call_chunks(name: str, arguments: dict, *, call_id: str = "call_1", cid: str = "chatcmpl-fake-tool",
                     usage: tuple[int, int] | None = (20, 5)) -> list[dict]:
    base = {"id": cid, "object": "chat.completion.chunk", "created": 1700000000, "model": "fake-model"}
    args = json.dumps(arguments)
    out = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]},
        "finish_reason": None}]}]
    half = len(args) // 2
    for piece in (args[:half], args[half:]):
        out.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": piece}}]}, "finish_reason": None}]})
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    if usage is not None:
        out.append({**base, "choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                                      "total_tokens": usage[0] + usage[1]}})
    return out


def default_respond(body: dict) -> list[Any]:
    messages = body["messages"]
    last = messages[-1]
    tools = {t["function"]["name"] for t in body.get("tools") or []}
    if last["role"] == "tool":
        return [*text_chunks("Tool said: " + last["content"]), "done"]
    question = last.get("content") or ""
    question = question if isinstance(question, str) else "".join(p["text"] for p in question)
    if "devices" in question and "list_devices" in tools:
        return [*tool_call_chunks("list_devices", {}), "done"]
    return [*text_chunks("You said: " + question), "done"]


@dataclass
class FakeModel:
    """Steps of an answer: a chunk dict, ``"done"``, ``("status", code)``, ``"hang"``, ``"break"``,
    or ``("raw", text)``."""
    respond: Callable[[dict], list[Any]] = default_respond
    requests: list[dict] = field(default_factory=list)
    base_url: str = ""

    async def app(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        body = json.loads(raw) if raw else {}
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.requests.append({"path": scope["path"], "headers": headers, "body": body})
        steps = self.respond(body)
        if steps and isinstance(steps[0], tuple) and steps[0][0] == "status":
            payload = json.dumps({"error": {"message": "fake failure", "type": "server_error"}}).encode()
            await send({"type": "http.response.start", "status": steps[0][1],
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": payload})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        for step in steps:
            if step == "done":
                data = b"data: [DONE]\n\n"
            elif step == "hang":
                await trio.sleep_forever()
            elif step == "break":
                raise Break("the fake model server crashed mid-answer")
            elif isinstance(step, tuple) and step[0] == "raw":
                data = step[1].encode()
            else:
                data = b"data: " + json.dumps(step, separators=(",", ":")).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})
            await trio.lowlevel.checkpoint()
        await send({"type": "http.response.body", "body": b""})


async def start_fake_model(nursery: trio.Nursery, model: FakeModel | None = None) -> FakeModel:
    model = model or FakeModel()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = logging.getLogger("fake-model")
    config.graceful_timeout = 0.1
    binds = await nursery.start(partial(serve, model.app, config, mode="asgi"))
    model.base_url = binds[0] + "/v1"
    return model
