"""What a durable audit row costs the REST path: the answer waits for its row (the default) or the row
is written behind (``FLEETHUB_AUDIT_DURABLE=off``, the hub before issue 38 item 7), same run.

    python bench/audit_durability.py [--smoke] [--connections 32] [--duration 10] [--rounds 3]

Two ``fleethub serve`` processes, each with its embedded PostgreSQL, one per mode; wrk (or
bench/_httpload.py without it) sends ``GET /v1/devices/{id}`` with a PAT to each in turn, each round
starting with the other mode, after a 2 s warm-up, so both meet the same load on this shared machine.
The verdict is the median of the rounds' own durable/behind ratios of req/s. Each request's audit row is
one INSERT in the behind mode's batch a second; in the durable mode the requests waiting together share
one INSERT (a group commit), so PostgreSQL sees more, smaller statements: its CPU is shown beside the
hub's. ``answered unwritten`` is the durable hub's count of answers that left before their row was
written (0 unless PostgreSQL was unreachable or slower than the storage call bound).

On a shared machine the req/s of one run moves by half between two rounds with nothing changed, so the
CPU time each request cost the hub (and its PostgreSQL) is shown too: it does not depend on how busy
the rest of the machine was. The floor of the other design, a local journal fsynced before the answer,
is measured beside: 1 KiB appended and fsynced on the hub's data disk, 300 times.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
import os
import shutil
import sys
import time
from pathlib import Path
from statistics import fmean, median

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (OUT_DIR, HubProcess, Verdicts, command_line, cpu_seconds, facts_line, http_get,  # noqa: E402
                     http_json, loadavg, log, machine_facts, md_table, write_section)
from http_ratio import run_python_load, run_wrk  # noqa: E402

MODES = {"durable": "on", "behind": "off"}
AUDIT_ROWS = 'fleethub_write_behind_rows_total{kind="audit"}'
UNWRITTEN = "fleethub_audit_answered_unwritten_total"
CHOICE = ("The choice (issue 38 item 7): the answer waits for its row in PostgreSQL, the default; no local journal, "
          "whose fsync is the same kind of wait and whose rows would still have to reach PostgreSQL after it "
          "(docs/cluster.md, \"Audit durability: measured\").")


def pg_cpu_seconds(postmaster: int | None) -> float:
    """utime + stime of the PostgreSQL server: the postmaster and every process it started."""
    if postmaster is None:
        return 0.0
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        if int(entry.name) == postmaster or int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
            try:
                total += cpu_seconds(int(entry.name))
            except OSError:
                pass
    return total


def journal_fsync_ms(directory: Path, n: int = 300) -> dict[str, float]:
    """What a local audit journal would wait per answer (or per group of answers) at the least."""
    path = directory / "journal-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    took = []
    try:
        for _ in range(n):
            started = time.perf_counter()
            os.write(fd, b"x" * 1024)
            os.fsync(fd)
            took.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    took.sort()
    return {q: round(took[min(n - 1, int(n * f))], 3) for q, f in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny size, < 30 s; results go to bench/out/")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--python-load", action="store_true", help="use bench/_httpload.py even if wrk exists")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="wait up to this long for the machine to be < 25%% busy before measuring")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.duration, args.rounds = 2.0, 1
    use_wrk = shutil.which("wrk") is not None and not args.python_load
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    tool = (f"wrk -t1 -c{args.connections} -d{args.duration:g}s --latency" if use_wrk else
            f"Python load generator (bench/_httpload.py; wrk not installed), {args.connections} connections, "
            f"{args.duration:g} s")
    log(f"audit_durability with {tool}")

    hubs: dict[str, HubProcess] = {}
    paths: dict[str, str] = {}
    results: dict = {"tool": tool, **{mode: [] for mode in MODES}}
    def set_up(mode: str, setting: str) -> None:
        hub = hubs[mode] = HubProcess.start(env={"FLEETHUB_AUDIT_DURABLE": setting}, name=f"audit-{mode}")
        hub.bootstrap()
        status, created = http_json("POST", hub.base_url + "/v1/devices", {"name": "bench-device"}, hub.headers)
        if status != 201:
            raise RuntimeError(f"POST /v1/devices answered {status}: {created}")
        paths[mode] = f"/v1/devices/{created['data']['id']}"
        status, _ = http_get(hub.base_url + paths[mode], headers=hub.headers)
        if status != 200:
            raise RuntimeError(f"GET {paths[mode]} answered {status}")

    try:
        # both hubs (each its own embedded PostgreSQL: an initdb) come up at once, not one after the other:
        # the set-up is most of a smoke run's time, which run_all bounds at 90 s
        with ThreadPoolExecutor(len(MODES)) as pool:
            for started in [pool.submit(set_up, mode, setting) for mode, setting in MODES.items()]:
                started.result()

        def one(hub: HubProcess, path: str, d: float) -> dict:
            if use_wrk:
                return run_wrk(hub.base_url + path, hub.headers, 1, args.connections, d)
            return run_python_load(hub.base_url, path, hub.headers, args.connections, d)

        order = list(MODES)
        for rnd in range(args.rounds):
            for mode in order[rnd % 2:] + order[:rnd % 2]:
                hub = hubs[mode]
                one(hub, paths[mode], min(2.0, args.duration))  # warm-up
                before = hub.metrics()
                cpu0, pg0, t0 = cpu_seconds(hub.pid), pg_cpu_seconds(hub.pg_pid()), time.monotonic()
                r = one(hub, paths[mode], args.duration)
                elapsed = time.monotonic() - t0
                hub_cpu, pg_cpu = cpu_seconds(hub.pid) - cpu0, pg_cpu_seconds(hub.pg_pid()) - pg0
                r["hub_cpu_percent"] = round(100 * hub_cpu / elapsed, 1)
                r["pg_cpu_percent"] = round(100 * pg_cpu / elapsed, 1)
                r["hub_cpu_us_per_request"] = round(hub_cpu * 1e6 / r["requests"]) if r["requests"] else 0
                r["pg_cpu_us_per_request"] = round(pg_cpu * 1e6 / r["requests"]) if r["requests"] else 0
                time.sleep(1.5)  # the behind mode's last batch (1 s interval) is written before counting
                after = hub.metrics()
                r["audit_rows"] = int(after.get(AUDIT_ROWS, 0) - before.get(AUDIT_ROWS, 0))
                r["answered_unwritten"] = int(after.get(UNWRITTEN, 0) - before.get(UNWRITTEN, 0))
                r.pop("raw", None)
                results[mode].append(r)
                log(f"round {rnd + 1} {mode}: {json.dumps(r)}")
        results["journal_fsync_ms"] = journal_fsync_ms(hubs["durable"].data_dir)
        log(f"a local journal's floor, append + fsync of 1 KiB: {results['journal_fsync_ms']} ms")
    finally:
        for hub in hubs.values():
            hub.stop()

    results["round_ratios"] = [round(d["rps"] / b["rps"], 3) if b["rps"] else 0.0
                               for d, b in zip(results["durable"], results["behind"])]
    results["ratio"] = round(median(results["round_ratios"]), 3) if results["round_ratios"] else 0.0
    results["cpu_ratios"] = [round(d["hub_cpu_us_per_request"] / b["hub_cpu_us_per_request"], 3)
                             if b["hub_cpu_us_per_request"] else 0.0
                             for d, b in zip(results["durable"], results["behind"])]
    results["cpu_ratio"] = round(median(results["cpu_ratios"]), 3) if results["cpu_ratios"] else 0.0
    (OUT_DIR / f"audit_durability{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(results, indent=1))
    verdicts = Verdicts("audit_durability", smoke=args.smoke)
    verdicts.at_least("durable/behind req/s of GET /v1/devices/{id}", results["ratio"], 0.8)
    verdicts.at_most("durable/behind hub CPU per request", results["cpu_ratio"], 1.15)
    verdicts.at_most("answers sent before their audit row was written (durable mode)",
                     sum(r["answered_unwritten"] for r in results["durable"]), 0)
    body = render(results, facts, args) + "\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('audit_durability', body, smoke=args.smoke)}")
    bad = any(r["non2xx"] or r["socket_errors"] or not r["rps"] for mode in MODES for r in results[mode])
    return verdicts.exit_code(broken=bad)


def render(r: dict, facts: dict, args) -> str:
    rows = []
    for mode in MODES:
        for i, x in enumerate(r[mode]):
            rows.append([mode, i + 1, f"{x['rps']:,.0f}", f"{x['requests']:,}", x["non2xx"], x["socket_errors"],
                         x["p50"], x["p90"], x["p99"], x["hub_cpu_percent"], x["pg_cpu_percent"],
                         x["hub_cpu_us_per_request"], x["pg_cpu_us_per_request"],
                         f"{x['audit_rows']:,}", x["answered_unwritten"]])
    means = {mode: fmean(x["rps"] for x in r[mode]) for mode in MODES}
    return "\n".join([
        "## Audit durability: the answer waits for its row, or not (bench/audit_durability.py)", "",
        f"`{command_line()}`", "", f"{facts_line(facts)}; load average at end {loadavg()}", "",
        f"`GET /v1/devices/{{id}}` with a PAT against two `fleethub serve` processes (each its own embedded "
        f"PostgreSQL): `durable` (the default: the answer leaves once its audit row is written, rows waiting "
        f"together in one INSERT) and `behind` (`FLEETHUB_AUDIT_DURABLE=off`: written behind in a batch a "
        f"second, as before issue 38 item 7). Load: {r['tool']}, each round starting with the other mode, "
        f"each run after a 2 s warm-up. CPU % is of one core, over the run.", "",
        md_table(["mode", "round", "req/s", "requests", "non-2xx", "socket errors", "p50 ms", "p90 ms", "p99 ms",
                  "hub CPU %", "PostgreSQL CPU %", "hub CPU µs/request", "PostgreSQL CPU µs/request",
                  "audit rows written", "answered unwritten"], rows), "",
        f"durable/behind req/s, median of the rounds' own ratios: **{r['ratio']}** (rounds: {r['round_ratios']}; "
        f"ratio of means {round(means['durable'] / means['behind'], 3) if means['behind'] else 0.0}). Hub CPU per "
        f"request, durable/behind, median of the rounds' own ratios: **{r['cpu_ratio']}** (rounds: {r['cpu_ratios']}).",
        "", f"A local journal's floor on this disk, 1 KiB appended and fsynced (300 times): p50 "
        f"{r['journal_fsync_ms']['p50']} ms, p90 {r['journal_fsync_ms']['p90']} ms, p99 {r['journal_fsync_ms']['p99']} ms.",
        "", CHOICE, ""])


if __name__ == "__main__":
    sys.exit(main())
