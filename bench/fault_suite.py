"""The cluster under partial failure (issue 38): the fault suite at full size, with what each fault cost.

    python bench/fault_suite.py [--smoke] [--faults node-stop,nats-kill,...] [--fault-seconds 8]
                                [--rounds 1]

One run of tests/cluster/faults/ (a real nats-server, three ``fleethub serve`` nodes on one private
embedded PostgreSQL, twelve agents, back-to-back rollouts in batches of two, pings through every node,
an SSE stream, audit-tagged REST calls) with every fault of ``FAULTS`` in turn, ``--rounds`` times:
the history is judged by the checker (tests/cluster/faults/checker.py: the aim is no violation) and
each fault's cost is read from it (figures.py): pings and writes answered 2xx while it lasted, the
seconds until every node answers pings again, until the next device update succeeds, and the most
devices shown offline while linked. ``--smoke`` (CI): two short faults, bench/out/RESULTS.smoke.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import OUT_DIR, Verdicts, command_line, facts_line, machine_facts, md_table, write_section  # noqa: E402


def main() -> int:
    import trio

    from tests.cluster.faults.checker import check
    from tests.cluster.faults.figures import fault_costs
    from tests.cluster.faults.history import load
    from tests.cluster.faults.run import FAULTS, Plan, run

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--fault-seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    faults = ("nats-stop", "node-stop") if args.smoke else tuple(args.faults.split(",")) * args.rounds
    plan = Plan(faults=faults, fault_seconds=3.0 if args.smoke else args.fault_seconds,
                gap=3.0 if args.smoke else 6.0, settle=30.0 if args.smoke else 90.0)
    facts = machine_facts()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="fault-suite-", dir=OUT_DIR))
    started = time.monotonic()
    history = trio.run(run, plan, root)
    took = time.monotonic() - started
    for bulky in ("pg", "hub", "agents"):  # the history and the nodes' logs are what a reader needs
        shutil.rmtree(root / bulky, ignore_errors=True)
    records = load(history)
    violations = check(records)
    costs = fault_costs(records)
    for v in violations:
        print(f"violation {v.invariant}: {v.detail}", flush=True)
    rows = [[c["fault"], ",".join(c["targets"]), f"{c['seconds']:g}", f"{c['pings_ok']}/{c['pings']}",
             f"{c['writes_ok']}/{c['writes']}", c["pings_back_after"], c["next_success_after"],
             c["most_offline_while_linked"]] for c in costs]
    by_invariant: dict[str, int] = {}
    for v in violations:
        by_invariant[v.invariant] = by_invariant.get(v.invariant, 0) + 1
    rollouts = [r for r in records if r["kind"] == "rollout"]
    verdicts = Verdicts("fault_suite", smoke=args.smoke)
    verdicts.at_most("invariant violations (checker.py)", len(violations), 0)
    body = "\n".join([
        "## The cluster under partial failure (bench/fault_suite.py)", "",
        (f"`{command_line()}` — {facts_line(facts)}; {took:.0f} s, {len(rollouts)} rollouts "
         f"({sum(r['state'] == 'completed' for r in rollouts)} completed), "
         f"{sum(r['kind'] == 'call' for r in records)} calls; history kept in "
         f"`{history.relative_to(OUT_DIR.parent.parent)}`."), "",
        md_table(["fault", "target", "lasted (s)", "pings 2xx during", "writes 2xx during",
                  "every node pings again after (s)", "next device update succeeded after (s)",
                  "most devices offline while linked"], rows), "",
        "Checker: " + (", ".join(f"{k}: {n}" for k, n in sorted(by_invariant.items())) or "every invariant held") + ".",
        "", verdicts.markdown()])
    write_section("fault_suite", body, smoke=args.smoke)
    print(body, flush=True)
    return verdicts.exit_code()


if __name__ == "__main__":
    sys.exit(main())
