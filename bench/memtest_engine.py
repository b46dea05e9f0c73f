"""Memory-test engine throughput per pattern, beside memtester on the same buffer size.

    python bench/memtest_engine.py [--smoke] [--size 256M] [--rounds 2] [--live-quick 512M] [--no-write]

Ours: device_client.memtest's engine (numpy over an anonymous mlocked mapping, 4 MiB chunks) runs
the memtester-equivalent suite (patterns.memtester_suite: memtester 4.x's tests and iteration counts,
without its 8- and 16-bit write tests) flat out, one pass, timing each pattern; then moving
inversions and the 5-minute idle decay's write and verify (its wait excluded).

memtester: ``memtester SIZE 1`` (``/usr/sbin/memtester``, Debian package memtester) on the same
size, unbuffered through ``stdbuf -o0``; each test's time is the time between the line-ends its
output prints (memtester flushes its progress). The aim (issue 6, Measure): our memtester-equivalent
loop in at most 1.25x memtester's time for the same tests. Without memtester (CI) only ours is
measured and the section says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (
    OUT_DIR,
    Verdicts,
    command_line,
    facts_line,
    log,
    machine_facts,
    md_table,
    write_section,
)

from device_client.memtest import parse_size
from device_client.memtest.engine import Engine, Region, drain
from device_client.memtest.patterns import Pair, memtester_suite
from device_client.memtest.verdict import Findings

AIM = 1.25
STEPS: dict[str, int] = {}  # steps per pattern, filled by run_ours
# memtester's test names → ours
NAMES = {"Stuck Address": "stuck_address", "Random Value": "random_value", "Compare XOR": "compare_xor",
         "Compare SUB": "compare_sub", "Compare MUL": "compare_mul", "Compare DIV": "compare_div",
         "Compare OR": "compare_or", "Compare AND": "compare_and",
         "Sequential Increment": "sequential_increment", "Solid Bits": "solid_bits",
         "Block Sequential": "block_sequential", "Checkerboard": "checkerboard", "Bit Spread": "bit_spread",
         "Bit Flip": "bit_flip", "Walking Ones": "walking_ones", "Walking Zeroes": "walking_zeros",
         "8-bit Writes": None, "16-bit Writes": None}


def run_ours(size: int) -> tuple[dict[str, float], dict[str, float], bool, str]:
    found = Findings()
    with Region(size) as region:
        engine = Engine(region, found.add)
        times: dict[str, float] = {}
        suite = memtester_suite(seed=12345)
        STEPS.update({p.name: len(p.steps) for p in suite})
        for pattern in suite:
            t0 = time.perf_counter()
            for step in pattern.steps:
                drain(engine.step(step))
            times[pattern.name] = time.perf_counter() - t0
        extra = {}
        t0 = time.perf_counter()
        for value in (Pair("moving_inversions", 0, 0), Pair("moving_inversions", 1, 0x5555_5555_5555_5555)):
            drain(engine.moving_inversion(value))
        extra["moving_inversions"] = time.perf_counter() - t0
        decay = Pair("idle_decay", 0, 0xFFFF_FFFF_FFFF_FFFF)
        t0 = time.perf_counter()
        drain(engine.write(decay))
        drain(engine.verify(decay))
        extra["idle_decay (write+verify, wait excluded)"] = time.perf_counter() - t0
        if found.count:
            raise SystemExit(f"the engine found {found.count} mismatches on this machine's memory: not a benchmark")
        return times, extra, region.locked, region.address_kind


def run_memtester(exe: str, size: int) -> tuple[dict[str, float], float]:
    cmd = [exe, f"{size >> 20}M", "1"]
    if shutil.which("stdbuf"):
        cmd = ["stdbuf", "-o0", *cmd]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    times: dict[str, float] = {}
    line, last = b"", None
    while True:
        byte = proc.stdout.read(1)
        if not byte:
            break
        if byte != b"\n":
            line += byte
            continue
        now = time.perf_counter()
        text = line.decode(errors="replace")
        name = text.split(":", 1)[0].strip()
        if text.startswith("Loop "):
            last = now
        elif last is not None and name in NAMES:
            if "FAILURE" in text:
                raise SystemExit(f"memtester reports a failure: {text!r}")
            times[name] = now - last
            last = now
        line = b""
    rc = proc.wait()
    total = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"memtester exited with {rc}")
    return times, total


def live_quick(size: int) -> dict:
    """One Live Quick run through the agent's runner (device_client.memtest.runner.Run) on the real
    clock: wall time, and the rate the device reports in its status (what the hub shows)."""
    import trio

    from device_client.shared.clock import Clock
    from device_client.memtest.hwsim import Hardware
    from device_client.memtest.plan import check
    from device_client.memtest.runner import Run

    rates: list[int] = []

    async def progress(status: dict) -> None:
        if status["rateBps"]:
            rates.append(status["rateBps"])

    async def main() -> dict:
        run = Run("bench", check({"mode": "live_quick"}), size=size, clock=Clock(),
                  hw=Hardware(simulated=False), checkpoint=lambda record: None, progress=progress)
        t0 = time.perf_counter()
        result = await run.execute()
        return {"wall": time.perf_counter() - t0, "outcome": result["outcome"], "bytes": result["totalBytes"],
                "tested": result["testedBytes"], "events": len(rates), "rate": rates[-1] if rates else 0}

    return trio.run(main)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="8 MiB, a few seconds; results go to bench/out/")
    p.add_argument("--size", default="256M", help="buffer size for both (default 256M)")
    p.add_argument("--rounds", type=int, default=1,
                   help="ABBA rounds: ours, memtester, memtester, ours, ...; per test the best time counts")
    p.add_argument("--live-quick", default=None, metavar="SIZE",
                   help="also time one Live Quick run of SIZE (e.g. 512M) through the agent's runner")
    p.add_argument("--memtester", default="/usr/sbin/memtester")
    p.add_argument("--no-write", action="store_true", help="do not rewrite bench/RESULTS.md")
    args = p.parse_args()
    size = parse_size("8M" if args.smoke else args.size)
    facts = machine_facts()
    exe = args.memtester if os.access(args.memtester, os.X_OK) else shutil.which("memtester")
    ours: dict[str, float] = {}
    theirs: dict[str, float] = {}
    extra: dict[str, float] = {}
    total = 0.0
    # ABBA: ours, memtester, memtester, ours, ... so a drifting machine load favours neither
    order = [who for i in range(args.rounds) for who in (("ours", "memtester") if i % 2 == 0 else
                                                         ("memtester", "ours"))]
    for who in order:
        if who == "ours":
            log(f"ours: memtester-equivalent suite on {size >> 20} MiB")
            times, more, locked, kind = run_ours(size)
            for d, new in ((ours, times), (extra, more)):
                for name, seconds in new.items():
                    d[name] = min(seconds, d.get(name, seconds))
        elif exe:
            log(f"memtester {size >> 20}M 1")
            times, whole = run_memtester(exe, size)
            total = min(whole, total or whole)
            for name, seconds in times.items():
                theirs[name] = min(seconds, theirs.get(name, seconds))
    quick = live_quick(parse_size(args.live_quick)) if args.live_quick else None
    rows, ours_sum, theirs_sum = [], 0.0, 0.0
    for mt_name, name in NAMES.items():
        if name is None:
            rows.append([mt_name, "not in our suite", f"{theirs[mt_name]:.3f}" if mt_name in theirs else "-", "-"])
            continue
        mine = ours[name]
        ours_sum += mine
        other = theirs.get(mt_name)
        if other is not None:
            theirs_sum += other
        gbs = STEPS[name] * size * 2 / mine / 1e9 if mine else 0
        rows.append([f"{mt_name} ({name})", f"{mine:.3f} ({gbs:.1f} GB/s)",
                     f"{other:.3f}" if other is not None else "-",
                     f"{mine / other:.2f}x" if other else "-"])
    ratio = ours_sum / theirs_sum if theirs_sum else None
    rows.append(["**memtester-equivalent total**", f"**{ours_sum:.2f}**",
                 f"**{theirs_sum:.2f}**" if theirs else "-",
                 f"**{ratio:.2f}x**" if ratio else "-"])
    for name, seconds in extra.items():
        rows.append([name, f"{seconds:.3f}", "-", "-"])
    verdict = ("memtester is not installed here: only ours was measured" if not exe else
               f"ours / memtester = {ratio:.2f}x for the same tests (aim <= {AIM}x): "
               + ("met" if ratio is not None and ratio <= AIM else "NOT met"))
    body = "\n".join([
        f"## Memory-test engine vs memtester ({size >> 20} MiB, one loop, best of {args.rounds})", "",
        f"`{command_line()}`", "", facts_line(facts), "",
        f"Ours: numpy over an anonymous mapping ({'mlocked' if locked else 'not locked'}, {kind} addresses "
        "known), 4 MiB chunks, memcmp for the compare (numpy locates a mismatch), run flat out (the agent "
        "runs the same sweeps with a trio checkpoint every other chunk). GB/s: steps x size x 2 "
        "(written once, read once per step) / time. memtester: per-test time from its flushed output"
        + (f"; whole run {total:.2f} s including its 8/16-bit write tests." if exe else "."), "",
        md_table(["test", "ours (s)", "memtester (s)", "ours/memtester"], rows), "",
        f"Result: {verdict}.",
    ] + ([] if quick is None else ["", (
        f"Live Quick through the agent's runner (real clock, trio checkpoints, progress events): "
        f"{quick['bytes'] >> 20} MiB, outcome {quick['outcome']}, wall {quick['wall']:.1f} s, "
        f"{quick['tested'] / 1e9:.1f} GB verified, {quick['events']} progress events, last reported "
        f"rateBps {quick['rate'] / 1e9:.2f} GB/s (the rate the hub shows for the run).")]))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"memtest_engine{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(
        {"size": size, "ours": ours, "extra": extra, "memtester": theirs, "memtesterTotal": total,
         "ratio": ratio, "liveQuick": quick}, indent=1))
    verdicts = Verdicts("memtest_engine", smoke=args.smoke)
    if exe:  # without memtester there is nothing to hold ours against (the section says so)
        verdicts.at_most("ours / memtester, same tests", None if ratio is None else round(ratio, 3), AIM, "x")
        body += "\n\n" + verdicts.markdown() + "\n"
    print(body, flush=True)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('memtest_engine', body, smoke=args.smoke)}")
    return verdicts.exit_code()


if __name__ == "__main__":
    sys.exit(main())
