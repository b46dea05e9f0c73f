"""What each fault cost, read from a run's history (pure, like checker.py): for docs/cluster.md's
failure table and bench/fault_suite.py."""

from __future__ import annotations

from typing import Any


def _ok(r: dict) -> bool:
    return r["status"] is not None and 200 <= r["status"] < 300


def fault_costs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per fault: how long it lasted; pings and writes answered 2xx while it lasted (ok, all);
    seconds from its end until every node answered a ping 2xx again; seconds from its end to the next
    device step that succeeded (None: no rollout was waiting); the most devices shown offline at once
    while their agent held a link, during the fault and the 15 s after."""
    records = sorted(records, key=lambda r: r["t"])
    nodes = sorted({r["node"] for r in records if r["kind"] == "call"})
    starts: dict[str, dict] = {}
    rows = []
    for f in records:
        if f["kind"] != "fault":
            continue
        if f["phase"] == "start":
            starts[f["fault"]] = f
            continue
        start, end = starts.pop(f["fault"])["t"], f["t"]
        during = [r for r in records if r["kind"] == "call" and start <= r["t"] <= end]
        pings = [r for r in during if r["path"].endswith("/ping")]
        writes = [r for r in during if r["path"] == "/v1/fleets"]
        back = []
        for node in nodes:
            first = next((r["t"] for r in records if r["kind"] == "call" and r["node"] == node
                          and r["path"].endswith("/ping") and r["t"] >= end and _ok(r)), None)
            back.append(None if first is None else first - end)
        step = next((r["t"] - end for r in records if r["kind"] == "step" and r["t"] >= end
                     and r["step"] == "succeeded"), None)
        offline: dict[float, int] = {}
        for r in records:
            if r["kind"] == "presence" and start <= r["t"] <= end + 15 and r["link"] and not r["online"]:
                offline[r["t"]] = offline.get(r["t"], 0) + 1
        rows.append({"fault": f["fault"], "targets": f["targets"], "seconds": round(end - start, 2),
                     "pings_ok": sum(map(_ok, pings)), "pings": len(pings),
                     "writes_ok": sum(map(_ok, writes)), "writes": len(writes),
                     "pings_back_after": None if None in back else round(max(back, default=0.0), 2),
                     "next_success_after": None if step is None else round(step, 2),
                     "most_offline_while_linked": max(offline.values(), default=0)})
    return rows
