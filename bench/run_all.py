"""Run every benchmark one after the other; exit non-zero if one fails or, in a full run, misses an aim.

    python bench/run_all.py --smoke        # CI: tiny sizes, each script < 30 s, results in bench/out/
    python bench/run_all.py                # full sizes (~30 min), rewriting bench/RESULTS.md

Each script runs in its own process with a time limit; its output is streamed through. A script exits
0 (fine), 1 (broken: errors, a crash) or 2 (a full run that missed an aim; see _common.Verdicts) and
writes its aims to bench/out/verdicts/; this gathers them into the ``verdicts`` section of RESULTS.md
(a smoke run: bench/out/RESULTS.smoke.md). A smoke run's aims are informative: only a broken script
fails it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _common import VERDICTS_DIR, md_table, write_section  # noqa: E402

SCRIPTS = ["bridge.py", "http_ratio.py", "app_cost.py", "command_rtt.py", "mcp_rtt.py", "capacity.py", "auth_overhead.py", "delivery.py",
           "rollout.py", "tunnel.py", "tunnel_interactive.py", "tunnel_scp.py", "tunnel_product.py", "tunnel_ab.py", "dtls_records.py", "memtest_engine.py", "memtest_faults.py", "memtest_live.py", "storm.py",
           "soak.py", "console.py",
           "terminal_echo.py", "cluster.py", "presence_writes.py", "agent_footprint.py", "registry_proxy.py",
           "container_rollout.py", "audit_durability.py", "fault_suite.py", "events.py", "events_rollout.py"]


def verdict_file(name: str, smoke: bool) -> Path:
    return VERDICTS_DIR / f"{Path(name).stem}{'-smoke' if smoke else ''}.json"


def verdicts_section(ran: list[tuple[str, object, float]], smoke: bool) -> str:
    """One table of every aim of the scripts this run ran, with their verdicts."""
    rows = []
    for name, rc, _ in ran:
        f = verdict_file(name, smoke)
        doc = json.loads(f.read_text()) if f.exists() else {"aims": []}
        for a in doc["aims"]:
            sign = {"<=": "≤", ">=": "≥"}[a["op"]]
            got = "—" if a["measured"] is None else f"{a['measured']:g}{a['unit']}"
            rows.append([name, a["what"], f"{sign} {a['target']:g}{a['unit']}", got,
                         "met" if a["met"] else "**missed**"])
        if rc not in (0, 2):
            rows.append([name, "the run itself", "completes without errors", f"exit {rc}", "**failed**"])
        elif not doc["aims"]:
            rows.append([name, "(no numeric aim: informative)", "—", "—", "ran"])
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    kind = "smoke run (tiny sizes: informative, only a broken script fails it)" if smoke else "full run"
    return "\n".join(["## Aims and verdicts (bench/run_all.py)", "",
                      f"{date}, {kind}; each script's own section has the figures behind its verdicts.", "",
                      md_table(["script", "aim", "target", "measured", "verdict"], rows)]) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--only", help="comma-separated script names (default: all)")
    args = p.parse_args()
    scripts = args.only.split(",") if args.only else SCRIPTS
    limit = 90 if args.smoke else 1800
    ran: list[tuple[str, object, float]] = []
    for name in scripts:
        verdict_file(name, args.smoke).unlink(missing_ok=True)  # no stale verdict stands for this run
        cmd = [sys.executable, str(BENCH / name)] + (["--smoke"] if args.smoke else [])
        print(f"=== {' '.join(cmd)}", flush=True)
        t0 = time.monotonic()
        try:
            rc: object = subprocess.run(cmd, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        ran.append((name, rc, time.monotonic() - t0))
    path = write_section("verdicts", verdicts_section(ran, args.smoke), smoke=args.smoke)
    status = {0: "ok", 2: "ok, but an aim was missed"}
    print("\n".join(["=== summary", *(f"{name}: {status.get(rc, f'FAILED ({rc})')} in {took:.1f} s"
                                       for name, rc, took in ran)]), flush=True)
    broken = [name for name, rc, _ in ran if rc not in (0, 2)]
    missed = [name for name, rc, _ in ran if rc == 2]
    aims = [a for name, _, _ in ran if verdict_file(name, args.smoke).exists()
            for a in json.loads(verdict_file(name, args.smoke).read_text())["aims"]]
    missed_aims = sum(1 for a in aims if not a["met"])
    print(f"bench: {len(ran) - len(broken) - len(missed)} ok, {len(missed)} failed on a missed aim, "
          f"{len(broken)} broken; aims missed: {missed_aims} of {len(aims)}"
          f"{' (a smoke run: informative, not a failure)' if args.smoke else ''}; verdicts in {path}", flush=True)
    return 1 if broken or missed else 0


if __name__ == "__main__":
    sys.exit(main())
