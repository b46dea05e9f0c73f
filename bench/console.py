"""The console's device list at scale, in Debian's Chromium (issue 18, Measure).

    python bench/console.py [--smoke] [--devices 10000] [--tabs 50] [--idle 30] [--runs 5]

A hub in its own process (``fleethub serve``, embedded PostgreSQL) with ``--devices`` devices in its
organisation (one COPY, as bench/_common.py ``insert_devices``), an operator with a password, and
Chromium driven by Playwright (``/usr/bin/chromium``; the script says so and exits 0 when it or
Playwright is missing):

- **first rows**: from ``page.goto('/console/devices')`` to the first device row visible (the shell,
  the modules, the session, /v1/me, fleets, configurations and the first page of 25 devices, server
  side), ``--runs`` times in a warm browser tab; aim: median ≤ 1 s;
- **50 tabs**: ``--tabs`` tabs on the device list (each in its own browser context, as 50 operators),
  each holding its organisation stream; the hub's CPU seconds (its /metrics process collector) over
  ``--idle`` seconds, four ways: tabs open and nothing happening; tabs open while ``--event-devices``
  real agents (bench/_simworker.py) send ``--event-rate`` device events a second, which every tab's
  stream carries and every tab draws; the same with the tabs closed; and closed and quiet. What the
  open tabs cost the hub, quiet and busy (informative).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (CHROMIUM, CHROMIUM_ARGS, HubProcess, Verdicts, Worker, browser_missing,  # noqa: E402
                     command_line, facts_line, hub_cpu_seconds, insert_devices, log, machine_facts, md_table,
                     shm_tempdir, write_section)

ARGS = CHROMIUM_ARGS


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--devices", type=int, default=10_000)
    p.add_argument("--tabs", type=int, default=50)
    p.add_argument("--idle", type=float, default=30.0)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--event-devices", type=int, default=50, help="agents sending events while tabs are open")
    p.add_argument("--event-rate", type=float, default=20.0, help="device events a second, in all")
    args = p.parse_args()
    if args.smoke:
        args.devices, args.tabs, args.idle, args.runs, args.event_devices, args.event_rate = 300, 3, 3.0, 2, 5, 5.0
    missing = browser_missing("console")
    if missing:
        print(missing)
        return 0
    from playwright.sync_api import sync_playwright

    facts = machine_facts()
    hub = HubProcess.start(name="console")
    broken = False
    results: dict = {}
    worker = None
    try:
        hub.bootstrap()
        email, password = f"console-{uuid.uuid4().hex[:6]}@bench.local", uuid.uuid4().hex
        hub.admin("create-user", email, "--org", hub.org_id, "--role", "admin", "--password", password)
        insert_devices(hub.dsn(), hub.org_id, args.devices, prefix="console")
        log(f"{args.devices} devices in the organisation")
        # agents that send device events while the tabs are open (before Playwright: it runs an asyncio loop)
        agents = insert_devices(hub.dsn(), hub.org_id, args.event_devices, prefix="console-events")
        agents_file = shm_tempdir("fleethub-bench-console-") / "agents.json"
        agents_file.write_text(json.dumps(agents))
        worker = Worker("agent", "--hub", hub.base_url, "--data-dir", str(agents_file.parent / "agents"),
                        name="console-events")
        answer = worker.request({"cmd": "add", "devices_file": str(agents_file), "timeout": 120}, timeout=180)
        if answer.get("connected") != args.event_devices:
            raise RuntimeError(f"event agents did not all connect: {answer}")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            context = browser.new_context(base_url=hub.base_url, viewport={"width": 1280, "height": 900})
            context.set_default_timeout(30_000)
            r = context.request.post("/v1/auth/login", data={"email": email, "password": password})
            assert r.ok, r.text()
            page = context.new_page()
            times = []
            for _ in range(args.runs + 1):  # the first load fills the browser's and the hub's caches
                t0 = time.perf_counter()
                page.goto("/console/devices")
                page.wait_for_selector("#devices a.device-name")
                times.append(time.perf_counter() - t0)
            page.close()
            first, warm = times[0], times[1:]
            results["first_rows"] = {"cold": first, "median": statistics.median(warm), "max": max(warm)}
            log(f"first rows: cold {first:.3f} s, warm median {statistics.median(warm):.3f} s")

            # one browser context per tab: 50 operators. One browser holds at most 6 HTTP/1.1
            # connections to an origin, so 50 tabs of one person would queue behind each other's
            # streams (the console lets a hidden tab's stream go for that reason: docs/console.md).
            cookies = context.cookies()
            tabs = []
            for _ in range(args.tabs):
                ctx = browser.new_context(base_url=hub.base_url)
                ctx.add_cookies(cookies)
                tab = ctx.new_page()
                tab.goto("/console/devices")
                tab.locator("#live", has_text="live").wait_for()
                tabs.append(ctx)
            time.sleep(1.0)
            cpu = {}

            def over(key: str, events: bool) -> None:
                c0 = hub_cpu_seconds(hub.metrics())
                if events:
                    got = worker.request({"cmd": "events", "rate": args.event_rate, "seconds": args.idle},
                                         timeout=args.idle + 60)
                    cpu[f"{key}_events"] = got
                else:
                    time.sleep(args.idle)
                cpu[key] = hub_cpu_seconds(hub.metrics()) - c0

            over("open_quiet", False)
            over("open_busy", True)
            # what the tabs drew: every tab's list shows the last event it heard
            for ctx in tabs:
                ctx.close()
            time.sleep(1.0)
            over("closed_busy", True)
            over("closed_quiet", False)
            results["tabs"] = {"n": args.tabs, "idle": args.idle, "rate": args.event_rate, **cpu}
            log(f"{args.tabs} tabs: hub CPU over {args.idle:g} s: {json.dumps(cpu)}")
            browser.close()
    except Exception as exc:  # noqa: BLE001 — reported as a broken run
        log(f"console bench failed: {exc!r}")
        broken = True
    finally:
        if worker is not None:
            worker.stop()
        hub.stop()

    verdicts = Verdicts("console", smoke=args.smoke)
    fr = results.get("first_rows", {})
    verdicts.at_most(f"device list first rows, {args.devices:,} devices (median of {args.runs})", fr.get("median"),
                     1.0, " s")
    rows = []
    if fr:
        rows.append([f"device list to first rows, {args.devices:,} devices", f"cold {fr['cold']:.3f} s",
                     f"warm median {fr['median']:.3f} s, max {fr['max']:.3f} s"])
    t = results.get("tabs")
    if t:
        def pct(key: str) -> str:
            return f"{t[key]:.3f} s in {t['idle']:g} s ({100 * t[key] / t['idle']:.2f} % of a core)"
        rows.append([f"hub CPU, {t['n']} device-list tabs open, quiet", pct("open_quiet"),
                     f"tabs closed, quiet: {pct('closed_quiet')}"])
        sent = t["open_busy_events"]["sent"]
        rows.append([f"hub CPU, {t['n']} tabs open, {t['rate']:g} device events/s ({sent} sent, each to every tab)",
                     pct("open_busy"), f"tabs closed, same events: {pct('closed_busy')}"])
    body = (f"`{command_line()}`\n\n{facts_line(facts)}\n\n" + md_table(["what", "measured", "beside it"], rows)
            + "\n\n" + verdicts.markdown() + "\n")
    print(body)
    log(f"wrote {write_section('console', body, smoke=args.smoke)}")
    return verdicts.exit_code(broken=broken)


if __name__ == "__main__":
    sys.exit(main())
