"""Command round trip REST → device actor → bus → WebSocket → device agent → reply → REST answer.

    python bench/command_rtt.py [--smoke] [--devices 1000] [--requests 2000] [--concurrency 1,16]

``fleethub serve`` in its own process with ``--devices`` devices (inserted in SQL, as in capacity.py)
connected from one load-generator process running ``device_client.agent.Agent``; the requests come
from a third process (bench/_httpload.py: trio + h11, keep-alive, closed loop at each concurrency).

The command measured is ``POST /v1/devices/{id}/ping`` when the hub has it (a real round trip with no
side effect; its answer also carries the hub's own ``roundTripMs`` from the actor's ask to the
device's reply). Without it the script falls back to ``POST /v1/devices/{id}/reboot``: each request
goes to a different device, every device is rebooted at most once per concurrency level, and the
next level waits until every device has reconnected.

For scale, the same client is also run against the bare Quart-Trio app's JSON route (no storage, no
device): the floor that the client, HTTP parsing and hypercorn alone cost on this machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (BENCH_DIR, OUT_DIR, PY, REPO, HubProcess, PySpy, Verdicts, Worker, command_line,  # noqa: E402
                     facts_line, free_port, http_json, hub_cpu_seconds, insert_devices, loadavg, log,
                     machine_facts, md_table, pg_statements, shm_tempdir, storage_crossings, wait_http,
                     write_section)


def load(cfg: dict, timeout: float) -> dict:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"httpload-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(cfg))
    try:
        r = subprocess.run([PY, str(BENCH_DIR / "_httpload.py"), str(path)], capture_output=True, text=True,
                           timeout=timeout, cwd=str(REPO))
    finally:
        path.unlink(missing_ok=True)
    if r.returncode != 0:
        raise RuntimeError(f"load generator failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def wait_all_connected(hub: HubProcess, n: int, timeout: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if int(hub.metrics().get("fleethub_connected_devices", 0)) >= n:
            return True
        time.sleep(0.25)
    return False


STATS_LAG = 11.0  # seconds: an idle PostgreSQL backend publishes its counters within 10 s (PGSTAT_IDLE_INTERVAL)


def measured_load(hub: HubProcess, cfg: dict, spy: PySpy | None, stats_lag: float = STATS_LAG) -> dict:
    """One closed-loop run, with what the hub spent on it: CPU seconds from its own /metrics (the
    process collector), its storage crossings (/metrics) and the statements PostgreSQL finished
    (pg_stat_database), each per measured request. Warm-up requests are inside the counts: the
    per-request figures divide by all requests sent, background work (write-behind flushes) included."""
    time.sleep(stats_lag)  # what came before is counted before, not here
    m0, st0 = hub.metrics(), pg_statements(hub.dsn())
    t0 = time.monotonic()
    r = load(cfg, timeout=600)
    wall = time.monotonic() - t0
    m1 = hub.metrics()
    time.sleep(stats_lag)
    st1 = pg_statements(hub.dsn())
    if spy:
        spy.stop()
        r["py_spy"] = spy.summary()
    sent = len(cfg["paths"])
    cpu = hub_cpu_seconds(m1) - hub_cpu_seconds(m0)
    r["hub_cpu_percent"] = round(100 * cpu / wall, 1)
    r["hub_cpu_ms_per_request"] = round(1000 * cpu / sent, 3)
    r["crossings_per_request"] = round((storage_crossings(m1) - storage_crossings(m0)) / sent, 3)
    r["statements_per_request"] = round((st1 - st0) / sent, 3)
    r["route_crossings"] = route_crossings(m0, m1)
    return r


def route_crossings(m0: dict, m1: dict) -> dict[str, float]:
    """Storage crossings per request made while handling each route, between two /metrics reads (the
    hub's ``fleethub_http_request_storage_crossings`` histogram): background work is not in these."""
    out = {}
    for key, total in m1.items():
        if key.startswith("fleethub_http_request_storage_crossings_sum{"):
            count_key = key.replace("_sum{", "_count{", 1)
            n = m1.get(count_key, 0) - m0.get(count_key, 0)
            if n > 0:
                route = key.split('route="', 1)[1].rsplit('"', 1)[0]
                out[route] = round((total - m0.get(key, 0)) / n, 3)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny size, < 30 s; results go to bench/out/")
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--requests", type=int, default=2000, help="measured requests per concurrency level")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--command", choices=["auto", "ping", "reboot"], default="auto")
    p.add_argument("--no-floor", action="store_true", help="skip the bare-app floor")
    p.add_argument("--py-spy", action="store_true", help="record the hub with py-spy at the highest concurrency")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="wait up to this long for the machine to be < 25%% busy before measuring")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.devices, args.requests, args.warmup = 20, 100, 20
    levels = [int(c) for c in args.concurrency.split(",")]
    facts = machine_facts(0 if args.smoke else args.quiet_wait)

    hub = HubProcess.start(heartbeat_interval=30.0, name="rtt-hub")
    sim_root = shm_tempdir("fleethub-bench-rtt-")
    worker = None
    results: dict = {"levels": []}
    try:
        hub.bootstrap()
        results["rate_limit"] = hub.extra.get("rate_limit")
        devices = insert_devices(hub.dsn(), hub.org_id, args.devices)
        ids = [d for d, _ in devices]
        worker = Worker("agent", "--hub", hub.base_url, "--data-dir", str(sim_root), name="rtt-sim")
        (sim_root / "devices.json").write_text(json.dumps(devices))
        worker.send({"cmd": "add", "devices_file": str(sim_root / "devices.json"), "timeout": 120})
        if not wait_all_connected(hub, args.devices, 150):
            raise RuntimeError("the devices did not all connect")
        worker.receive(180)
        log(f"{args.devices} devices connected to {hub.base_url}")
        time.sleep(1)

        command = args.command
        if command == "auto":
            status, body = http_json("POST", f"{hub.base_url}/v1/devices/{ids[0]}/ping", headers=hub.headers)
            command = "ping" if status == 200 else "reboot"
            log(f"POST /ping answered {status}: measuring {command}")
        results["command"] = command
        base_cfg = {"url": hub.base_url, "method": "POST", "headers": hub.headers, "timeout": 30}
        for c in levels:
            if command == "ping":
                n = args.warmup + args.requests
                paths = [f"/v1/devices/{ids[i % len(ids)]}/ping" for i in range(n)]
                cfg = {**base_cfg, "paths": paths, "concurrency": c, "warmup": args.warmup, "field": "roundTripMs"}
            else:
                n = min(args.requests, len(ids))  # each device once at this level
                paths = [f"/v1/devices/{ids[i]}/reboot" for i in range(n)]
                cfg = {**base_cfg, "paths": paths, "concurrency": c, "warmup": 0}
            spy = PySpy(hub.pid, OUT_DIR / "command_rtt-hub.pyspy.txt") if args.py_spy and c == max(levels) else None
            r = measured_load(hub, cfg, spy, 1.0 if args.smoke else STATS_LAG)
            r["concurrency"] = c
            results["levels"].append(r)
            log(f"c={c}: {json.dumps({k: v for k, v in r.items() if k != 'py_spy'})}")
            if command == "reboot" and not wait_all_connected(hub, args.devices, 120):
                raise RuntimeError("the devices did not all come back after the reboots")
            time.sleep(3 if command == "reboot" else 0.5)
        # The same client and size reading the device record: what a ping's CPU is compared with.
        c = max(levels)
        n = args.warmup + args.requests
        spy = PySpy(hub.pid, OUT_DIR / "command_rtt-get.pyspy.txt") if args.py_spy else None
        r = measured_load(hub, {**base_cfg, "method": "GET", "concurrency": c, "warmup": args.warmup,
                                "paths": [f"/v1/devices/{ids[i % len(ids)]}" for i in range(n)]}, spy,
                          1.0 if args.smoke else STATS_LAG)
        r["concurrency"] = c
        results["get"] = r
        log(f"GET c={c}: {json.dumps({k: v for k, v in r.items() if k != 'py_spy'})}")
    finally:
        if worker is not None:
            worker.stop()
        hub.stop()
        shutil.rmtree(sim_root, ignore_errors=True)

    if not args.no_floor:
        port = free_port()
        logf = (OUT_DIR / "rtt-bare.log").open("wb")
        app = subprocess.Popen([PY, str(BENCH_DIR / "_bare_app.py"), "--port", str(port)], stdout=logf,
                               stderr=subprocess.STDOUT, cwd=str(REPO))
        logf.close()
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", 30, app, "the bare app")
            results["floor"] = []
            for c in levels:
                n = args.warmup + args.requests
                r = load({"url": f"http://127.0.0.1:{port}", "method": "GET", "timeout": 30, "concurrency": c,
                          "warmup": args.warmup, "paths": [f"/v1/devices/{i}" for i in range(n)]}, timeout=300)
                r["concurrency"] = c
                results["floor"].append(r)
                log(f"floor c={c}: {json.dumps(r)}")
        finally:
            app.send_signal(2)
            try:
                app.wait(20)
            except subprocess.TimeoutExpired:
                app.kill()

    (OUT_DIR / f"command_rtt{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(results, indent=1))
    verdicts = Verdicts("command_rtt", smoke=args.smoke)
    for lv in results["levels"]:
        verdicts.at_most(f"p99 round trip at concurrency {lv['concurrency']}", lv["summary"].get("p99"), 50, " ms")
    top = max(results["levels"], key=lambda lv: lv["concurrency"], default=None)
    floor = {f["concurrency"]: f for f in results.get("floor", [])}
    if top is not None and results.get("command") == "ping":
        c = top["concurrency"]
        if c in floor and floor[c]["summary"].get("p99"):
            verdicts.at_most(f"ping p99 / bare route p99 at concurrency {c}",
                             round(top["summary"]["p99"] / floor[c]["summary"]["p99"], 2), 2, "x")
        if results.get("get") and results["get"]["hub_cpu_ms_per_request"]:
            verdicts.at_most("hub CPU per ping / per GET /v1/devices/{id}",
                             round(top["hub_cpu_ms_per_request"] / results["get"]["hub_cpu_ms_per_request"], 2), 1.5, "x")
        verdicts.at_most("storage crossings per ping (its handler, warm hub)",
                         top["route_crossings"].get("POST /v1/devices/<device_id>/ping", 0.0), 0, "")
    body = render(results, facts, args) + "\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('command_rtt', body, smoke=args.smoke)}")
    bad = [r for r in results["levels"] if r["error_count"] or set(r["statuses"]) - {"200", "202"}]
    return verdicts.exit_code(broken=bool(bad))


