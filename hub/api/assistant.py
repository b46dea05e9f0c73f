"""The assistant: POST /v1/assistant/chat/completions, GET /v1/assistant/usage, and the published
system prompt, tools and caps at GET /v1/assistant/system-prompt (docs/assistant.md).

Only signed-in dashboard sessions may chat or read usage (403 for PATs, service accounts and tunnel
tokens); the cookie's CSRF rule applies as on every mutating call. Everything that can refuse a
request — shape, caps, budget, fair use, an upstream that fails before its first chunk — is decided
before the 200 and the event stream start.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from decimal import Decimal

import trio
from pydantic import BaseModel, Field
from quart import Blueprint, make_response, request
from quart_schema import document_request

from hub.api.common import errors, org, principal, services
from hub.api.validation import responds
from hub.assistant import budget as budgets
from hub.assistant import builtin, chat, schema, stream
from hub.assistant.tools import TOOL_DEFINITIONS, Caller
from hub.assistant.upstream import Upstream, UpstreamFailed
from hub.auth.routes import no_org, public, session_only
from hub.errors import ClientError, Forbidden, RateLimited, ServerError, Unavailable
from storage.assistant import AssistantStore
from storage.db import DatabaseUnavailable

log = logging.getLogger("fleethub.assistant")

# A hold outlives any answer (rounds x the upstream timeout); a hub that died mid-answer frees it then.
RESERVATION_TTL = dt.timedelta(minutes=15)
# Refused because the caller's own answers in progress hold the rest: worth asking again soon.
HELD_RETRY_AFTER = 5.0
SETTLE_TIMEOUT = 10

bp = Blueprint("assistant", __name__, url_prefix="/v1/assistant")

_PRODUCT_CLASS = {"assistant_prompt_tokens": "prompt", "assistant_completion_tokens": "completion",
                  "assistant_tool_tokens": "tool"}


class PublishedPrompt(BaseModel):
    system_prompt: str = Field(description="must be the first message of every chat request, unchanged")
    tools: list[dict] = Field(description="the allow-listed tools (OpenAI function definitions)")
    limits: dict = Field(description="size caps: body bytes, messages, characters, tools, completion tokens")


class PublishedEnvelope(BaseModel):
    data: PublishedPrompt


class UsageOut(BaseModel):
    decision: str = Field(description="allowed, soft_limit_reached or blocked")
    period: dict
    monthly_tokens: int
    soft_limit_tokens: int
    used_tokens: int
    tokens: dict = Field(description="period-to-date tokens by class: prompt, completion, tool")
    fair_use: dict = Field(description="daily_tokens, used_tokens, percent_used, resets_at")
    responder: str = Field(description="upstream (a configured model) or builtin")
    upstream_cost: dict | None = Field(None, description="staff only: cost per day from configured prices")


class UsageEnvelope(BaseModel):
    data: UsageOut


def _store(s) -> AssistantStore:
    return s.stores.assistant


def _caller() -> Caller:
    p = principal()
    if p.via != "session":
        raise Forbidden("the assistant answers signed-in dashboard sessions only", code="session_required")
    if not services().settings.assistant_enabled:
        raise Unavailable("the assistant is not enabled on this deployment", code="assistant_disabled")
    return Caller(org().org_id, p.user_id, org().is_admin, p.is_staff)


def _decide(s, snap: dict, now: dt.datetime) -> budgets.Decision:
    row = snap["budget"] or {}
    return budgets.decide(
        monthly_tokens=row.get("monthly_tokens", s.settings.assistant_monthly_tokens),
        soft_percent=row.get("soft_percent", budgets.DEFAULT_SOFT_PERCENT),
        used_tokens=int(sum(r["quantity"] for r in snap["by_day"])),
        user_daily_tokens=s.settings.assistant_daily_user_tokens, user_used_today=int(snap["user_today"]), now=now)


async def _state(s, caller: Caller) -> tuple[budgets.Decision, dict]:
    now = s.clock.now()
    snap = await _store(s).snapshot(caller.org_id, str(caller.user_id), now.date(), budgets.period)
    return _decide(s, snap, now), snap


async def _reserve(s, caller: Caller, req: schema.ChatRequest) -> uuid.UUID:
    """Hold this answer's tokens against the budget and the caller's allowance, or refuse (402/429)."""
    now = s.clock.now()
    reserve = budgets.reserve_for((schema.prompt_chars(req) + 3) // 4, req.completion_cap)
    seen: list = []

    def judge(snap: dict) -> int | None:
        decision = _decide(s, snap, now)
        refusal = budgets.admit(
            monthly_tokens=decision.monthly_tokens, used_tokens=decision.used_tokens, held_tokens=snap["held"],
            user_daily_tokens=decision.user_daily_tokens, user_used_today=decision.user_used_today,
            user_held_tokens=snap["user_held"], reserve=reserve)
        seen[:] = [decision, refusal]
        return None if refusal else reserve

    snap = await _store(s).reserve(caller.org_id, str(caller.user_id), now.date(), budgets.period, judge, now,
                                   RESERVATION_TTL)
    decision, refusal = seen
    if refusal == budgets.BUDGET:
        spent = decision.state == budgets.BLOCKED
        raise ClientError("the organisation's assistant budget for this period is spent" if spent else
                          "what is left of the organisation's assistant budget is held by answers in progress",
                          code="budget_exhausted", status=402)
    if refusal == budgets.FAIR_USE:
        if decision.fair_use_exhausted:
            raise RateLimited("your daily assistant allowance is used up; it resets at midnight UTC",
                              code="fair_use_exhausted", retry_after=decision.retry_after)
        raise RateLimited("what is left of your daily assistant allowance is held by your answers in progress",
                          code="fair_use_exhausted", retry_after=HELD_RETRY_AFTER)
    return snap["reservation"]


def _upstream(s) -> Upstream | None:
    st = s.settings
    if not st.assistant_upstream:
        return None
    return Upstream(st.assistant_upstream, st.assistant_key, st.assistant_model, st.assistant_timeout)


def _by_product(tally: chat.Tally) -> dict[str, int]:
    return {"assistant_prompt_tokens": tally.prompt, "assistant_completion_tokens": tally.completion,
            "assistant_tool_tokens": tally.tool}


async def _settle(s, caller: Caller, reservation: uuid.UUID, tally: chat.Tally) -> None:
    """Release the hold and count the answer, bounded and shielded: it runs also when the client left.
    Should PostgreSQL not take it, the tokens go through the meter (buffered, sent again) and the hold
    lapses at its expiry. A settle that timed out may have committed: it is logged, not counted again."""
    day = s.clock.now().date()
    with trio.move_on_after(SETTLE_TIMEOUT) as scope:
        scope.shield = True
        try:
            await _store(s).settle(reservation, caller.org_id, str(caller.user_id), day, _by_product(tally))
        except DatabaseUnavailable:
            log.warning("assistant: usage not settled (database unavailable); metered instead, the hold lapses")
            for product, n in _by_product(tally).items():
                s.meter.add(caller.org_id, product, n, day=day, key=str(caller.user_id))
    if scope.cancelled_caught:
        log.warning("assistant: settling an answer's usage timed out after %ss; its hold lapses", SETTLE_TIMEOUT)


@bp.get("/system-prompt")
@public
@no_org
@responds(PublishedEnvelope)
async def system_prompt():
    """Public: the prompt is not a secret, and a dashboard needs it before anything else."""
    return {"data": {"system_prompt": schema.SYSTEM_PROMPT, "tools": TOOL_DEFINITIONS, "limits": {
        "max_body_bytes": schema.MAX_BODY_BYTES, "max_messages": schema.MAX_MESSAGES,
        "max_characters": schema.MAX_CHARS, "max_tools": schema.MAX_TOOLS,
        "max_completion_tokens": schema.MAX_COMPLETION_TOKENS}}}


@bp.post("/chat/completions")
@session_only
@document_request(schema.ChatRequest)
@errors(400, 401, 402, 403, 413, 429, 502, 503)
async def chat_completions():
    """200 text/event-stream of chat.completion.chunk events, ending with ``data: [DONE]``."""
    s = services()
    caller = _caller()
    req = schema.parse(await request.get_data(as_text=False))
    reservation = await _reserve(s, caller, req)
    tally = chat.Tally()
    upstream = _upstream(s)
    body = (chat.converse(s, caller, req, upstream, tally) if upstream is not None
            else builtin.respond(s, caller, req, tally))
    try:
        first = await body.__anext__()
    except BaseException as exc:
        with trio.move_on_after(SETTLE_TIMEOUT) as cleanup:
            cleanup.shield = True
            await body.aclose()
        await _settle(s, caller, reservation, tally)
        if isinstance(exc, UpstreamFailed):
            raise ServerError(str(exc), code="upstream_failed", status=502) from None
        raise

    async def events():
        try:
            yield first
            try:
                async for piece in body:
                    yield piece
            except UpstreamFailed as exc:
                yield stream.error_event(str(exc))
        finally:
            # Also when the client went away mid-stream (cancelled here): close the model's stream,
            # bounded, and count what was done.
            try:
                with trio.move_on_after(5) as cleanup:
                    cleanup.shield = True
                    await body.aclose()
            finally:
                await _settle(s, caller, reservation, tally)

    response = await make_response(events(), 200, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                    "X-Accel-Buffering": "no"})
    response.timeout = None
    return response


@bp.get("/usage")
@session_only
@responds(UsageEnvelope)
@errors(401, 403, 503)
async def usage():
    s = services()
    caller = _caller()
    decision, snap = await _state(s, caller)
    by_class = {"prompt": 0, "completion": 0, "tool": 0}
    per_day: dict = {}
    for r in snap["by_day"]:
        cls = _PRODUCT_CLASS[r["product"]]
        by_class[cls] += int(r["quantity"])
        per_day.setdefault(r["day"], {"prompt": 0, "completion": 0, "tool": 0})[cls] += int(r["quantity"])
    start, end = snap["period"]
    now = s.clock.now()
    out = {"decision": decision.state, "period": {"start": start.isoformat(), "end": end.isoformat()},
           "monthly_tokens": decision.monthly_tokens, "soft_limit_tokens": decision.soft_limit_tokens,
           "used_tokens": decision.used_tokens, "tokens": by_class,
           "fair_use": {"daily_tokens": decision.user_daily_tokens, "used_tokens": decision.user_used_today,
                        "percent_used": decision.fair_use_percent,
                        "resets_at": (now.date() + dt.timedelta(days=1)).isoformat() + "T00:00:00Z"},
           "responder": "upstream" if _upstream(s) is not None else "builtin"}
    if caller.is_staff:
        out["upstream_cost"] = _cost(s, per_day, now.date())
    return {"data": out}


def _cost(s, per_day: dict, today) -> dict:
    """Prompt and completion tokens at the configured prices (tool results are already inside the
    model's prompt counts, so they are not priced twice). USD, per day of the period."""
    pp = Decimal(str(s.settings.assistant_price_prompt)) / 1_000_000
    pc = Decimal(str(s.settings.assistant_price_completion)) / 1_000_000
    days = [{"day": d.isoformat(), "cost": float(round(c["prompt"] * pp + c["completion"] * pc, 6))}
            for d, c in sorted(per_day.items())]
    today_cost = next((d["cost"] for d in days if d["day"] == today.isoformat()), 0.0)
    return {"currency": "USD", "price_per_million": {"prompt": s.settings.assistant_price_prompt,
                                                     "completion": s.settings.assistant_price_completion},
            "today": today_cost, "days": days}
