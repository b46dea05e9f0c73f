"""A batched rollout of one configuration version to a fleet: time to "completed" and hub CPU per device.

    python bench/rollout.py [--smoke] [--devices 1000] [--batch-size 100] [--py-spy]

``fleethub serve`` in its own process with ``--devices`` devices in one fleet, all connected from one
load-generator process of real ``device_client.agent.Agent`` s (set up as bench/delivery.py does:
SQL-provisioned, ``fleet_id`` set in SQL before the agents connect, ``ignore_owner``, tmpfs state).
A configuration with ``spec: {}`` (no workload: the agent's health verification passes at once) is
created, then ``POST /v1/rollouts`` {fleet_ids: [fleet], configuration_id, batch_size} — a canary of
5 % of the devices, then batches of ``--batch-size``, each starting when the previous one settled.

Measured: the time from the POST to state ``completed`` (the client polls the cheap list
``GET /v1/rollouts`` every 0.25 s; the hub's own instant is the rollout row's ``updated_at``), and
the CPU seconds of the hub process (``/proc/PID/stat`` utime+stime, all threads) from just before
the POST to the poll that saw ``completed``, divided by the number of devices. The hub's idle CPU
(1,000 devices heartbeating) and the cost of the list polls are measured first, so the net figure
can be given too. PostgreSQL (postmaster + backends) and the agents' process are reported beside it.

The per-batch timeline comes from ``GET /v1/rollouts/{id}`` at the end: each device's step
``updated_at`` is when it became ``succeeded``; a batch starts in the tick that saw the previous one
settle, so "batch took" is the gap between the last settles of consecutive batches.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (OUT_DIR, PySpy, Verdicts, command_line, cpu_seconds, facts_line, loadavg, log,  # noqa: E402
                     machine_facts, md_table, wait_quiet, write_section)
from delivery import code_version, crossing_delta, crossings, expect, pg_cpu_seconds, start_fleet, stats_ms  # noqa: E402  (the same fleet set-up)

UTC = dt.timezone.utc
AIM_SECONDS = 30.0
TERMINAL = ("completed", "failed", "cancelled")


def parse_ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def list_state(api, rollout_id: str) -> str | None:
    body = expect(*api.call("GET", "/v1/rollouts?limit=100"), (200,), "GET /v1/rollouts")
    return next((r["state"] for r in body["data"] if r["id"] == rollout_id), None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny size, < 30 s; results go to bench/out/")
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--poll", type=float, default=0.25, help="seconds between list polls")
    p.add_argument("--timeout", type=float, default=300.0, help="bound on the rollout")
    p.add_argument("--idle-seconds", type=float, default=5.0, help="hub idle CPU measured over this long")
    p.add_argument("--py-spy", action="store_true", help="record the hub with py-spy during the rollout")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="wait up to this long for the machine to be < 25%% busy before measuring")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.devices, args.batch_size, args.timeout, args.idle_seconds = 40, 10, 60.0, 1.0
    facts = machine_facts(0 if args.smoke else args.quiet_wait)

    r: dict = {"devices": args.devices, "batch_size": args.batch_size, "code": code_version()}
    fleet = start_fleet(args.devices, "rollout")
    api, hub = fleet.api, fleet.hub
    try:
        r["rate_limit"] = fleet.extra.get("rate_limit")
        r["connect_seconds"] = fleet.connect_seconds
        cfg = expect(*api.call("POST", "/v1/configurations", {"name": f"bench-rollout-{secrets.token_hex(3)}",
                                                              "spec": {}}), (201,), "POST /v1/configurations")["data"]
        r["config_id"] = cfg["id"]
        busy = wait_quiet(args.quiet_wait) if not args.smoke else None
        r["busy_before"] = None if busy is None else round(busy)
        # the background: the hub idle with its devices heartbeating, and what one list poll costs
        c0, t0 = cpu_seconds(hub.pid), time.monotonic()
        time.sleep(args.idle_seconds)
        r["idle_cpu_percent"] = round(100 * (cpu_seconds(hub.pid) - c0) / (time.monotonic() - t0), 2)
        n_probe = 20
        c0, t0 = cpu_seconds(hub.pid), time.monotonic()
        for _ in range(n_probe):
            expect(*api.call("GET", "/v1/rollouts?limit=100"), (200,), "GET /v1/rollouts")
        probe_cpu = cpu_seconds(hub.pid) - c0 - (time.monotonic() - t0) * r["idle_cpu_percent"] / 100
        r["poll_cpu_ms"] = round(1000 * max(0.0, probe_cpu) / n_probe, 2)

        cross0 = crossings(hub)
        spy = PySpy(hub.pid, OUT_DIR / "rollout-hub.pyspy.txt") if args.py_spy else None
        hub_c0, pg_c0, sim_c0 = cpu_seconds(hub.pid), pg_cpu_seconds(hub), cpu_seconds(fleet.worker.pid)
        start_wall, t0 = time.time(), time.monotonic()
        created = expect(*api.call("POST", "/v1/rollouts", {"fleet_ids": [fleet.fleet_id],
                                                            "configuration_id": cfg["id"],
                                                            "batch_size": args.batch_size}),
                         (201,), "POST /v1/rollouts")["data"]
        r["post_ms"] = round((time.monotonic() - t0) * 1000, 1)
        rid = r["rollout_id"] = created["id"]
        r["planned"] = {"total": created["total_devices"], "batches": len(created["batches"]),
                        "ineligible": created["counts"]["ineligible"]}
        log(f"rollout {rid}: {r['planned']} (POST {r['post_ms']} ms)")
        state, polls, seen = created["state"], 0, None
        while time.monotonic() - t0 < args.timeout:
            if state in TERMINAL or state == "paused":
                seen = time.monotonic() - t0
                break
            time.sleep(args.poll)
            state = list_state(api, rid)
            polls += 1
        wall = time.monotonic() - t0
        hub_cpu = cpu_seconds(hub.pid) - hub_c0
        pg_cpu = pg_cpu_seconds(hub) - pg_c0
        sim_cpu = cpu_seconds(fleet.worker.pid) - sim_c0
        if spy:
            spy.stop()
            r["py_spy"] = spy.summary(top=80)
        r["crossings"] = crossing_delta(cross0, crossings(hub), args.devices)
        r["state"], r["polls"] = state, polls
        r["seen_seconds"] = None if seen is None else round(seen, 2)
        r["wall_seconds"] = round(wall, 2)
        idle = wall * r["idle_cpu_percent"] / 100
        r["cpu_seconds"] = {"hub": round(hub_cpu, 2), "hub_idle_share": round(idle, 2),
                            "hub_polls": round(polls * r["poll_cpu_ms"] / 1000, 2), "postgres": round(pg_cpu, 2),
                            "agents": round(sim_cpu, 2)}
        n = max(1, args.devices)
        r["hub_cpu_ms_per_device"] = round(1000 * hub_cpu / n, 2)
        r["hub_cpu_ms_per_device_net"] = round(1000 * (hub_cpu - idle - polls * r["poll_cpu_ms"] / 1000) / n, 2)

        detail = expect(*api.call("GET", f"/v1/rollouts/{rid}"), (200,), "GET /v1/rollouts/{id}")["data"]
        start = dt.datetime.fromtimestamp(start_wall, UTC)
        r["hub_completed_seconds"] = round((parse_ts(detail["updated_at"]) - start).total_seconds(), 2)
        r["counts"] = {k: v for k, v in detail["counts"].items() if v}
        r["reason"] = detail.get("reason")
        timeline, prev_last = [], 0.0
        by_batch: dict[int, list[float]] = {}
        for d in detail["devices"]:
            if d["step"] in ("succeeded", "failed"):
                by_batch.setdefault(d["batch"], []).append((parse_ts(d["updated_at"]) - start).total_seconds())
        for b in sorted(by_batch):
            xs = sorted(by_batch[b])
            timeline.append({"batch": b, "devices": len(xs), "first_s": round(xs[0], 2), "last_s": round(xs[-1], 2),
                             "took_s": round(xs[-1] - prev_last, 2)})
            prev_last = xs[-1]
        r["timeline"] = timeline
        r["settled"] = stats_ms([1000 * x for xs in by_batch.values() for x in xs])
        stats = fleet.worker.request({"cmd": "stats"}, timeout=60)
        r["agents"] = {k: stats.get(k) for k in ("total", "connected", "link_failures", "commands_handled")}
        log(f"rollout {state} seen after {r['seen_seconds']} s (hub: {r['hub_completed_seconds']} s); "
            f"hub CPU {hub_cpu:.2f} s = {r['hub_cpu_ms_per_device']} ms/device")
    finally:
        fleet.stop()

    (OUT_DIR / f"rollout{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(r, indent=1))
    verdicts = Verdicts("rollout", smoke=args.smoke)
    # a rollout that never completed has no time to completion: missed, not met
    verdicts.at_most(f"POST → completed, {args.devices:,} devices",
                     r["seen_seconds"] if r["state"] == "completed" else None, AIM_SECONDS, " s")
    body = render(r, facts, args) + "\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('rollout', body, smoke=args.smoke)}")
    return verdicts.exit_code(broken=args.smoke and r["state"] != "completed")


def render(r: dict, facts: dict, args) -> str:
    c = r["cpu_seconds"]
    done = r["seen_seconds"]
    verdict = ("meets" if done is not None and r["state"] == "completed" and done <= AIM_SECONDS else "misses")
    out = ["## Batched rollout (bench/rollout.py)", "", f"`{command_line()}`", "",
           f"{facts_line(facts)}; load average at end {loadavg()}; code at {r.get('code')}", "",
           *([f"The bench organisation is lifted out of the hub's request rate limit: {r['rate_limit']}.", ""]
             if r.get("rate_limit") else []),
           f"`fleethub serve` with {r['devices']:,} devices in one fleet, all connected ({r['connect_seconds']} s) from "
           f"one load-generator process of `Agent`s. `POST /v1/rollouts` {{fleet_ids: [fleet], configuration_id, "
           f"batch_size: {r['batch_size']}}} of a configuration with `spec: {{}}` (no workload: health verified at "
           f"once): {r['planned']['total']:,} devices in {r['planned']['batches']} batches (canary 5 %), "
           f"{r['planned']['ineligible']} ineligible. POST answered in {r['post_ms']} ms. Machine busy just before: "
           f"{'—' if r.get('busy_before') is None else str(r['busy_before']) + '%'}.", "",
           md_table(["measure", "value"], [
               ["final state", f"{r['state']}" + (f" ({r['reason']})" if r.get("reason") else "")],
               ["steps", json.dumps(r["counts"])],
               ["POST → `completed` seen by the client (0.25 s polls)", f"**{done} s**"],
               ["POST → the rollout row's `updated_at` (hub clock)", f"{r['hub_completed_seconds']} s"],
               ["hub CPU over that time", f"{c['hub']} s"],
               ["of which idle background (hub idle at "
                f"{r['idle_cpu_percent']} % with the devices heartbeating)", f"{c['hub_idle_share']} s"],
               [f"of which the client's {r['polls']} list polls (≈ {r['poll_cpu_ms']} ms each)", f"{c['hub_polls']} s"],
               ["**hub CPU per device update**", f"**{r['hub_cpu_ms_per_device']} ms** "
                                                  f"({r['hub_cpu_ms_per_device_net']} ms net of idle and polls)"],
               ["PostgreSQL CPU (postmaster + backends)", f"{c['postgres']} s"],
               ["agents' process CPU", f"{c['agents']} s"],
               ["storage crossings (trio → asyncpg, /metrics histogram)",
                f"{r['crossings'].get('count', 0):,} ({r['crossings'].get('per_device')} per device), mean "
                f"{r['crossings'].get('mean_ms')} ms, {r['crossings'].get('over_5ms_pct')}% over 5 ms, "
                f"{r['crossings'].get('over_10ms_pct')}% over 10 ms"],
               ["device settled (POST → step `succeeded`), ms",
                f"p50 {r['settled'].get('p50')} · p99 {r['settled'].get('p99')} · max {r['settled'].get('max')}"],
           ]), "",
           f"**{done} s to completed** (aim ≤ {AIM_SECONDS:g} s: {verdict}).", "",
           "Per-batch timeline (s after the POST; from each device's step `updated_at`; a batch starts in the "
           "tick that saw the previous one settle):", "",
           md_table(["batch", "devices", "first settled s", "last settled s", "batch took s"],
                    [[t["batch"], t["devices"], t["first_s"], t["last_s"], t["took_s"]] for t in r["timeline"]])]
    a = r.get("agents") or {}
    out += ["", f"Agents at the end: {a.get('connected')}/{a.get('total')} connected, {a.get('link_failures')} link "
            f"failures, {a.get('commands_handled')} commands handled."]
    if r.get("py_spy"):
        out += ["", "py-spy of the hub during the rollout (share of samples):", "", "Self time:", ""]
        out += [f"- {pct}% {frame}" for frame, pct in r["py_spy"]["self"][:12]]
        out += ["", "Inclusive (hub code):", ""]
        out += [f"- {pct}% {frame}" for frame, pct in r["py_spy"]["inclusive"] if "(hub/" in frame
                or "(actors/" in frame or "(storage/" in frame][:12]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