def render(r: dict, facts: dict, args) -> str:
    verb = "ping" if r["command"] == "ping" else "reboot"
    rows = []
    for lv in r["levels"]:
        s, f = lv["summary"], lv.get("field_summary", {})
        rows.append([lv["concurrency"], f"{lv['measured']:,}", json.dumps(lv["statuses"]), lv["error_count"],
                     s.get("p50", "—"), s.get("p90", "—"), s.get("p99", "—"), s.get("max", "—"), s.get("mean", "—"),
                     lv["rps"], f.get("p50", "—") if f.get("n") else "—", f.get("p99", "—") if f.get("n") else "—",
                     lv["hub_cpu_percent"]])
    out = ["## Command round trip (bench/command_rtt.py)", "", f"`{command_line()}`", "",
           f"{facts_line(facts)}; load average at end {loadavg()}", "",
           *([f"The bench organisation is lifted out of the hub's request rate limit: {r['rate_limit']}.", ""]
             if r.get("rate_limit") else []),
           f"`POST /v1/devices/{{id}}/{verb}` with {args.devices:,} devices connected (one load-generator "
           f"process of `Agent`s), requests spread round-robin over the devices, closed loop, keep-alive, "
           f"from a separate trio+h11 client process. Latency is the client's, request sent to answer read, ms.",
           ""]
    if verb == "reboot":
        out += ["The hub has no ping endpoint in this run: each device is rebooted at most once per level "
                "(the agent answers, then reconnects), and each level waits for all devices to reconnect.", ""]
    out += [md_table(["concurrency", "requests", "statuses", "errors", "p50 ms", "p90 ms", "p99 ms", "max ms",
                      "mean ms", "req/s", "hub roundTripMs p50", "hub roundTripMs p99", "hub CPU %"], rows)]
    cost = [[f"{verb} c={lv['concurrency']}", lv["hub_cpu_ms_per_request"], lv["crossings_per_request"],
             lv["route_crossings"].get(f"POST /v1/devices/<device_id>/{verb}", "—"), lv["statements_per_request"]]
            for lv in r["levels"]]
    if r.get("get"):
        g = r["get"]
        cost.append([f"GET /v1/devices/{{id}} c={g['concurrency']} ({g['rps']} req/s, p99 {g['summary'].get('p99')} ms)",
                     g["hub_cpu_ms_per_request"], g["crossings_per_request"],
                     g["route_crossings"].get("GET /v1/devices/<device_id>", "—"), g["statements_per_request"]])
    out += ["", "What each request cost the hub, divided over every request sent (warm-up included): CPU from its "
            "own /metrics; storage crossings in all (write-behind flushes and other background work included) and "
            "in the request's own handling (`fleethub_http_request_storage_crossings` by route); statements "
            "PostgreSQL finished (pg_stat_database, read 11 s before and after each run since an idle backend "
            "publishes its counters within 10 s; 1 s at smoke size, where that column lags; a pool reset query "
            "would count here too):", "",
            md_table(["run", "hub CPU ms/request", "crossings/request (all)", "crossings/request (handler)",
                      "statements/request"], cost)]
    if r.get("floor"):
        out += ["", "Floor: the same client against the bare Quart-Trio JSON route (no storage, no device):", "",
                md_table(["concurrency", "requests", "p50 ms", "p99 ms", "req/s"],
                         [[f["concurrency"], f"{f['measured']:,}", f["summary"].get("p50"), f["summary"].get("p99"),
                           f["rps"]] for f in r["floor"]])]
    worst = max((lv["summary"].get("p99", 0) for lv in r["levels"]), default=0)
    out += ["", f"**Worst p99: {worst} ms** (aim ≤ 50 ms)."]
    for label, lv in [(f"{verb} at concurrency {lv['concurrency']}", lv) for lv in r["levels"]] + \
            ([(f"GET /v1/devices/{{id}} at concurrency {r['get']['concurrency']}", r["get"])] if r.get("get") else []):
        if lv.get("py_spy"):
            out += ["", f"py-spy of the hub, {label} (share of samples, self time):", ""]
            out += [f"- {pct}% {frame}" for frame, pct in lv["py_spy"]["self"][:10]]
            if lv["py_spy"].get("ours"):
                out += ["", "and the hub's own functions in it (inclusive share):", ""]
                out += [f"- {pct}% {frame}" for frame, pct in lv["py_spy"]["ours"][:8]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
