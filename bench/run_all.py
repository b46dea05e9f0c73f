"""Run every benchmark one after the other; exit non-zero if any fails.

    python bench/run_all.py --smoke        # CI: tiny sizes, each script < 30 s, results in bench/out/
    python bench/run_all.py                # full sizes (~30 min), rewriting bench/RESULTS.md

Each script runs in its own process with a time limit; its output is streamed through.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SCRIPTS = ["bridge.py", "http_ratio.py", "command_rtt.py", "capacity.py", "auth_overhead.py", "delivery.py",
           "rollout.py", "tunnel.py", "tunnel_interactive.py", "tunnel_scp.py", "memtest_engine.py", "memtest_faults.py", "memtest_live.py", "storm.py",
           "soak.py"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--only", help="comma-separated script names (default: all)")
    args = p.parse_args()
    scripts = args.only.split(",") if args.only else SCRIPTS
    limit = 90 if args.smoke else 1800
    failed = []
    summary = []
    for name in scripts:
        cmd = [sys.executable, str(BENCH / name)] + (["--smoke"] if args.smoke else [])
        print(f"=== {' '.join(cmd)}", flush=True)
        t0 = time.monotonic()
        try:
            rc = subprocess.run(cmd, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        took = time.monotonic() - t0
        summary.append(f"{name}: {'ok' if rc == 0 else f'FAILED ({rc})'} in {took:.1f} s")
        if rc != 0:
            failed.append(name)
    print("\n".join(["=== summary", *summary]), flush=True)
    n_ok = len(scripts) - len(failed)
    print(f"bench: {n_ok} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
