"""Device capacity of one hub process: how many simulated devices it holds, and what each one costs.

    python bench/capacity.py [--smoke] [--steps 1000,5000,10000,15000] [--interval 30]

1. ``fleethub serve`` in its own process (embedded PostgreSQL in a temp data dir, or
   FLEETHUB_DATABASE_URL), FLEETHUB_HEARTBEAT_INTERVAL=--interval; org, admin user and PAT through
   ``fleethub admin``; the devices inserted straight into the hub's ``devices`` table in one COPY
   (token ``dev_`` + 32 random bytes, its SHA-256 in ``token_hash``: what POST /v1/devices stores).
2. ``--sim-procs`` load-generator processes (bench/_simworker.py) run real ``device_client.agent.Agent``
   objects. The step sizes are added one after the other (1k, then 4k more, ...): at each step the time
   until the hub's ``fleethub_connected_devices`` reaches N, the hub's VmRSS, then a hold of
   ``--hold-intervals`` heartbeat intervals during which the gauge must never drop, no device may
   reconnect (``fleethub_device_connects_total`` unchanged), and the heartbeats must arrive (presence
   rows written behind: one per heartbeat). The first step that fails ends the ramp. Once every
   listed step held (the last is the aim, 15,000), the ramp goes on past it by ``--ramp-step`` devices
   until a step fails or the next would pass the machine's limit (loopback source ports, the file limit,
   available memory, ``--max-devices``): the largest N held is the hub's capacity here, not the aim.
3. All links are dropped and every device held reconnects at once (the hub-restart herd): the time.
4. For comparison, a bare Quart-Trio WebSocket echo app on hypercorn (bench/_bare_app.py) holds the same
   N links from the same kind of workers (one heartbeat-sized frame each interval): its VmRSS per link;
   then the same echo on plain ASGI in front of Quart (how the hub serves its device link), the floor.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (OUT_DIR, PY, BENCH_DIR, REPO, HubProcess, PySpy, Verdicts, Worker, command_line,  # noqa: E402
                     facts_line, free_port, http_get, hub_cpu_seconds, hub_open_fds, hub_rss_kib, insert_devices,
                     loadavg, log, machine_facts, md_table, rss_kib, shm_tempdir, sum_stats, wait_http,
                     write_section)

AIM_DEVICES = 15_000
AIM_KIB_PER_DEVICE = 48.8  # 50 KB
AIM_ECHO_RATIO = 1.15  # issue 22: at most 1.15x a bare WebSocket link's memory

PRESENCE = 'fleethub_write_behind_rows_total{kind="presence"}'
# /metrics walks every actor (Registry.statistics), so the gauge is polled gently: the reading costs the hub
POLL = 0.5


def merge_counts(dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def split(items: list, parts: int) -> list[list]:
    return [items[i::parts] for i in range(parts)]


def add_devices(workers: list[Worker], devices: list[tuple[str, str]], tmp: Path, step: int,
                timeout: float) -> None:
    for i, (w, chunk) in enumerate(zip(workers, split(devices, len(workers)))):
        f = tmp / f"step{step}-w{i}.json"
        f.write_text(json.dumps(chunk))
        w.send({"cmd": "add", "devices_file": str(f), "timeout": timeout})


class Probe:
    """/metrics readings with their latency; a reading that fails is counted, not fatal (the hub under a
    connect storm may answer late or drop the request: that is a figure too)."""

    def __init__(self, hub: HubProcess) -> None:
        self.hub = hub
        self.reset()

    def reset(self) -> None:
        self.max_seconds, self.failures, self.errors = 0.0, 0, {}

    def read(self) -> dict[str, float] | None:
        t = time.monotonic()
        try:
            m = self.hub.metrics()
        except (OSError, RuntimeError, http.client.HTTPException) as exc:
            self.failures += 1
            key = type(exc).__name__
            self.errors[key] = self.errors.get(key, 0) + 1
            m = None
        self.max_seconds = max(self.max_seconds, time.monotonic() - t)
        return m

    def figures(self) -> dict:
        return {"metrics_max_seconds": round(self.max_seconds, 2), "metrics_failures": self.failures,
                "metrics_errors": self.errors}


def read_retry(hub: HubProcess, tries: int = 10) -> dict[str, float]:
    probe = Probe(hub)
    for _ in range(tries):
        m = probe.read()
        if m is not None:
            return m
        time.sleep(1)
    raise RuntimeError(f"/metrics failed {tries} times: {probe.errors}")


def wait_connected(hub: HubProcess, target: int, timeout: float,
                   probe: Probe | None = None) -> tuple[float | None, int]:
    """Seconds until the hub's gauge reaches ``target`` (None if it never did) and the last reading."""
    probe = probe or Probe(hub)
    started = time.monotonic()
    last = -1
    while time.monotonic() - started < timeout:
        if not hub.alive():
            return None, last
        m = probe.read()
        if m is None:
            time.sleep(POLL)
            continue
        last = int(m.get("fleethub_connected_devices", -1))
        if last >= target:
            return time.monotonic() - started, last
        time.sleep(POLL)
    return None, last


