"""A Live Quick run on memory where every word fails, beside the same run on healthy memory.

    python bench/memtest_faults.py [--smoke] [--size 64M] [--faults data_line,address_line]

Each run goes through the agent's runner (device_client.memtest.runner.Run: trio checkpoints,
progress, confirmation, the result) flat out on trio's real clock, one after the other in this
process: healthy memory first, then each simulated fault (faults.py). Reported per run: wall time,
the errors counted, and where the extra time of a failing run went — counting errors (the engine's
sink, verdict.Findings.add) and the fault model acting out the faulty part (faults.FaultModel.corrupt,
work a real faulty part does for free). The aim (issue 19, item 5): a region where every word fails
costs not much more than healthy memory, so counting must cost per page, not per error; the result
stays within the frame limit (its JSON size is shown).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import OUT_DIR, command_line, facts_line, log, machine_facts, md_table, write_section  # noqa: E402

from device_client.memtest import parse_size  # noqa: E402


def timed_run(size: int, fault: str | None) -> dict:
    import trio

    from device_client.shared.clock import Clock
    from device_client.memtest import faults, verdict
    from device_client.memtest.hwsim import Hardware
    from device_client.memtest.plan import check
    from device_client.memtest.runner import Run

    spent = {"count": 0.0, "fault": 0.0}

    def clocked(fn, key):
        def wrapper(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[key] += time.perf_counter() - t0
        return wrapper

    add, corrupt = verdict.Findings.add, faults.FaultModel.corrupt
    verdict.Findings.add = clocked(add, "count")
    faults.FaultModel.corrupt = clocked(corrupt, "fault")

    async def progress(status: dict) -> None:
        pass

    async def main() -> dict:
        run = Run("bench", check({"mode": "live_quick"}), size=size, clock=Clock(), hw=Hardware(simulated=True),
                  checkpoint=lambda record: None, progress=progress, fault=fault, physical=False)
        t0 = time.perf_counter()
        result = await run.execute()
        return {"fault": fault or "none (healthy)", "wall": time.perf_counter() - t0, "outcome": result["outcome"],
                "verdict": result["verdict"], "errors": result["errorCount"],
                "pages": result["pageSummary"]["pagesWithErrors"], "resultBytes": len(json.dumps(result)),
                "count": spent["count"], "faultModel": spent["fault"]}

    try:
        return trio.run(main)
    finally:
        verdict.Findings.add, faults.FaultModel.corrupt = add, corrupt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="8 MiB; results go to bench/out/")
    p.add_argument("--size", default="64M", help="memory tested (default 64M: the demo's budget)")
    p.add_argument("--faults", default="data_line,address_line")
    p.add_argument("--no-write", action="store_true", help="do not rewrite bench/RESULTS.md")
    args = p.parse_args()
    size = parse_size("8M" if args.smoke else args.size)
    facts = machine_facts()
    runs = []
    for fault in [None, *[f for f in args.faults.split(",") if f]]:
        log(f"Live Quick on {size >> 20} MiB, fault {fault}")
        runs.append(timed_run(size, fault))
        log(f"  {runs[-1]['wall']:.2f} s, {runs[-1]['errors']:,} errors")
    healthy = runs[0]["wall"]
    rows = [[r["fault"], f"{r['wall']:.2f}", f"{r['wall'] / healthy:.2f}x", f"{r['errors']:,}", f"{r['pages']:,}",
             f"{r['count']:.2f}", f"{r['faultModel']:.2f}", f"{(r['wall'] - r['faultModel']) / healthy:.2f}x",
             f"{r['resultBytes']:,}"] for r in runs]
    worst = max(r["count"] / max(r["errors"], 1) * 1e9 for r in runs[1:]) if len(runs) > 1 else 0
    body = "\n".join([
        f"## Live Quick where every word fails, beside healthy memory ({size >> 20} MiB, bench/memtest_faults.py)", "",
        f"`{command_line()}`", "", facts_line(facts), "",
        "One Live Quick run each through the agent's runner (real clock, trio checkpoints, confirmation, the "
        "result), healthy memory first. *counting*: time in the engine's sink (verdict.Findings.add); *fault "
        "model*: time simulating the faulty part (faults.FaultModel.corrupt), which a real part does for free; "
        "*without the model*: the run's time less the model's, against healthy memory.", "",
        md_table(["memory", "wall (s)", "vs healthy", "errors counted", "pages with errors", "counting (s)",
                  "fault model (s)", "without the model vs healthy", "result JSON (bytes)"], rows), "",
        f"Counting costs at most {worst:.3f} ns per error counted: per page (one row sum of a chunk's mismatch "
        "mask), not per error.",
    ])
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"memtest_faults{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(runs, indent=1))
    print(body, flush=True)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('memtest_faults', body, smoke=args.smoke)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
