"""One conversation with the configured model: rounds of streaming, with tool calls run by the hub.

A round streams the model's chunks through unchanged (the same JSON text) except the tool-call
deltas and a ``tool_calls`` finish, which the hub keeps: it runs each allow-listed call with the
caller's permissions, appends the assistant's tool-call message and the tool results, and asks the
model again. At most ``MAX_ROUNDS`` rounds; the last one offers no tools, so it must answer in text.
The caller sees one completion: text, a finish, the usage totals if asked for, ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from hub.assistant import stream
from hub.assistant.budget import estimate_tokens
from hub.assistant.schema import ChatRequest
from hub.assistant.tools import Caller, definitions, run_tool
from hub.assistant.upstream import Upstream, stream_chunks

MAX_ROUNDS = 4
_PASSED = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "user")


@dataclass
class Tally:
    """Tokens of one request by class: reported by the model, or estimated (chars / 4) when it did not."""
    prompt: int = 0
    completion: int = 0
    tool: int = 0


def _payload(req: ChatRequest, upstream: Upstream, messages: list[dict], tools: list[dict]) -> dict:
    payload: dict = {"model": upstream.model or req.model or "default", "messages": messages, "stream": True,
                     "stream_options": {"include_usage": True}}
    for name in _PASSED:
        value = getattr(req, name)
        if value is not None:
            payload[name] = value
    if tools:
        payload["tools"] = tools
        if req.tool_choice is not None:
            payload["tool_choice"] = req.tool_choice
    return payload


def _collect(calls: dict[int, dict], deltas: list[dict]) -> None:
    """Tool calls arrive in pieces: the id and name first, the arguments in fragments, by index."""
    for tc in deltas:
        slot = calls.setdefault(tc.get("index", 0), {"id": "", "name": "", "arguments": ""})
        fn = tc.get("function") or {}
        slot["id"] = tc.get("id") or slot["id"]
        slot["name"] = fn.get("name") or slot["name"]
        slot["arguments"] += fn.get("arguments") or ""


def _text_of(messages: list[dict]) -> str:
    return "".join((m.get("content") or "") if isinstance(m.get("content"), str) else
                   "".join(p.get("text", "") for p in m.get("content") or []) for m in messages)


async def converse(services, caller: Caller, req: ChatRequest, upstream: Upstream, tally: Tally) -> AsyncIterator[bytes]:
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    offered = req.tool_names
    usage_chunk: dict | None = None
    usage_line, rounds = "", 0
    async with await upstream.client() as client:
        for round_no in range(MAX_ROUNDS):
            rounds += 1
            tools = definitions(offered) if round_no < MAX_ROUNDS - 1 else []
            calls: dict[int, dict] = {}
            text, reported, received = "", False, False
            try:
                async for line, chunk in stream_chunks(client, upstream, _payload(req, upstream, messages, tools)):
                    received = True
                    usage = chunk.get("usage")
                    if isinstance(usage, dict):
                        reported = True
                        tally.prompt += int(usage.get("prompt_tokens") or 0)
                        tally.completion += int(usage.get("completion_tokens") or 0)
                    choices = chunk.get("choices") or []
                    if not choices:
                        if isinstance(usage, dict):
                            usage_chunk, usage_line = chunk, line  # the totals go out once, at the end
                        continue
                    delta = choices[0].get("delta") or {}
                    finish = choices[0].get("finish_reason")
                    if delta.get("tool_calls"):
                        if tools:  # a round without tools (the last) ignores calls the model makes anyway
                            _collect(calls, delta["tool_calls"])
                        if delta.get("content"):
                            text += delta["content"]
                            kept = {k: v for k, v in delta.items() if k != "tool_calls"}
                            yield stream.event({**chunk, "choices": [{**choices[0], "delta": kept, "finish_reason": None}]})
                        if not finish:
                            continue
                    if calls and finish:
                        continue  # the round's tool_calls finish: the caller's completion goes on
                    if finish == "tool_calls":
                        # Calls the hub will not run (last round): the caller's completion ends here.
                        yield stream.event({**chunk, "choices": [{**choices[0], "delta": {}, "finish_reason": "stop"}]})
                        continue
                    text += delta.get("content") or ""
                    yield stream.raw(line)
            finally:
                # Counted even when the model broke off: what it did send was work done. A model that
                # refused before its first chunk did no work, and is not counted.
                if received and not reported:
                    tally.prompt += estimate_tokens(_text_of(messages))
                    tally.completion += estimate_tokens(text + "".join(c["arguments"] for c in calls.values()))
            if not calls:
                break
            ordered = [calls[i] for i in sorted(calls)]
            messages.append({"role": "assistant", "content": text or None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in ordered]})
            for c in ordered:
                if c["name"] in offered:
                    result = await run_tool(services, caller, c["name"], c["arguments"])
                else:
                    result = json.dumps({"error": "tool_not_allowed", "message": f"{c['name']} was not offered"})
                tally.tool += estimate_tokens(result)
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    if req.include_usage:
        total = {"prompt_tokens": tally.prompt, "completion_tokens": tally.completion,
                 "total_tokens": tally.prompt + tally.completion}
        if usage_chunk is not None and rounds == 1:
            yield stream.raw(usage_line)
        elif usage_chunk is not None:
            yield stream.event({**usage_chunk, "usage": {**usage_chunk["usage"], **total}})
        else:
            maker = stream.ChunkMaker(upstream.model or req.model or "default", int(services.clock.now().timestamp()))
            yield stream.event(maker.usage(tally.prompt, tally.completion))
    yield stream.DONE