def hold(hub: HubProcess, workers: list[Worker], n: int, seconds: float, interval: float) -> dict:
    m0 = read_retry(hub)
    w0 = sum_stats([w.request({"cmd": "stats"}) for w in workers])
    cpu0, t0 = hub_cpu_seconds(m0), time.monotonic()
    min_seen = n
    probe = Probe(hub)
    while time.monotonic() - t0 < seconds:
        if not hub.alive():
            return {"ok": False, "why": "the hub exited"}
        m = probe.read()
        if m is not None:
            min_seen = min(min_seen, int(m.get("fleethub_connected_devices", 0)))
        time.sleep(min(5.0, max(0.2, interval / 4)))
    m1 = read_retry(hub)
    elapsed = time.monotonic() - t0
    cpu = hub_cpu_seconds(m1) - cpu0
    w1 = sum_stats([w.request({"cmd": "stats"}) for w in workers])
    min_seen = min(min_seen, int(m1.get("fleethub_connected_devices", 0)))
    reconnects = int(m1["fleethub_device_connects_total"] - m0["fleethub_device_connects_total"])
    persisted = int(m1.get(PRESENCE, 0) - m0.get(PRESENCE, 0))
    expected = n * elapsed / interval
    sent = int(w1.get("heartbeats_sent", 0) - w0.get("heartbeats_sent", 0))
    ok = min_seen >= n and reconnects == 0 and persisted >= 0.9 * expected
    why = "" if ok else (f"min connected {min_seen} < {n}" if min_seen < n else
                         f"{reconnects} reconnects" if reconnects else
                         f"heartbeats persisted {persisted} < 90% of {expected:.0f}")
    return {"ok": ok, "why": why, "seconds": round(elapsed, 1), "min_connected": min_seen,
            "reconnects": reconnects, "heartbeats_persisted": persisted, "heartbeats_expected": round(expected),
            "heartbeats_sent": sent, "cpu_percent": round(100 * cpu / elapsed, 1),
            "hold_metrics_max_seconds": round(probe.max_seconds, 2), "hold_metrics_failures": probe.failures,
            "rss_held_kib": hub_rss_kib(m1), "hub_fds": hub_open_fds(m1)}


def machine_limit(n: int, added: int, kib_per_device: float, sim_procs: int, max_devices: int) -> str | None:
    """Why this machine cannot try ``n`` devices (``added`` more than now), or None if it can."""
    import resource

    if n > max_devices:
        return f"--max-devices {max_devices:,}"
    lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = hi - lo + 1  # every link is one loopback connection to the hub's one port
    if n > ports - 1000:
        return f"{n:,} links need more loopback source ports than ip_local_port_range has ({ports:,})"
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # the hub and the load generators inherit it
    if n + 500 > soft:
        return f"the hub's file limit (ulimit -n {soft:,}) is under {n:,} links + its own files"
    if n / sim_procs + 200 > soft:
        return f"{sim_procs} load generators cannot hold {n:,} links under ulimit -n {soft:,}"
    available = int(Path("/proc/meminfo").read_text().split("MemAvailable:")[1].split()[0])
    # the hub's share per device, as much again for the load generator's agents, 512 MiB kept free
    need = added * max(kib_per_device, AIM_KIB_PER_DEVICE) * 2 + 512 * 1024
    if need > available:
        return (f"{added:,} more devices need ~{need / 1024:,.0f} MiB, the machine has "
                f"{available / 1024:,.0f} MiB available")
    return None


