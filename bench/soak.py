"""Soak: many connected devices and a steady mix of API calls for minutes; errors, hub memory, p99 over time.

    python bench/soak.py [--smoke] [--devices 10000] [--seconds 600] [--rate 40] [--sample 60]

``fleethub serve`` in its own process; ``--devices`` devices provisioned in SQL, all in one fleet, the
first ``--canary`` of them in a second, small fleet instead (the one rollouts go to); all connected from
``--sim-procs`` load-generator processes of real ``device_client.agent.Agent`` s (bench/_simworker.py,
tmpfs state dirs, ``ignore_owner``). Then for ``--seconds`` a REST client process (bench/storm.py
``--client``: trio + h11, keep-alive, ``--concurrency`` connections paced to a fixed ``--rate``) sends a
weighted mix: device reads and list pages, fleet list and reads, ``POST …/ping`` (a round trip to the
device), memory-test status reads (``GET …/memory-test``: asks the device), configuration creates and
device secret-file uploads (delivered to the device). Every ``--rollout-every`` seconds this script
starts a rollout of a new configuration to the canary fleet (``POST /v1/rollouts``) if the previous one
has ended.

Every ``--sample`` seconds the hub's VmRSS, its CPU and the connected-devices gauge are read from one
/metrics scrape (``process_resident_memory_bytes``, ``process_cpu_seconds_total``: the process
collector); REST p50/p99 and errors per interval come from the client's samples (client-side, request
sent → answer read). Memory growth: the slope of a least-squares line through the RSS samples of the
first third and of the last third of the run; growth "levels off" when the last third's slope is at
most half the first third's, or under 0.5 MiB/min.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    OUT_DIR,
    HubProcess,
    Verdicts,
    Worker,
    command_line,
    facts_line,
    hub_cpu_seconds,
    hub_rss_kib,
    insert_devices,
    loadavg,
    log,
    machine_facts,
    md_table,
    shm_tempdir,
    write_section,
)
from delivery import Api, Pg, code_version, expect
from storm import Client, gauge, latency

MIX = [
    {"kind": "device", "weight": 30, "method": "GET", "path": "/v1/devices/{device}"},
    {"kind": "list", "weight": 10, "method": "GET", "path": "/v1/devices?limit=50&page={page}"},
    {"kind": "fleets", "weight": 5, "method": "GET", "path": "/v1/fleets"},
    {"kind": "fleet", "weight": 5, "method": "GET", "path": "/v1/fleets/{fleet}"},
    {"kind": "ping", "weight": 20, "method": "POST", "path": "/v1/devices/{device}/ping"},
    {"kind": "memtest", "weight": 15, "method": "GET", "path": "/v1/devices/{device}/memory-test"},
    {"kind": "config", "weight": 5, "method": "POST", "path": "/v1/configurations",
     "body": {"name": "soak-{rand}", "spec": {}}},
    # {rand} is 12 hex digits: valid base64 for 9 bytes
    {"kind": "secret", "weight": 10, "method": "POST", "path": "/v1/devices/{device}/secret-files",
     "body": {"path": "/var/lib/fleethub/secrets/soak/token", "content_base64": "{rand}"}},
]
TERMINAL = ("completed", "failed", "cancelled", "paused")


def slope_mib_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, KiB) points, in MiB per minute."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return None
    return round(sum((p[0] - mx) * (p[1] - my) for p in points) / sxx * 60 / 1024, 2)


def start_workers(hub: HubProcess, devices: list, procs: int, root: Path, timeout: float) -> list[Worker]:
    os.environ["FLEETHUB_AGENT_IGNORE_OWNER"] = "1"  # the Workers inherit it: ignore_owner=None reads it
    workers = []
    for k in range(procs):
        part = devices[k::procs]
        path = root / f"devices-{k}.json"
        path.write_text(json.dumps(part))
        w = Worker("agent", "--hub", hub.base_url, "--data-dir", str(root), name=f"soak-sim{k}")
        workers.append(w)
        w.send({"cmd": "add", "devices_file": str(path), "timeout": timeout})
    return workers


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="100 devices for 20 s; results go to bench/out/")
    p.add_argument("--devices", type=int, default=10000)
    p.add_argument("--seconds", type=float, default=600.0, help="length of the soak")
    p.add_argument("--rate", type=float, default=40.0, help="REST requests per second")
    p.add_argument("--concurrency", type=int, default=8, help="REST client connections")
    p.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--canary", type=int, default=50, help="devices in the fleet the rollouts go to")
    p.add_argument("--rollout-every", type=float, default=60.0)
    p.add_argument("--sim-procs", type=int, default=0, help="load-generator processes (default: 1 per 5,000)")
    p.add_argument("--connect-timeout", type=float, default=600.0)
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="wait up to this long for the machine to be < 25%% busy before starting")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.devices, args.seconds, args.sample, args.canary, args.rollout_every = 100, 20.0, 5.0, 10, 8.0
        args.rate, args.connect_timeout = 20.0, 60.0
    procs = args.sim_procs or max(1, -(-args.devices // 5000))
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    r: dict = {"devices": args.devices, "seconds": args.seconds, "rate": args.rate, "concurrency": args.concurrency,
               "sim_procs": procs, "canary": args.canary, "code": code_version()}

    hub = HubProcess.start(heartbeat_interval=30.0, name="soak")
    root = shm_tempdir("fleethub-bench-soak-")
    workers: list[Worker] = []
    client = api = pg = None
    try:
        hub.bootstrap()
        r["rate_limit"] = hub.extra.get("rate_limit")
        api, pg = Api(hub.base_url, hub.headers), Pg(hub.dsn())
        fleets = [expect(*api.call("POST", "/v1/fleets", {"name": f"soak-{name}"}), (201,),
                         "POST /v1/fleets")["data"]["id"] for name in ("main", "canary")]
        devices = insert_devices(hub.dsn(), hub.org_id, args.devices, prefix="soak")
        ids = [d for d, _ in devices]
        # insert_devices leaves fleet_id NULL: set it before any agent connects (the hub caches no row yet)
        pg.execute("UPDATE devices SET fleet_id = $1 WHERE org_id = $2", uuid.UUID(fleets[0]), uuid.UUID(hub.org_id))
        pg.execute("UPDATE devices SET fleet_id = $1 WHERE id = ANY($2::uuid[])", uuid.UUID(fleets[1]),
                   [uuid.UUID(d) for d in ids[:args.canary]])
        r["rss_no_devices_kib"] = hub_rss_kib(hub.metrics())
        t0 = time.monotonic()
        workers = start_workers(hub, devices, procs, root, args.connect_timeout)
        while gauge(hub) < args.devices:
            if time.monotonic() - t0 > args.connect_timeout + 30:
                raise RuntimeError(f"the {args.devices} devices did not all connect; see {workers[0].log_path}")
            time.sleep(0.5)
        r["connect_seconds"] = round(time.monotonic() - t0, 1)
        for w in workers:
            w.receive(args.connect_timeout + 60)
        log(f"{args.devices} devices connected in {r['connect_seconds']} s")
        time.sleep(2.0)

        cfg = {"url": hub.base_url, "headers": hub.headers, "rate": args.rate, "concurrency": args.concurrency,
               "max_seconds": args.seconds + 60, "timeout": 30, "pages": max(1, -(-args.devices // 50)),
               "pools": {"device": ids, "fleet": fleets}, "mix": MIX}
        client = Client(cfg, "soak")
        time.sleep(2.0)  # the client process starts; not measured
        start = time.monotonic()
        ticks, rollouts, rollout_id, next_rollout = [], [], None, start + args.rollout_every / 2
        m = hub.metrics()
        last_cpu, last_t = hub_cpu_seconds(m), start
        ticks.append({"t": 0.0, "rss_kib": hub_rss_kib(m), "gauge": int(m.get("fleethub_connected_devices", 0)),
                      "hub_cpu_percent": None})
        k = 1
        while True:
            now = time.monotonic()
            if now >= start + k * args.sample:
                m = hub.metrics()  # one scrape: RSS, CPU and the gauge of the same moment
                c = hub_cpu_seconds(m)
                ticks.append({"t": round(now - start, 1), "rss_kib": hub_rss_kib(m),
                              "gauge": int(m.get("fleethub_connected_devices", 0)),
                              "hub_cpu_percent": round(100 * (c - last_cpu) / (now - last_t), 1)})
                last_cpu, last_t = c, now
                log(f"soak t={ticks[-1]['t']} s: {ticks[-1]}")
                k += 1
                if now - start >= args.seconds:
                    break
            if now >= next_rollout:
                next_rollout = now + args.rollout_every
                if rollout_id is not None:
                    state = expect(*api.call("GET", f"/v1/rollouts/{rollout_id}"), (200,),
                                   "GET /v1/rollouts/{id}")["data"]["state"]
                    rollouts[-1]["state"] = state
                    if state not in TERMINAL:
                        continue
                conf = expect(*api.call("POST", "/v1/configurations", {"name": f"soak-rollout-{len(rollouts)}",
                                                                      "spec": {}}), (201,), "POST /v1/configurations")
                status, body = api.call("POST", "/v1/rollouts", {"fleet_ids": [fleets[1]], "batch_size": 25,
                                                                 "configuration_id": conf["data"]["id"]})
                rollouts.append({"t": round(now - start, 1), "status": status, "state": body.get("data", {}).get("state"),
                                 "error": None if status == 201 else json.dumps(body)[:300]})
                rollout_id = body["data"]["id"] if status == 201 else None
            time.sleep(min(0.5, max(0.0, start + k * args.sample - time.monotonic())))
        end = time.monotonic()
        result = client.finish()
        client = None
        if rollout_id is not None:
            rollouts[-1]["state"] = expect(*api.call("GET", f"/v1/rollouts/{rollout_id}"), (200,),
                                           "GET /v1/rollouts/{id}")["data"]["state"]
        samples = result["samples"]
        for i, tick in enumerate(ticks[1:], 1):
            tick["rest"] = latency(samples, start + ticks[i - 1]["t"], start + tick["t"])
        r["ticks"], r["rollouts"] = ticks, rollouts
        r["by_kind"] = {m["kind"]: latency(samples, start, end, m["kind"]) for m in MIX}
        r["overall"] = latency(samples, start, end)
        r["errors"] = result["errors"]
        r["sim_stats"] = [w.request({"cmd": "stats"}, timeout=60) for w in workers]
        third = args.seconds / 3
        pts = [(t["t"], t["rss_kib"]) for t in ticks]
        r["slope_first"] = slope_mib_per_min([p_ for p_ in pts if p_[0] <= third])
        r["slope_last"] = slope_mib_per_min([p_ for p_ in pts if p_[0] >= 2 * third])
        f, last = r["slope_first"], r["slope_last"]
        r["levels_off"] = last is not None and (last < 0.5 or (f is not None and f > 0 and last <= f / 2))
    finally:
        if client is not None:
            client.finish()
        for w in workers:
            w.stop()
        if api is not None:
            api.close()
        if pg is not None:
            try:
                pg.close()
            except Exception as exc:  # noqa: BLE001 — the hub may already be gone; its stop() follows
                log(f"closing the database connection: {exc!r}")
        hub.stop()
        shutil.rmtree(root, ignore_errors=True)

    (OUT_DIR / f"soak{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(r, indent=1))
    verdicts = Verdicts("soak", smoke=args.smoke)
    verdicts.at_most("REST errors (non-2xx, transport) over the run", r["overall"]["errors"], 0)
    verdicts.at_least("fewest devices connected at a sample", min(t["gauge"] for t in r["ticks"]), args.devices)
    body = render(r, facts, args) + "\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('soak', body, smoke=args.smoke)}")
    ok = r["overall"]["errors"] == 0 and all(t["gauge"] >= args.devices for t in r["ticks"])
    return verdicts.exit_code(broken=not ok)  # as before: an error or a lost device fails either run


def render(r: dict, facts: dict, args) -> str:
    unit = "min" if args.sample >= 60 else "s"
    scale = 60 if unit == "min" else 1
    rows = [[f"{t['t'] / scale:g} {unit}", f"{t['rss_kib'] / 1024:.1f}", t["gauge"],
             t["hub_cpu_percent"] if t["hub_cpu_percent"] is not None else "—",
             t.get("rest", {}).get("n", "—"), t.get("rest", {}).get("errors", "—"),
             t.get("rest", {}).get("p50", "—"), t.get("rest", {}).get("p99", "—")] for t in r["ticks"]]
    kinds = [[k, v["n"], v["errors"], json.dumps(v["statuses"]), v["p50"], v["p99"], v["max"]]
             for k, v in r["by_kind"].items()]
    started = sum(1 for x in r["rollouts"] if x["status"] == 201)
    states: dict[str, int] = {}
    for x in r["rollouts"]:
        states[str(x["state"])] = states.get(str(x["state"]), 0) + 1
    rss0, rss1 = r["ticks"][0]["rss_kib"], r["ticks"][-1]["rss_kib"]
    o = r["overall"]
    out = ["## Soak (bench/soak.py)", "", f"`{command_line()}`", "",
           f"{facts_line(facts)}; load average at end {loadavg()}. Commit {r['code']}.", "",
           "Other sessions ran tests on this machine at the same time: the latency and CPU figures are noisy.", "",
           *([f"The bench organisation is lifted out of the hub's request rate limit: {r['rate_limit']}.", ""]
             if r.get("rate_limit") else []),
           (f"{r['devices']:,} devices connected from {r['sim_procs']} load-generator process(es) of `Agent`s "
           f"(connecting took {r['connect_seconds']} s), then {r['seconds']:g} s of a steady mix at "
           f"{r['rate']:g} requests/s over {r['concurrency']} keep-alive connections, and a rollout of a new "
           f"configuration to a {r['canary']}-device fleet every {args.rollout_every:g} s once the previous one "
           f"ended. Latency: client-side, ms, 2xx answers; errors are any non-2xx or transport error."), "",
           md_table(["t", "hub VmRSS MiB", "connected", "hub CPU %", "requests", "errors", "p50 ms", "p99 ms"], rows),
           "", md_table(["request", "n", "errors", "statuses", "p50 ms", "p99 ms", "max ms"], kinds), "",
           (f"- Requests {o['n']:,} ({o['n'] / r['seconds']:.1f}/s achieved: a connection waits for its answer, so "
            f"slow answers lower the rate), errors **{o['errors']}**; p50/p99 over the run {o['p50']}/{o['p99']} ms."),
           (f"- Hub VmRSS: {r['rss_no_devices_kib'] / 1024:.1f} MiB with no device, {rss0 / 1024:.1f} MiB at the "
           f"start (devices connected), {rss1 / 1024:.1f} MiB at the end ({(rss1 - rss0) / 1024:+.1f} MiB)."),
           (f"- RSS slope: first third {r['slope_first']} MiB/min, last third {r['slope_last']} MiB/min → "
           f"growth levels off: **{'yes' if r['levels_off'] else 'NO'}**."),
           f"- Rollouts started {started} (final states {json.dumps(states)}).",
           f"- Agents: {json.dumps([{k: v for k, v in s.items() if k != 'last_errors'} for s in r['sim_stats']])}."]
    if r["errors"]:
        out += ["", "First errors:", "", *[f"- `{e}`" for e in r["errors"][:5]]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
