"""The fault suite's history checker (issue 38): pure, over the records of one run (history.py).

Records (each a dict with ``t``, seconds since the run began, and ``kind``):

- ``meta``: ``offline_bound`` (seconds a device may show offline while its link is up), ``grace``
  (seconds after a fault on a node during which its devices are not judged), ``expected_failures``
  (device ids the workload meant to fail; the suite's workload is healthy: none).
- ``fault``: ``fault``, ``targets`` (node names, or the service: "nats", "postgres"), ``phase``
  ("start" or "end").
- ``step``: ``rollout``, ``device``, ``step``, a rollout step as PostgreSQL held it when sampled.
- ``write``: ``rollout``, ``writer`` (the node whose connection wrote), ``owner`` (the lease's owner in
  that transaction, None when there was no lease): every rollout write, from a trigger.
- ``call``: ``request_id``, ``method``, ``path``, ``status`` (None when no answer came), ``node``.
- ``audit``: ``request_id``, an audit row found at the end.
- ``presence``: ``device``, ``link`` (the agent holds a welcomed link), ``node`` (where), ``online``
  (what the device's row said).
- ``rollout``: ``rollout``, ``state``, ``reason``, ``counts``: the state each rollout ended the run in.
- ``unsettled``: ``rollout``, ``lease``, ``devices``: for a rollout that did not end, its lease and each
  device not settled as PostgreSQL held them at the end (only said in a violation's message).

``check`` returns one Violation per broken invariant instance; an empty list is a run that held.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

ENDED = {"completed", "cancelled"}
NODE_FAULTS = {"node-stop", "node-kill", "two-nodes-kill", "clock-skew"}


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str


def check(records: list[dict[str, Any]]) -> list[Violation]:
    meta = next((r for r in records if r["kind"] == "meta"), {})
    records = sorted(records, key=lambda r: r["t"])
    return [*succeeded_at_most_once(records), *no_write_after_lease_lost(records),
            *acknowledged_calls_audited(records),
            *no_false_offline(records, meta.get("offline_bound", 10.0), meta.get("grace", 10.0)),
            *rollouts_end(records, set(meta.get("expected_failures", ())))]


def succeeded_at_most_once(records: list[dict]) -> list[Violation]:
    """A device's step enters ``succeeded`` at most once per rollout (and never leaves it)."""
    last: dict[tuple[str, str], str] = {}
    entered: dict[tuple[str, str], int] = defaultdict(int)
    out = []
    for r in records:
        if r["kind"] != "step":
            continue
        key = (r["rollout"], r["device"])
        if r["step"] == "succeeded" and last.get(key) != "succeeded":
            entered[key] += 1
            if entered[key] == 2:
                out.append(Violation("succeeded_at_most_once",
                                     f"device {key[1]} succeeded twice in rollout {key[0]} (t={r['t']:.2f})"))
        last[key] = r["step"]
    return out


def no_write_after_lease_lost(records: list[dict]) -> list[Violation]:
    """Every rollout write was made by the node that held the rollout's lease in that transaction."""
    return [Violation("no_write_after_lease_lost",
                      f"rollout {r['rollout']} written by {r['writer']} while the lease was "
                      f"{r['owner'] or 'held by nobody'} (t={r['t']:.2f})")
            for r in records if r["kind"] == "write" and r["writer"] != r["owner"]]


def acknowledged_calls_audited(records: list[dict]) -> list[Violation]:
    """Every call acknowledged (answered 2xx: done, as far as the caller knows) has its audit row with
    the request id it was sent with."""
    audited = {r["request_id"] for r in records if r["kind"] == "audit"}
    return [Violation("acknowledged_calls_audited",
                      f"{r['method']} {r['path']} answered {r['status']} by {r['node']} has no audit row "
                      f"(request {r['request_id']}, t={r['t']:.2f})")
            for r in records if r["kind"] == "call" and r["status"] is not None and 200 <= r["status"] < 300
            and r["request_id"] not in audited]