def run_echo(n: int, procs: int, interval: float, hold_s: float, timeout: float, cc: int,
             path: str = "/ws", count: str = "/count") -> dict:
    port = free_port()
    logf = (OUT_DIR / "echo-app.log").open("wb")
    app = subprocess.Popen([PY, str(BENCH_DIR / "_bare_app.py"), "--port", str(port)], stdout=logf,
                           stderr=subprocess.STDOUT, cwd=str(REPO))
    logf.close()
    workers: list[Worker] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", 30, app, "the echo app")
        time.sleep(1)
        rss0 = rss_kib(app.pid)
        workers = [Worker("echo", "--url", f"ws://127.0.0.1:{port}{path}", "--interval", str(interval),
                          "--connect-concurrency", str(cc), name=f"echo{i}") for i in range(procs)]
        t0 = time.monotonic()
        for w, k in zip(workers, [len(c) for c in split(list(range(n)), procs)]):
            w.send({"cmd": "add", "n": k, "timeout": timeout})
        answers = [w.receive(timeout + 60) for w in workers]
        open_now = json.loads(http_get(f"http://127.0.0.1:{port}{count}", timeout=120)[1])["open"]
        seconds = time.monotonic() - t0
        rss1 = rss_kib(app.pid)
        time.sleep(hold_s)
        open_after = json.loads(http_get(f"http://127.0.0.1:{port}{count}", timeout=120)[1])["open"]
        rss2 = rss_kib(app.pid)
        return {"n": n, "open": open_now, "open_after_hold": open_after, "connect_seconds": round(seconds, 1),
                "rss_before_kib": rss0, "rss_after_kib": rss1, "rss_after_hold_kib": rss2,
                "kib_per_link": round((rss2 - rss0) / max(1, open_after), 1),
                "failures": sum(a.get("link_failures", 0) for a in answers)}
    finally:
        for w in workers:
            w.stop()
        app.send_signal(2)
        try:
            app.wait(20)
        except subprocess.TimeoutExpired:
            app.kill()
            app.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny size, < 30 s; results go to bench/out/")
    p.add_argument("--steps", default="1000,5000,10000,15000", help="device counts, in order")
    p.add_argument("--interval", type=float, default=30.0, help="FLEETHUB_HEARTBEAT_INTERVAL (s)")
    p.add_argument("--hold-intervals", type=float, default=2.0, help="hold at every step, in intervals")
    p.add_argument("--sim-procs", type=int, default=2, help="load-generator processes")
    p.add_argument("--connect-concurrency", type=int, default=200, help="handshakes in flight per process")
    p.add_argument("--connect-timeout", type=float, default=240.0, help="per step (s)")
    p.add_argument("--ramp-step", type=int, default=5000, help="devices added per step past the last of --steps")
    p.add_argument("--max-devices", type=int, default=100_000, help="the ramp stops here at the latest")
    p.add_argument("--no-ramp", action="store_true", help="stop after --steps")
    p.add_argument("--no-herd", action="store_true", help="skip the all-at-once reconnect")
    p.add_argument("--no-echo", action="store_true", help="skip the bare echo comparison")
    p.add_argument("--py-spy", action="store_true", help="record the hub with py-spy during the last step")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="wait up to this long for the machine to be < 25%% busy before measuring")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args()
    if args.smoke:
        args.steps, args.interval, args.sim_procs, args.connect_timeout = "20,60", 1.0, 1, 20.0
        args.ramp_step, args.max_devices = 20, 80  # the ramp past the last step, kept tiny: one step, 80
    steps = [int(s) for s in args.steps.split(",")]
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    log(f"capacity: steps {steps}, heartbeat interval {args.interval}s, {args.sim_procs} sim processes")

    hub = HubProcess.start(heartbeat_interval=args.interval, name="capacity-hub")
    sim_root = shm_tempdir("fleethub-bench-sim-")
    workers: list[Worker] = []
    results = {"steps": []}
    max_held = 0
    try:
        hub.bootstrap()
        t = time.monotonic()
        devices = insert_devices(hub.dsn(), hub.org_id, max(steps))
        log(f"inserted {len(devices)} devices in SQL in {time.monotonic() - t:.1f}s")
        workers = [Worker("agent", "--hub", hub.base_url, "--data-dir", str(sim_root / f"w{i}"),
                          "--connect-concurrency", str(args.connect_concurrency), name=f"capacity-sim{i}")
                   for i in range(args.sim_procs)]
        time.sleep(2)
        rss0 = hub_rss_kib(read_retry(hub))  # the same source as the held figures (the process collector)
        results["rss_baseline_kib"] = rss0
        log(f"hub pid {hub.pid}, baseline VmRSS {rss0 / 1024:.1f} MiB")
        current = 0
        spy = None
        for n in sizes(steps, 0 if args.no_ramp else args.ramp_step):
            if n > steps[-1]:  # past the aim: only as far as this machine can go
                held = [s for s in results["steps"] if s["ok"]]
                limit = machine_limit(n, n - current, held[-1].get("kib_per_device", 0) if held else 0,
                                      args.sim_procs, args.max_devices)
                if limit:
                    results["ramp_stop"] = f"the machine's limit before {n:,}: {limit}"
                    break
                if n > len(devices):
                    devices += insert_devices(hub.dsn(), hub.org_id, n - len(devices), prefix=f"bench-r{n}")
            if args.py_spy and n == steps[-1]:
                spy = PySpy(hub.pid, OUT_DIR / "capacity-hub.pyspy.txt")
            add_devices(workers, devices[current:n], sim_root, n, args.connect_timeout)
            probe = Probe(hub)
            seconds, seen = wait_connected(hub, n, args.connect_timeout, probe)
            answers = [w.receive(args.connect_timeout + 60) for w in workers]
            if spy is not None:
                spy.stop()
                results["py_spy_connect"] = spy.summary()
            added = n - current
            current = n
            rss1 = rss_kib(hub.pid)
            step = {"n": n, "connect_seconds": round(seconds, 2) if seconds else None, "seen": seen,
                    "rate": round(added / seconds) if seconds else None, "rss_connected_kib": rss1,
                    "sim_link_failures": sum(a.get("link_failures", 0) for a in answers),
                    "sim_last_errors": merge_counts(a.get("last_errors", {}) for a in answers),
                    **probe.figures()}
            if seconds is None:
                step.update(ok=False, why=f"only {seen} of {n} connected within {args.connect_timeout}s")
            else:
                log(f"{n} connected (+{added} in {seconds:.1f}s, {added / seconds:.0f}/s), "
                    f"VmRSS {rss1 / 1024:.1f} MiB; holding {args.hold_intervals} intervals")
                step.update(hold(hub, workers, n, args.hold_intervals * args.interval, args.interval))
                if "rss_held_kib" in step:
                    step["kib_per_device"] = round((step["rss_held_kib"] - rss0) / n, 1)
            results["steps"].append(step)
            save(results, args)
            log(f"step {n}: {json.dumps(step)}")
            if not step["ok"]:
                results["ramp_stop"] = f"the step to {n:,} failed: {step.get('why', '')}"
                break
            max_held = n
        else:
            results["ramp_stop"] = "--no-ramp: the listed steps only"
        results["max_held"] = max_held

        if not args.no_herd and max_held:
            for w in workers:
                w.stop()
            workers = []
            if not wait_connected_zero(hub, 120):
                log("the hub did not notice every link drop within 120 s")
            time.sleep(1)
            workers = [Worker("agent", "--hub", hub.base_url, "--data-dir", str(sim_root / f"w{i}"),
                              "--connect-concurrency", str(args.connect_concurrency), name=f"capacity-herd{i}")
                       for i in range(args.sim_procs)]
            time.sleep(1)
            add_devices(workers, devices[:max_held], sim_root, 0, args.connect_timeout)
            seconds, seen = wait_connected(hub, max_held, args.connect_timeout)
            for w in workers:
                w.receive(args.connect_timeout + 60)
            results["herd"] = {"n": max_held, "seconds": round(seconds, 2) if seconds else None, "seen": seen,
                               "rss_kib": rss_kib(hub.pid)}
            save(results, args)
            log(f"herd: {json.dumps(results['herd'])}")
    finally:
        for w in workers:
            w.stop()
        hub.stop()
        shutil.rmtree(sim_root, ignore_errors=True)

    echo_n = max_held or steps[0]
    # through Quart (the comparison issue 22 names), then on plain ASGI as the hub serves its device
    # link (the transport's own floor)
    for key, path, count in (() if args.no_echo else (("echo", "/ws", "/count"), ("echo_raw", "/ws-raw", "/count-raw"))):
        log(f"bare echo app, {path}: {echo_n} links")
        try:
            results[key] = run_echo(echo_n, args.sim_procs, args.interval,
                                    args.hold_intervals * args.interval if args.smoke else args.interval,
                                    args.connect_timeout, args.connect_concurrency, path, count)
        except Exception as exc:  # noqa: BLE001 — the hub's figures stand without the comparison
            results[key] = {"n": echo_n, "error": repr(exc)}
        log(f"{key}: {json.dumps(results[key])}")

    save(results, args)
    verdicts = Verdicts("capacity", smoke=args.smoke)
    verdicts.at_least("largest N held by one hub process", max_held, AIM_DEVICES)
    # memory per device where the aim is (or at the largest N held short of it)
    at_aim = [s for s in results["steps"] if s["ok"] and s["n"] <= AIM_DEVICES]
    verdicts.at_most("hub memory per connected device", at_aim[-1]["kib_per_device"] if at_aim else None,
                     AIM_KIB_PER_DEVICE, " KiB")
    # issue 22: the hub's memory per device against the bare Quart-Trio echo's per link, in the same run
    echo = results.get("echo") or {}
    if not args.no_echo:
        verdicts.at_most("hub / bare echo memory per link (same run)",
                         round(at_aim[-1]["kib_per_device"] / echo["kib_per_link"], 2)
                         if at_aim and echo.get("kib_per_link") else None, AIM_ECHO_RATIO, "x")
    body = render(results, facts, args) + "\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write or args.smoke:
        path = write_section("capacity", body, smoke=args.smoke)
        log(f"wrote {path}")
    # broken: the listed steps (small in a smoke run) did not all hold, or the comparison failed
    held_listed = max_held >= steps[-1]
    echo_failed = any(results.get(key, {}).get("error") for key in ("echo", "echo_raw"))
    return verdicts.exit_code(broken=args.smoke and not (held_listed and not echo_failed))


