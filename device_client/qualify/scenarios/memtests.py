"""The memory-test step (M1): a short Live Quick test, started, followed and acknowledged, with every
reply and event checked against the link schema (device_client/shared/verbs.py, served as
/v1/device/protocol.json) and the members the kit itself relies on (docs/memtests.md): a Status's
runId and phase, a Result's runId, outcome and verdict. The memtest verbs are optional: a device
whose hello says no online memory test and that answers them unknown_command passes, said so."""

from __future__ import annotations

import uuid
from typing import Any

import trio

from ...shared import protocol, verbs
from ..link import Conn, Received, short
from .run import Run

MAX_BYTES = 1 << 20  # a test of 1 MiB: seconds on any device

PLAN = {"mode": "live_quick", "impact": "running", "placement": "online", "quick": True, "passes": 1,
        "kernelPasses": 4, "bitFade": False, "holdOnFailure": False, "timeBudgetSeconds": 60,
        "maxBytes": MAX_BYTES}


def _event(kind: str):
    return lambda r: isinstance(r.frame, protocol.Event) and r.frame.kind == kind


def _members(what: str, value: Any, run_id: str, wanted: dict[str, tuple[str, ...] | None]) -> str | None:
    """Why ``value`` lacks a member the document names (None: it has them all)."""
    if not isinstance(value, dict):
        return f"{what} is {type(value).__name__} {short(value, 60)}, not an object"
    for name, allowed in wanted.items():
        if name not in value:
            return f"{what} has no {name}"
        if allowed is not None and value[name] not in allowed:
            return f"{what}.{name} is {short(value[name], 40)}, not one of {', '.join(allowed)}"
    if value.get("runId") != run_id:
        return f"{what}.runId is {short(value.get('runId'), 60)}, not the started run {run_id!r}"
    return None


STATUS = {"runId": None, "phase": protocol.MEMTEST_PHASES}
RESULT = {"runId": None, "outcome": protocol.MEMTEST_OUTCOMES, "verdict": protocol.MEMTEST_VERDICTS}


def _check_event(q: Run, got: Received, run_id: str | None = None) -> Any:
    """The event's payload if it matches the schema (and names the run), else None, failing M1."""
    kind, payload = got.frame.kind, got.frame.payload
    try:
        verbs.check_event(kind, payload)
    except verbs.Malformed as exc:
        q.check("M1", False, f"event {kind}: {exc} (payload {short(payload, 120)}); the link schema "
                             f"(/v1/device/protocol.json) and docs/memtests.md name its members and types")
        return None
    if run_id is not None:
        why = _members(kind, payload.get("result") if kind == "memtest.result" else payload, run_id,
                       RESULT if kind == "memtest.result" else STATUS)
        if why is not None:
            q.check("M1", False, f"{why} (docs/memtests.md, the wire format)")
            return None
    return payload


async def memory_test(q: Run, conn: Conn) -> Conn:
    online = bool(conn.hello and conn.hello.capabilities and conn.hello.capabilities.memoryTest.online)
    reply = await q.cmd(conn, "memtest.status", {})
    if reply is not None and not reply.ok and reply.error is not None and reply.error.code == "unknown_command":
        q.check("M1", not online, "memtest.status answered unknown_command and the hello says no online memory "
                                  "test: memory tests are optional, not checked" if not online else
                "the hello says capabilities.memoryTest.online, but memtest.status is answered unknown_command")
        return conn
    full = q.strict("M1", "memtest.status", reply)
    if full is None:
        return conn
    if not online:
        q.check("M1", True, "the hello says no online memory test: the start is not checked")
        return conn
    run_id = f"qualify-{uuid.uuid4().hex[:12]}"
    start_reply = await q.cmd(conn, "memtest.start", {"runId": run_id, "plan": PLAN})
    if q.strict("M1", "memtest.start", start_reply) is None:
        return conn
    # the members as the device sent them (the checked model holds them typed, not as JSON)
    status = (start_reply.payload or {}).get("status")
    why = _members("memtest.start's status", status, run_id, STATUS)
    if not q.check("M1", why is None, why or f"memtest.start answered status {short(status, 120)}"):
        return conn
    result = None
    with trio.move_on_after(q.o.memtest_timeout):
        while result is None:
            got = await conn.next(lambda r: _event("memtest.progress")(r) or _event("memtest.result")(r),
                                  q.o.memtest_timeout)
            if got is None:
                break
            payload = _check_event(q, got, run_id)
            if payload is None:
                return conn
            if got.frame.kind == "memtest.result":
                result = payload["result"]
    if result is None:
        q.check("M1", False, f"no memtest.result event for run {run_id} within {q.o.memtest_timeout:.0f} s "
                             f"of a Live Quick test of {MAX_BYTES} bytes")
        return conn
    progress = sum(1 for r in conn.frames if _event("memtest.progress")(r))
    q.check("M1", True, f"run {run_id}: {progress} progress events, result outcome {result['outcome']} "
                        f"verdict {result['verdict']}")
    for got in [r for r in conn.frames if _event("memtest.health")(r)]:
        _check_event(q, got)
    after_reply = await q.cmd(conn, "memtest.status", {})
    checked = q.strict("M1", "memtest.status", after_reply)
    after = (after_reply.payload or {}).get("status") if checked is not None else None
    if after is not None:
        why = _members("memtest.status's status", after, run_id, STATUS)
        q.check("M1", why is None, why or f"memtest.status after the run: phase {after['phase']}")
    acked = await q.cmd(conn, "memtest.ack", {"runIds": [run_id]})
    q.check("M1", acked is not None and acked.ok, f"memtest.ack: {short(acked.model_dump(exclude_none=True)) if acked else 'no reply'}")
    return conn
