"""The OpenAPI document: quart-schema's, plus the error answers every operation can give.

Views document their own successes and specific errors (``hub/api/common.errors``). Some answers
can come from any authenticated operation whatever its view does — 401 (credential), 403 (role or
organisation), 400 (missing organisation header, malformed input), 429 (rate limit), 500 and 503
(storage failure or outage) — and 404 from any operation with a path parameter, 413 from any with a
body. They are added here, with the error body the path uses (DESIGN.md section 7), so the document
is the whole contract and a fuzzer reading it finds no undocumented status.
"""

from __future__ import annotations

from typing import Any

from quart_schema.openapi import OpenAPIProvider

_GENERAL = {"type": "object", "required": ["error", "message"],
            "properties": {"error": {"type": "string"}, "message": {"type": "string"}, "details": {}}}
_MEMTEST = {"type": "object", "required": ["error", "message"],
            "properties": {"error": {"type": "string"}, "message": {"type": "string"},
                           "status": {"type": "object"}}}
_TUNNEL = {"type": "object", "required": ["error_code", "message"],
           "properties": {"error_code": {"type": "string"}, "message": {"type": "string"}}}

_DESCRIPTIONS = {400: "invalid request, missing organisation, malformed body", 401: "authentication required",
                 403: "access denied or missing role", 404: "not found", 413: "request body too large",
                 429: "rate limit exceeded (X-RateLimit-* headers, Retry-After)",
                 500: "failed to load or persist", 503: "the database or a feature is not available"}


def _error_ref(path: str) -> str:
    if "/memory-test" in path:
        return "#/components/schemas/MemoryTestError"
    if path.startswith("/v1/cli/tunnel/"):
        return "#/components/schemas/TunnelError"
    return "#/components/schemas/Error"


class FleethubOpenAPI(OpenAPIProvider):
    def schema(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        schema = super().schema(*args, **kwargs)
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.setdefault("Error", _GENERAL)
        schemas.setdefault("MemoryTestError", _MEMTEST)
        schemas.setdefault("TunnelError", _TUNNEL)
        chat = schema.get("paths", {}).get("/v1/assistant/chat/completions", {}).get("post")
        if chat is not None:
            chat.setdefault("responses", {})[200] = {
                "description": "chat.completion.chunk events (OpenAI streaming format), ending with data: [DONE]",
                "content": {"text/event-stream": {"schema": {"type": "string"}}}}
        metrics = schema.get("paths", {}).get("/metrics", {}).get("get")
        if metrics is not None:
            metrics.setdefault("responses", {})[200] = {
                "description": "Prometheus text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}}}
        for path, operations in schema.get("paths", {}).items():
            stream = operations.get("get") if path.endswith("/events") else None
            if stream is not None:
                stream.setdefault("responses", {})[200] = {
                    "description": "server-sent events: a snapshot first, then each change",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}}}
            for method, op in operations.items():
                if not isinstance(op, dict) or "responses" not in op:
                    continue
                public = op.get("security") == []
                statuses: list[int] = [] if public else [400, 401, 403, 429, 500, 503]
                if not public and "{" in path:
                    statuses.append(404)
                if not public and method in ("post", "put", "patch"):
                    statuses.append(413)
                if public:
                    statuses = [500, 503] + ([400, 429] if path.startswith("/v1/") else [])
                responses = op["responses"]
                # quart-schema keys responses by int until the document is serialised
                as_str = any(isinstance(k, str) for k in responses)
                for status in statuses:
                    responses.setdefault(str(status) if as_str else status, {
                        "description": _DESCRIPTIONS[status],
                        "content": {"application/json": {"schema": {"$ref": _error_ref(path)}}}})
        return schema