def _node_fault_windows(records: list[dict], grace: float) -> dict[str, list[tuple[float, float]]]:
    """Per node, the spans in which its devices are not judged: a fault on it, plus ``grace`` after."""
    started: dict[tuple[str, str], float] = {}
    windows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    end_of_run = records[-1]["t"] if records else 0.0
    for r in records:
        if r["kind"] != "fault" or r["fault"] not in NODE_FAULTS:
            continue
        for node in r["targets"]:
            if r["phase"] == "start":
                started[(r["fault"], node)] = r["t"]
            elif (r["fault"], node) in started:
                windows[node].append((started.pop((r["fault"], node)), r["t"] + grace))
    for (_, node), t in started.items():
        windows[node].append((t, end_of_run + grace))
    return windows


def no_false_offline(records: list[dict], bound: float, grace: float) -> list[Violation]:
    """No device shows offline for longer than ``bound`` while its agent holds a link to a node that is
    not itself under a fault (a frozen or killed node's devices are not reachable: not judged)."""
    windows = _node_fault_windows(records, grace)

    def excused(r: dict) -> bool:
        return any(a <= r["t"] <= b for a, b in windows.get(r["node"], ()))

    since: dict[str, float] = {}
    reported: set[tuple[str, float]] = set()
    out = []
    for r in records:
        if r["kind"] != "presence":
            continue
        device = r["device"]
        if r["link"] and not r["online"] and not excused(r):
            first = since.setdefault(device, r["t"])
            if r["t"] - first > bound and (device, first) not in reported:
                reported.add((device, first))
                out.append(Violation("no_false_offline",
                                     f"device {device} offline for more than {bound:g} s from t={first:.2f} "
                                     f"while linked to {r['node']}"))
        else:
            since.pop(device, None)
    return out


def rollouts_end(records: list[dict], expected_failures: set[str]) -> list[Violation]:
    """Each rollout ends (completed, cancelled) or is paused with a true reason: the operator paused it
    (an answered pause call), or devices the workload meant to fail failed. A device failed that the
    workload did not mean to fail is a false failure."""
    paused_by_call = {r["path"].split("/")[3] for r in records if r["kind"] == "call"
                      and r["method"] == "POST" and r["path"].endswith("/pause") and r["status"] == 200}
    failed: dict[str, set[str]] = defaultdict(set)
    for r in records:
        if r["kind"] == "step" and r["step"] == "failed":
            failed[r["rollout"]].add(r["device"])
    waiting = {r["rollout"]: r for r in records if r["kind"] == "unsettled"}
    out = []
    for r in records:
        if r["kind"] != "rollout":
            continue
        rid, state = r["rollout"], r["state"]
        false = failed[rid] - expected_failures
        if false:
            out.append(Violation("rollouts_end", f"rollout {rid}: healthy devices failed: {sorted(false)}"))
        if state in ENDED:
            continue
        if state == "paused" and (rid in paused_by_call or (failed[rid] and not false)):
            continue
        seen = waiting.get(rid, {})
        pings = {d["device_id"]: last_pings(records, d["device_id"]) for d in seen.get("devices") or ()}
        out.append(Violation("rollouts_end", f"rollout {rid} ended the run {state} "
                                             f"(reason: {r.get('reason')!r}), neither ended nor truly paused; "
                                             f"steps {r.get('counts')}, lease {seen.get('lease')}, "
                                             f"waiting on {seen.get('devices')}, their last pings {pings}"))
    return out


def last_pings(records: list[dict], device: str, each: int = 3) -> dict[str, list]:
    """The statuses of the last pings to ``device`` through each node (None: no answer)."""
    by_node: dict[str, list] = defaultdict(list)
    for r in records:
        if r["kind"] == "call" and r["path"] == f"/v1/devices/{device}/ping":
            by_node[r["node"]].append(r["status"])
    return {node: statuses[-each:] for node, statuses in sorted(by_node.items())}
