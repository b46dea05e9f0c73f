"""What a chat-completion request may hold, checked strictly before anything reaches a model.

Order of checks: body size (413), shape (400: roles system/user/assistant/tool, text content only,
unknown fields), size caps (413), tool allow-list (400), the published system prompt first (400).
The caps and the prompt are published in docs/assistant.md and at GET /v1/assistant/system-prompt.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hub.api.validation import invalid, json_object
from hub.assistant.tools import TOOL_NAMES
from hub.errors import BadRequest, PayloadTooLarge

MAX_BODY_BYTES = 256 * 1024
MAX_MESSAGES = 50
MAX_CHARS = 48_000        # all text of all messages, tool-call arguments included
MAX_TOOLS = 8
MAX_COMPLETION_TOKENS = 4096

SYSTEM_PROMPT = (
    "You are the FleetHub dashboard assistant. You answer questions about the signed-in user's own "
    "fleet of edge devices: devices and their state, memory tests, rollouts and configurations. Use "
    "only the tools provided; they are read-only and see exactly what the user may see. When a tool "
    "says something is not found or not visible, say so and never guess device data. You cannot "
    "change anything: name the dashboard page or API call that does it instead.")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., max_length=64)
    arguments: str = ""


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(..., max_length=128)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=64)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(None, max_length=128)

    @model_validator(mode="after")
    def _roles(self) -> Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (text, or a list of text parts)")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("tool messages, and only they, carry tool_call_id")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., max_length=64)
    description: str | None = Field(None, max_length=2000)
    parameters: dict | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The request body: the chat-completions fields a dashboard needs, nothing else."""
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, max_length=200)
    messages: list[Message] = Field(..., min_length=1)
    stream: bool = True
    stream_options: StreamOptions | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_COMPLETION_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_COMPLETION_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    user: str | None = Field(None, max_length=200)

    @property
    def tool_names(self) -> list[str]:
        """The tools offered to the model: the named subset, or the whole allow-list when none named."""
        if self.tools is None:
            return list(TOOL_NAMES)
        return [t.function.name for t in self.tools]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def completion_cap(self) -> int:
        """The most completion tokens one model turn may write for this request."""
        return self.max_completion_tokens or self.max_tokens or MAX_COMPLETION_TOKENS

    def last_user_text(self) -> str:
        for m in reversed(self.messages):
            if m.role == "user":
                return m.text
        return ""


def prompt_chars(req: ChatRequest) -> int:
    """All message text of a request, tool-call arguments included (what MAX_CHARS bounds)."""
    return _chars(req)


def _chars(req: ChatRequest) -> int:
    total = 0
    for m in req.messages:
        total += len(m.text)
        for call in m.tool_calls or ():
            total += len(call.function.arguments)
    return total


def parse(raw: bytes) -> ChatRequest:
    if len(raw) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"the request is over {MAX_BODY_BYTES} bytes", code="request_too_large")
    if not raw:
        raise BadRequest("a JSON body is required", code="malformed_json")
    data = json_object(raw)  # the hub's one JSON body reader: depth, NaN, unstorable text
    try:
        req = ChatRequest.model_validate(data)
    except ValidationError as exc:
        raise invalid(exc) from None
    if len(req.messages) > MAX_MESSAGES:
        raise PayloadTooLarge(f"at most {MAX_MESSAGES} messages", code="too_many_messages")
    if _chars(req) > MAX_CHARS:
        raise PayloadTooLarge(f"at most {MAX_CHARS} characters of message text", code="too_many_characters")
    if req.tools is not None and len(req.tools) > MAX_TOOLS:
        raise PayloadTooLarge(f"at most {MAX_TOOLS} tools", code="too_many_tools")
    if not req.stream:
        raise BadRequest("stream must be true: the assistant answers as server-sent events", code="invalid_field")
    names = req.tool_names
    for name in names:
        if name not in TOOL_NAMES:
            raise BadRequest(f"tools: {name!r} is not an allow-listed tool (see GET /v1/assistant/system-prompt)",
                             code="tool_not_allowed")
    if len(set(names)) != len(names):
        raise BadRequest("tools: each tool may be named once", code="invalid_field")
    for m in req.messages:
        for call in m.tool_calls or ():
            if call.function.name not in TOOL_NAMES:
                raise BadRequest(f"messages: tool call to {call.function.name!r}, which is not allow-listed",
                                 code="tool_not_allowed")
    first = req.messages[0]
    if first.role != "system" or first.text.strip() != SYSTEM_PROMPT:
        raise BadRequest("the first message must be the dashboard system prompt, unchanged "
                         "(GET /v1/assistant/system-prompt)", code="system_prompt_required")
    return req
