"""The event log, SSE resume and webhooks (issue 33, docs/events.md): what they cost and what they keep.

    python bench/events.py [--smoke] [--parts cost,append,latency,latency-far,outage,resume] [--rate 1000] [--down 600]

One hub in this process (hub/server.py ``run_hub``, a fresh database of one embedded PostgreSQL per
part), events recorded through the hub's own ``Journal`` as DeviceActors record them:

- cost: REST throughput (closed-loop ``GET /v1/devices/{id}``, ``--clients`` at once) while
  ``--rate`` device events a second are recorded, with the log on and off, in ``--pairs`` pairs: the
  median of the pairs' ratios and their spread. A pair is one hub whose log is switched on and off
  every ``--slice`` seconds (off, on, on, off, ...) for ``--seconds``, so that a change of the shared
  host's speed falls on both modes alike; ``--slice 0`` makes a pair two fresh hubs run one after the
  other (FLEETHUB_EVENT_LOG=0 for the one off), as before.
  PostgreSQL statements are counted in asyncpg in both modes (per REST request, and the log's own per
  1,000 events): a figure the machine's load cannot blur. The device load is synthetic (the journal
  fed at a fixed rate), not the soak bench's agents. Run with ``--parts`` a subset, the section keeps
  the other parts' rows from the run before (and says so).
- append: CPU per event appended (the hub's process, PostgreSQL), in batches of 100 (the journal's at
  1,000 events a second) and 500 (its largest), with no other load; and what the log adds per event
  recorded in a running hub (``--rate`` events a second through its Journal, log on minus off).
- latency: one webhook endpoint on a local receiver, ``--rate`` events a second for ``--seconds``;
  from the event's record to the receiver's 200 (an event's first arrival), p50 and p99.
- latency-far: the same at ``--far-rate`` to a receiver that answers after ``--far-delay`` seconds,
  as one a network round trip away would (where the endpoint's subjects go in parallel lanes).
- outage: the receiver answers 503 for ``--down`` seconds while ``--subjects`` devices each send
  ``--per-subject`` events, then 200 again: every event delivered, none lost, in order per subject
  (counted), and how long the catching up took. The hub's own retry schedule (5 s doubling to 1 h).
  Synthetic subjects; bench/events_rollout.py does the same during a real rollout to connected devices.
- resume: an SSE client of a device's stream drops the stream ``--drops`` times, at random points,
  while events are recorded, and reconnects with Last-Event-ID: each event seen exactly once (counted).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import trio  # noqa: E402

from _common import OUT_DIR, Verdicts, command_line, facts_line, loadavg, log, machine_facts, md_table, \
    percentile, shm_tempdir, write_section  # noqa: E402
from _events_cost import part_append, part_cost  # noqa: E402
from _events_harness import Bench, _devices, _event, _feed  # noqa: E402


async def _receiver(nursery, delay: float = 0.0):
    """The local receiver; ``delay`` seconds before each answer stand for a receiver further away."""
    from tests.api.webhook_receiver import Receiver
    receiver = Receiver()
    if delay:
        async def answer(_request) -> int:
            await trio.sleep(delay)
            return 200
        receiver.answer = answer
    await nursery.start(receiver.serve)
    return receiver


async def _endpoint(client, base, headers, url) -> dict:
    r = await client.post(base + "/v1/webhooks", json={"url": url, "event_types": ["io.fleethub.device.*"]},
                          headers=headers)
    r.raise_for_status()
    return r.json()["data"]


async def part_latency(bench: Bench, args, rate: float | None = None, delay: float | None = None) -> dict:
    rate = args.rate if rate is None else rate
    delay = args.receiver_delay if delay is None else delay
    async with trio.open_nursery() as nursery:
        s, base, org_id, headers = await bench.hub(nursery, webhooks_allow_private=True)
        receiver = await _receiver(nursery, delay)
        async with httpx.AsyncClient(timeout=30) as client:
            devices = await _devices(client, base, headers, 10)
            await _endpoint(client, base, headers, receiver.url)
            await trio.sleep(SCAN_WAIT)  # the deliverer takes the endpoint's lease
            sent: dict[int, float] = {}
            total = await _feed(s, org_id, devices, rate, args.seconds, sent)
            with trio.move_on_after(60 + args.seconds):
                while len({r.headers["webhook-id"] for r in receiver.requests}) < total:
                    await trio.sleep(0.05)
        firsts: dict[int, float] = {}
        for r in receiver.requests:  # a repeat (at least once) counts at its first arrival
            firsts.setdefault(json.loads(r.body)["data"]["n"], r.at)
        latencies = sorted(at - sent[n] for n, at in firsts.items())
        nursery.cancel_scope.cancel()
    return {"rate": rate, "receiver_delay_ms": delay * 1000, "events": total, "delivered": len(firsts),
            "requests": len(receiver.requests),
            "p50_ms": round(percentile(latencies, 50) * 1000, 1), "p99_ms": round(percentile(latencies, 99) * 1000, 1)}


SCAN_WAIT = 2.5  # the deliverer scans for endpoints every 2 s (hub/webhooks/worker.py)


async def part_latency_far(bench: Bench, args) -> dict:
    """As ``part_latency``, to a receiver that answers after ``--far-delay`` (a round trip away)."""
    return await part_latency(bench, args, args.far_rate, args.far_delay)


async def part_outage(bench: Bench, args) -> dict:
    async with trio.open_nursery() as nursery:
        s, base, org_id, headers = await bench.hub(nursery, webhooks_allow_private=True)
        receiver = await _receiver(nursery)
        up = {"yes": False}
        receiver.answer = lambda _r: 200 if up["yes"] else 503
        async with httpx.AsyncClient(timeout=30) as client:
            devices = await _devices(client, base, headers, args.subjects)
            await _endpoint(client, base, headers, receiver.url)
            await trio.sleep(SCAN_WAIT)
            total = args.subjects * args.per_subject
            await _feed(s, org_id, devices, total / max(1.0, args.down / 2), max(1.0, args.down / 2) + 0.5,
                        limit=total)
            await trio.sleep(max(0.0, args.down - max(1.0, args.down / 2)))
            up["yes"] = True
            back = trio.current_time()
            with trio.move_on_after(args.catch_up):
                while sum(1 for r in receiver.requests if r.at >= back) < total:
                    await trio.sleep(0.1)
            took = trio.current_time() - back
        got = [json.loads(r.body) for r in receiver.requests if r.at >= back]
        nursery.cancel_scope.cancel()
    per_subject: dict[str, list[int]] = {}
    for e in got:
        per_subject.setdefault(e["subject"], []).append(int(e["sequence"]))
    in_order = all(seqs == sorted(seqs) for seqs in per_subject.values())
    distinct = {e["id"] for e in got}
    return {"events": total, "delivered_after_return": len(got), "distinct": len(distinct),
            "lost": total - len(distinct), "in_order_per_subject": in_order,
            "failed_attempts_while_down": sum(1 for r in receiver.requests if r.at < back),
            "catch_up_s": round(took, 1)}


async def part_resume(bench: Bench, args) -> dict:
    async with trio.open_nursery() as nursery:
        s, base, org_id, headers = await bench.hub(nursery)
        async with httpx.AsyncClient(timeout=30) as client:
            [device] = await _devices(client, base, headers, 1)
            rand = random.Random(7)
            seen: list[int] = []
            last = None
            feeding = trio.Event()

            async def feed() -> None:
                n = 0
                while not feeding.is_set():
                    s.journal.record(org_id, _event(s, device, n))
                    n += 1
                    await trio.sleep(1 / args.resume_rate)
                await s.journal.wait_written()
                total["n"] = n

            total: dict = {}
            url = f"{base}/v1/devices/{device}/events"
            for drop in range(args.drops + 1):
                want = rand.randint(1, 20)
                hdrs = {**headers, **({"Last-Event-ID": last} if last is not None else {})}
                async with client.stream("GET", url, headers=hdrs) as r:
                    r.raise_for_status()
                    got, ident, name = 0, None, None
                    async for line in r.aiter_lines():
                        if line.startswith("id:"):
                            ident = line[3:].strip()
                        elif line.startswith("event:"):
                            name = line[6:].strip()
                        elif line.startswith("data:") and name == "device.event.telemetry":
                            seen.append(json.loads(line[5:])["payload"]["n"])
                        elif line == "" and name is not None:
                            last, name = ident, None
                            got += 1
                            if drop == 0 and got == 1:
                                nursery.start_soon(feed)  # after the snapshot: it covers what came before
                            if got >= want:
                                break
            feeding.set()
            while "n" not in total:
                await trio.sleep(0.05)
            # the rest, in one last stream
            hdrs = {**headers, "Last-Event-ID": last}
            with trio.move_on_after(0 if len(set(seen)) >= total["n"] else 30):
                async with client.stream("GET", url, headers=hdrs) as r:
                    name = None
                    async for line in r.aiter_lines():
                        if line.startswith("event:"):
                            name = line[6:].strip()
                        elif line.startswith("data:") and name == "device.event.telemetry":
                            seen.append(json.loads(line[5:])["payload"]["n"])
                            if len(set(seen)) >= total["n"]:
                                break
        nursery.cancel_scope.cancel()
    return {"drops": args.drops, "events": total["n"], "seen": len(seen), "distinct": len(set(seen)),
            "duplicates": len(seen) - len(set(seen)), "missing": total["n"] - len(set(seen)),
            "in_order": seen == sorted(seen)}


PARTS = ("cost", "append", "latency", "latency-far", "outage", "resume")
# which part an aim row, or a note, of the section belongs to (by the start of its text)
AIM_PARTS = {"| REST throughput lost": "cost", "| CPU per REST request": "cost",
             "| webhook delivery latency p99 (latency,": "latency",
             "| webhook delivery latency p99 (latency-far,": "latency-far",
             "| events lost to a receiver outage": "outage", "| SSE resume": "resume"}
NOTE_PARTS = {"The throughput pairs' middle half": "cost"}
KEPT = "Rows of the parts not run this time are kept from the run before: "


def _kept(parts: list[str]) -> tuple[list[list[str]], list[str], list[str]]:
    """The rows of RESULTS.md's section for the parts this run leaves out, so that one part can be
    measured again without losing the others: (table rows, aim rows, notes: which run each part's
    rows come from, and that part's own notes)."""
    from _common import RESULTS
    start, end = "<!-- bench:events -->", "<!-- /bench:events -->"
    text = RESULTS.read_text() if RESULTS.exists() else ""
    if start not in text or end not in text:
        return [], [], []
    section = text.split(start, 1)[1].split(end, 1)[0].splitlines()
    left_out = set(PARTS) - set(parts)
    rows = [[c.strip() for c in line.strip().strip("|").split("|", 2)] for line in section
            if line.startswith("| ") and line.split("|")[1].strip() in left_out]
    aims = [line for line in section
            if any(line.startswith(prefix) and part in left_out for prefix, part in AIM_PARTS.items())]
    notes = [line for line in section
             if any(line.startswith(prefix) and part in left_out for prefix, part in NOTE_PARTS.items())]
    # each kept part's run: as an earlier note of this kind gave it, else the section's own run
    facts = next((line for line in section if line[:4].isdigit() and " UTC · " in line), "")
    when = {part: facts for part in PARTS}
    for line in section:
        if line.startswith("- ") and ": 20" in line and line.split(":", 1)[0][2:] in PARTS:
            part, run = line[2:].split(": ", 1)
            when[part] = run
    kept = sorted({r[0] for r in rows}, key=PARTS.index)
    runs = [f"- {part}: {when[part]}" for part in kept]
    return rows, aims, ([KEPT, "", *runs, ""] if rows else []) + [line for n in notes for line in (n, "")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--parts", default="cost,append,latency,latency-far,outage,resume")
    p.add_argument("--append-events", type=int, default=20000, help="events written per batch size (append)")
    p.add_argument("--far-rate", type=float, default=200.0, help="events a second (latency-far)")
    p.add_argument("--far-delay", type=float, default=0.02, help="the far receiver's answer time, seconds")
    p.add_argument("--rate", type=float, default=1000.0, help="events a second (cost, latency)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--receiver-delay", type=float, default=0.0,
                   help="seconds the receiver waits before each answer (latency: a receiver further away)")
    p.add_argument("--pairs", type=int, default=8, help="pairs of runs, log off and on (cost)")
    p.add_argument("--slice", type=float, default=1.0,
                   help="cost: seconds between switches of the log in one hub (a pair is one hub run of "
                        "--seconds); 0: a pair is two fresh hubs, one with the log off and one on")
    p.add_argument("--down", type=float, default=600.0, help="seconds the receiver answers 503 (outage)")
    p.add_argument("--subjects", type=int, default=1000)
    p.add_argument("--per-subject", type=int, default=3)
    p.add_argument("--catch-up", type=float, default=1200.0, help="the most seconds the outage part waits after")
    p.add_argument("--drops", type=int, default=100)
    p.add_argument("--resume-rate", type=float, default=50.0)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.rate, args.seconds, args.clients, args.pairs, args.far_rate = 100.0, 3.0, 4, 1, 50.0
        args.down, args.subjects, args.per_subject, args.catch_up = 3.0, 20, 2, 60.0
        args.drops, args.resume_rate, args.append_events = 5, 50.0, 1000
    parts = args.parts.split(",")
    facts = machine_facts(0)
    from storage.embedded import EmbeddedPostgres
    data_dir = shm_tempdir("fleethub-bench-events-")
    pg = EmbeddedPostgres(data_dir / "pg")
    pg.start()
    results: dict = {}
    broken = False
    try:
        bench = Bench(pg.dsn, data_dir, data_dir / "pg")
        for name in parts:
            fn = {"cost": part_cost, "append": part_append, "latency": part_latency, "latency-far": part_latency_far,
                  "outage": part_outage, "resume": part_resume}[name]
            started = time.monotonic()
            try:
                results[name] = trio.run(fn, bench, args)
            except Exception as exc:  # noqa: BLE001 — a broken part is reported, the others still run
                log(f"{name} failed: {exc!r}")
                broken = True
                continue
            log(f"{name} ({time.monotonic() - started:.0f} s): {json.dumps(results[name])}")
    finally:
        pg.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"events{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(results, indent=1))
    verdicts = Verdicts("events", smoke=args.smoke)
    rows: list = []
    notes: list[str] = []
    if "cost" in results:
        c = results["cost"]
        sp = c["statements_per_request"]
        how = (f"{args.pairs} hub runs, the log switched every {args.slice:g} s in each" if args.slice
               else f"{args.pairs} alternating pairs of hub runs")
        rows += [["cost", f"REST requests/s with the log on / off, {args.rate:g} events/s recorded, median of "
                  f"{how}",
                  f"{c['requests_per_s_median']['on']} / {c['requests_per_s_median']['off']}; ratio on/off per pair: "
                  f"median {c['ratio_median']}, middle half {c['ratio_iqr'][0]}–{c['ratio_iqr'][1]}, "
                  f"range {c['ratio_min']}–{c['ratio_max']}"],
                 ["cost", "CPU ms per REST request, log on / off (this process: hub, clients, feed; and PostgreSQL), "
                  "median of pairs", f"{c['cpu_ms_per_request_median']['on']} / {c['cpu_ms_per_request_median']['off']}; "
                  f"ratio off/on per pair (the throughput a CPU-bound machine keeps): median {c['cpu_ratio_median']}, "
                  f"middle half {c['cpu_ratio_iqr'][0]}–{c['cpu_ratio_iqr'][1]}, range {c['cpu_ratio_range'][0]}–"
                  f"{c['cpu_ratio_range'][1]}"],
                 ["cost", "PostgreSQL statements (round trips) per REST request, log on / off (counted in asyncpg; "
                  "the journal's appends spread over the requests)", f"{sp['on']} / {sp['off']}"],
                 ["cost", "statements (round trips) the log adds: per 1,000 events / per second",
                  f"{c['log_statements_per_1000_events']} / {c['log_statements_per_s']}"],
                 ["cost", "events the log took per second", c["events_logged_per_s"]]]
        verdicts.at_most("REST throughput lost to the event log (median of pairs)",
                         round((1 - c["ratio_median"]) * 100, 1), 5, "%")
        verdicts.at_most("CPU per REST request the event log adds (median of pairs)",
                         round((1 - c["cpu_ratio_median"]) * 100, 1), 5, "%")
        if c["ratio_iqr"][1] - c["ratio_iqr"][0] > 0.05:
            notes.append(f"The throughput pairs' middle half ({c['ratio_iqr'][0]}–{c['ratio_iqr'][1]}) is wider "
                         "than the aim: the machine's load moved the throughput more than the log does, and "
                         "the throughput verdict says little. The CPU per request moves with it too (the fixed "
                         "background work of hub and PostgreSQL is shared by fewer requests when the throughput "
                         "drops); the statement counts are the figure no load blurs.")
    if "append" in results:
        for size, a in results["append"].items():
            if size == "recorded":
                rows += [["append", f"CPU the log adds per event recorded in a running hub ({args.rate:g} device events/s "
                          "through its Journal, no other load; this process and PostgreSQL, above idle): log on − "
                          "off, medians of 2 runs each", f"{a['log_us_per_event']} µs ({a['on_us_per_event']} − "
                          f"{a['off_us_per_event']} µs)"]]
                continue
            rows += [["append", f"CPU per event appended in batches of {size} ({a['events']} events, no other load): "
                      "the hub's process / PostgreSQL", f"{a['hub_us_per_event']} µs / {a['postgres_us_per_event']} µs"]]
    for part in ("latency", "latency-far"):
        if part in results:
            lt = results[part]
            rows += [[part, f"record → receiver's 200 at {lt['rate']:g} events/s to one endpoint, the receiver "
                      f"answering after {lt['receiver_delay_ms']:g} ms; {lt['delivered']}/{lt['events']} delivered "
                      f"({lt['requests']} requests)", f"p50 {lt['p50_ms']} ms, p99 {lt['p99_ms']} ms"]]
            verdicts.at_most(f"webhook delivery latency p99 ({part}, {lt['rate']:g} events/s)", lt["p99_ms"],
                             1000, " ms")
    if "outage" in results:
        o = results["outage"]
        rows += [["outage", f"receiver down {args.down:g} s, {args.subjects} subjects × {args.per_subject}",
                  f"{o['distinct']}/{o['events']} delivered after it came back, lost {o['lost']}, in order per "
                  f"subject: {o['in_order_per_subject']}, caught up in {o['catch_up_s']} s"]]
        verdicts.at_most("events lost to a receiver outage", o["lost"], 0)
    if "resume" in results:
        r = results["resume"]
        rows += [["resume", f"SSE stream dropped {r['drops']} times",
                  f"{r['distinct']}/{r['events']} seen, duplicates {r['duplicates']}, missing {r['missing']}, "
                  f"in order: {r['in_order']}"]]
        verdicts.at_most("SSE resume: events missed or seen twice", r["duplicates"] + r["missing"], 0)
    kept_rows, kept_aims, kept_note = ([], [], []) if args.smoke else _kept(parts)
    body = "\n".join(["## The event log, SSE resume and webhooks (bench/events.py)", "", f"`{command_line()}`", "",
                      f"{facts_line(facts)}; load average at end {loadavg()}", "", *kept_note,
                      "One hub in the bench's own process (it shares the CPU with the load and the receiver); "
                      "events recorded through the hub's Journal at a fixed rate (synthetic device load).", "",
                      md_table(["part", "what", "measured"], rows + kept_rows), "",
                      *[line for n in notes for line in (n, "")],
                      verdicts.markdown() + "".join("\n" + a for a in kept_aims), ""])
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('events', body, smoke=args.smoke)}")
    return verdicts.exit_code(broken=broken or not results)


if __name__ == "__main__":
    sys.exit(main())
