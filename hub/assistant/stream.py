"""chat.completion.chunk events as server-sent events, in OpenAI's streaming format.

Each event is one ``data: <json>`` line and a blank line; a successful stream ends with
``data: [DONE]``. A failure after the stream started ends it with one ``data: {"error": {...}}``
event and no ``[DONE]`` (OpenAI's client libraries raise an APIError on it), never a hang.
"""

from __future__ import annotations

import json
import secrets

from hub.events import sse_frame

DONE = sse_frame("[DONE]")
KEEPALIVE = b": keepalive\n\n"


def event(data: dict) -> bytes:
    return sse_frame(json.dumps(data, separators=(",", ":")))


def raw(data_line: str) -> bytes:
    """An upstream chunk passed through as it came (its JSON text unchanged; a line break in it, which
    the upstream's own framing should never let through, becomes a new ``data:`` line, never a field)."""
    return sse_frame(data_line)


def error_event(message: str, code: str = "upstream_error") -> bytes:
    return event({"error": {"message": message, "type": "server_error", "code": code}})


class ChunkMaker:
    """Chunks of one completion the hub writes itself (the built-in responder, a usage total)."""

    def __init__(self, model: str, created: int) -> None:
        self.id = "chatcmpl-" + secrets.token_hex(12)
        self.model = model
        self.created = created  # seconds since the epoch, from the hub's Clock

    def _chunk(self, choices: list, **extra) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}

    def role(self) -> dict:
        return self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}])

    def content(self, text: str) -> dict:
        return self._chunk([{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}])

    def finish(self, reason: str = "stop") -> dict:
        return self._chunk([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}])

    def usage(self, prompt: int, completion: int) -> dict:
        return self._chunk([], usage={"prompt_tokens": prompt, "completion_tokens": completion,
                                      "total_tokens": prompt + completion})