def sizes(steps: list[int], ramp_step: int):
    """The listed steps, then on past the last by ``ramp_step`` (the caller stops at a limit)."""
    yield from steps
    n = steps[-1]
    while ramp_step > 0:
        n += ramp_step
        yield n


def save(results: dict, args) -> None:
    (OUT_DIR / f"capacity{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(results, indent=1))


def wait_connected_zero(hub: HubProcess, timeout: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        m = Probe(hub).read()
        if m is not None and int(m.get("fleethub_connected_devices", 1)) == 0:
            return True
        time.sleep(0.5)
    return False


def render(r: dict, facts: dict, args) -> str:
    mib = lambda kib: f"{kib / 1024:.1f}"  # noqa: E731
    rows = []
    for s in r["steps"]:
        rows.append([
            f"{s['n']:,}", s.get("connect_seconds") or "—", s.get("rate") or "—",
            mib(s["rss_connected_kib"]), mib(s["rss_held_kib"]) if "rss_held_kib" in s else "—",
            s.get("kib_per_device", "—"), s.get("seconds", "—"),
            f"{s['min_connected']:,}" if "min_connected" in s else s.get("seen", "—"),
            s.get("reconnects", "—"),
            f"{s['heartbeats_persisted']:,} / {s['heartbeats_expected']:,}" if "heartbeats_persisted" in s else "—",
            s.get("cpu_percent", "—"), s.get("sim_link_failures", "—"),
            f"{s.get('metrics_max_seconds', '—')} / {s.get('metrics_failures', '—')}",
            "ok" if s["ok"] else f"**failed**: {s.get('why', '')}"])
    out = [
        "## Device capacity (bench/capacity.py)", "",
        f"`{command_line()}`", "",
        f"{facts_line(facts)}; load average at end {loadavg()}", "",
        f"One `fleethub serve` process, heartbeat interval {args.interval:g} s, devices inserted in SQL, "
        f"{args.sim_procs} load-generator process(es) running `device_client.agent.Agent`; steps are added "
        f"cumulatively and each is held {args.hold_intervals:g} heartbeat intervals. Hub VmRSS before any "
        f"device: {mib(r['rss_baseline_kib'])} MiB. KiB/device = (VmRSS after the hold − baseline) / N.", "",
        md_table(["devices", "connect s (this step)", "devices/s", "VmRSS connected MiB", "VmRSS after hold MiB",
                  "KiB/device", "hold s", "min connected in hold", "reconnects", "heartbeats persisted / expected",
                  "hub CPU % in hold", "load-gen link failures", "/metrics slowest s / failed (connecting)",
                  "verdict"], rows), "",
        f"**Largest N held: {r['max_held']:,}** (aim {AIM_DEVICES:,}); the ramp stopped at "
        f"{r.get('ramp_stop', '—')}.",
    ]
    errs = merge_counts(s.get("sim_last_errors", {}) for s in r["steps"])
    if errs:
        out.append("Load-generator link failures (a failed attempt backs off, then retries), most common errors: "
                   + "; ".join(f"`{k}` ×{v}" for k, v in sorted(errs.items(), key=lambda kv: -kv[1])[:4]) + ".")
    held = [s for s in r["steps"] if s["ok"]]
    if held:
        last = held[-1]
        out.append(f"**Memory per connected device at {last['n']:,}: {last['kib_per_device']} KiB** "
                   f"(aim ≤ 50 KB ≈ {AIM_KIB_PER_DEVICE} KiB).")
    if r.get("herd"):
        h = r["herd"]
        out.append(f"All {h['n']:,} links dropped and reconnecting at once: "
                   + (f"**{h['seconds']} s** until the hub counted them all" if h["seconds"] else
                      f"only {h['seen']:,} within the timeout") + f"; VmRSS then {mib(h['rss_kib'])} MiB.")
    echoes = [(label, r[key]) for key, label in (("echo", "Quart WebSocket, `/ws`"),
                                                 ("echo_raw", "plain ASGI, `/ws-raw`")) if r.get(key)]
    for label, e in echoes:
        if e.get("error"):
            out += ["", f"Bare echo comparison ({label}) at {e['n']:,} links failed: {e['error']}"]
    echoes = [(label, e) for label, e in echoes if not e.get("error")]
    if echoes:
        out += ["", f"Bare echo app (bench/_bare_app.py, same hypercorn config) holding {echoes[0][1]['n']:,} links "
                    "from the same number of processes, once through Quart-Trio (the comparison issue 22 names) "
                    "and once on plain ASGI in front of Quart, as the hub serves its device link:", "",
                md_table(["echo", "links open", "open after hold", "connect s", "VmRSS before MiB",
                          "VmRSS after hold MiB", "KiB/link"] + (["hub/echo"] if held else []),
                         [[label, f"{e['open']:,}", f"{e['open_after_hold']:,}", e["connect_seconds"],
                           mib(e["rss_before_kib"]), mib(e["rss_after_hold_kib"]), e["kib_per_link"]]
                          + ([f"{last['kib_per_device'] / e['kib_per_link']:.2f}×"] if held else [])
                          for label, e in echoes])]
        if held:
            out.append("")
            out.append(f"Hub/echo memory per link: {last['kib_per_device'] / echoes[0][1]['kib_per_link']:.2f}×")
    if r.get("py_spy_connect"):
        out += ["", "py-spy of the hub during the last step's connects (share of samples, self time):", ""]
        out += [f"- {pct}% {frame}" for frame, pct in r["py_spy_connect"]["self"][:10]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
