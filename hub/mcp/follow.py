"""Following long work for a tool call that asked for progress (a ``progressToken`` in its ``_meta``).

A memory test or a rollout runs on after the REST call that starts or resumes it. When the client
asks for progress, the tool does not return at once: it listens to the same EventHub topic as the
work's SSE stream (a device's, a rollout's; opened before the REST call, so no event falls between),
sends ``notifications/progress`` as the events come, and returns when the work ends or
``FOLLOW_SECONDS`` pass. Without a token the tool returns at once, as before.

What is pure here (reading an event into a step) is apart from the waiting (hub/mcp/server.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.machines.memtest import TERMINAL_PHASES

# The longest a tool call waits for its work: a Live Quick test ends well within it; a longer run
# is then followed with memory_test_status (or get_rollout), as without a token.
FOLLOW_SECONDS = 600.0
# A status read when no event came for this long: an event can be lost (a subscriber dropped for a
# full buffer, a cluster node's bus cut off), and the work must not look unfinished for that.
POLL_SECONDS = 5.0
ROLLOUT_ENDED = frozenset({"completed", "failed", "cancelled", "paused"})
# The most a step of unfinished work reports: 1 is the end's own, and a later notification must be
# above an earlier one (its message would be lost if the last device's step had already said 1).
UNFINISHED_AT_MOST = 0.99


@dataclass(frozen=True)
class Step:
    progress: float | None  # 0-1, None when the event says nothing of how far the work is
    message: str
    ended: bool

    def __post_init__(self) -> None:
        if self.ended:
            object.__setattr__(self, "progress", 1.0)
        elif self.progress is not None:
            object.__setattr__(self, "progress", min(float(self.progress), UNFINISHED_AT_MOST))


def memory_test_step(event: dict[str, Any], run_id: str) -> Step | None:
    """The step a device event says of run ``run_id`` (None: the event is not about it)."""
    payload = event.get("payload")
    if event.get("kind") != "device.operation" or not isinstance(payload, dict):
        return None
    if payload.get("kind") != "memory_test" or payload.get("runId") != run_id:
        return None
    phase = payload.get("phase")
    parts = [f"memory test {phase}"]
    if payload.get("passes"):
        parts.append(f"pass {payload.get('pass')}/{payload.get('passes')}")
    if payload.get("pattern"):
        parts.append(str(payload["pattern"]))
    if payload.get("errors"):
        parts.append(f"{payload['errors']} errors")
    if payload.get("outcome"):
        parts.append(f"outcome {payload['outcome']}")
    ended = phase in TERMINAL_PHASES
    progress = payload.get("progress")
    if ended:
        progress = 1.0
    return Step(progress if isinstance(progress, (int, float)) else None, ", ".join(parts), ended)


def memory_test_status_step(status: dict[str, Any], run_id: str) -> Step | None:
    """The step of run ``run_id`` that ``GET /v1/devices/{id}/memory-test`` shows: ended when the run
    is in its history (or is the current run in a terminal phase)."""
    data = status.get("data") if isinstance(status, dict) else None
    if not isinstance(data, dict):
        return None
    current = data.get("status")
    if isinstance(current, dict) and current.get("runId") == run_id and current.get("phase") in TERMINAL_PHASES:
        return Step(1.0, f"memory test {current.get('phase')}", True)
    for run in data.get("history") or ():
        if isinstance(run, dict) and run.get("runId") == run_id:
            return Step(1.0, f"memory test {run.get('phase') or run.get('outcome') or 'ended'}", True)
    return None


def rollout_counts_step(counts: Any, state: str | None) -> Step:
    """How far a rollout is by its devices' counts (the events' and the REST body's ``counts``)."""
    counts = counts if isinstance(counts, dict) else {}
    total = sum(v for v in counts.values() if isinstance(v, int))
    done = sum(counts.get(k, 0) for k in ("succeeded", "failed", "ineligible") if isinstance(counts.get(k, 0), int))
    ended = state in ROLLOUT_ENDED
    progress = 1.0 if ended else (round(done / total, 4) if total else None)
    message = f"rollout {state or 'running'}: {done}/{total} devices done" if total else f"rollout {state or 'running'}"
    return Step(progress, message, ended)


def rollout_step(event: dict[str, Any], last_state: str | None) -> Step | None:
    payload = event.get("payload")
    if event.get("kind") not in ("rollout.state", "rollout.progress") or not isinstance(payload, dict):
        return None
    state = payload.get("state") if event.get("kind") == "rollout.state" else last_state
    return rollout_counts_step(payload.get("counts"), state)
