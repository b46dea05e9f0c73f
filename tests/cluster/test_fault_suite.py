"""The fault suite at smoke size (issue 38): a real 3-node cluster with a dozen agents under a rollout,
pings, an SSE stream and audit-tagged calls, while nats-server is stopped, the rollout's lease holder
is killed and PostgreSQL is frozen; the history must hold every invariant of checker.py. The full size
is bench/fault_suite.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from tests.cluster.faults.checker import check
from tests.cluster.faults.history import load
from tests.cluster.faults.run import Plan, run

pytestmark = pytest.mark.xdist_group("cluster-faults")  # one worker: it holds its own servers for 1-2 min

SMOKE = Plan(faults=("nats-stop", "node-kill", "pg-freeze"), fault_seconds=4.0, gap=3.0, settle=30.0)


async def test_the_cluster_holds_every_invariant_under_a_few_faults(tmp_path):
    with trio.fail_after(240):
        path = await run(SMOKE, tmp_path)
    records = load(path)
    assert any(r["kind"] == "rollout" for r in records) and any(r["kind"] == "call" and r["status"] == 200
                                                                 for r in records)
    violations = check(records)
    assert violations == [], "\n".join(f"{v.invariant}: {v.detail}" for v in violations) + f"\nhistory: {path}\n" + \
        "\n".join(log_lines(tmp_path / "logs", violations))


def log_lines(logs: Path, violations: list, most: int = 60) -> list[str]:
    """The nodes' log lines (WARNING and above, or naming an id a violation names) for the failure's
    message: CI keeps no file of the run, so what the nodes said goes with the assertion."""
    ids = set(re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                         " ".join(v.detail for v in violations)))
    lines = []
    for f in sorted(logs.glob("*")):
        for line in f.read_text(errors="replace").splitlines():
            if ("WARNING" in line or "ERROR" in line or any(i in line for i in ids)) and "-> 503 bus_unavailable" not in line:
                lines.append((line[:23], f"{f.stem}: {line[:300]}"))
    return [line for _, line in sorted(lines)][-most:]  # in time order across the nodes
