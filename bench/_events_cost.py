"""bench/events.py's parts on what the event log costs: REST throughput and CPU per request with the
log on and off (switched inside one hub, or in alternating pairs of hubs), PostgreSQL statements
counted in asyncpg, and CPU per event appended."""

from __future__ import annotations

import collections
import statistics
import time

import httpx
import trio

from _common import log, percentile
from _events_harness import Bench, _devices, _event, _feed


class Statements:
    """Round trips to PostgreSQL from this process, counted where asyncpg sends them: a statement
    with arguments (``_execute``, which fetch/fetchrow/fetchval/execute use), one without (BEGIN,
    COMMIT: ``execute`` with no arguments) and an ``executemany``. A count that load cannot blur."""

    def __init__(self) -> None:
        from asyncpg.connection import Connection
        self.count = 0
        self.kinds: collections.Counter[str] = collections.Counter()
        self.Connection = Connection
        self.saved = {name: getattr(Connection, name) for name in ("_execute", "execute", "executemany")}
        counter = self

        async def _execute(conn, query, args, *a, **kw):
            counter.count += 1
            counter.kinds[counter.kind(str(query))] += 1
            return await counter.saved["_execute"](conn, query, args, *a, **kw)

        async def execute(conn, query, *args, **kw):
            if not args:
                counter.count += 1
                counter.kinds[counter.kind(query)] += 1
            return await counter.saved["execute"](conn, query, *args, **kw)

        async def executemany(conn, command, args, **kw):
            counter.count += 1
            return await counter.saved["executemany"](conn, command, args, **kw)

        for name, fn in (("_execute", _execute), ("execute", execute), ("executemany", executemany)):
            setattr(Connection, name, fn)

    @staticmethod
    def kind(query: str) -> str:
        if "event_counters" in query or "INTO events" in query:
            return "event log"
        return " ".join(query.split())[:60]

    def close(self) -> None:
        for name, fn in self.saved.items():
            setattr(self.Connection, name, fn)


async def _cost_run(bench: Bench, args, mode: str, statements: Statements) -> dict:
    async with trio.open_nursery() as nursery:
        s, base, org_id, headers = await bench.hub(nursery, event_log=(mode == "on"))
        async with httpx.AsyncClient(timeout=30) as client:
            devices = await _devices(client, base, headers, 10)
            done = 0
            stop = trio.current_time() + args.seconds

            async def caller(i: int) -> None:
                nonlocal done
                while trio.current_time() < stop:
                    r = await client.get(f"{base}/v1/devices/{devices[i % len(devices)]}", headers=headers)
                    r.raise_for_status()
                    done += 1

            appended0, statements0 = s.journal.appended, statements.count
            statements.kinds.clear()
            cpu0 = bench.cpu_seconds()
            async with trio.open_nursery() as load:
                load.start_soon(_feed, s, org_id, devices, args.rate, args.seconds)
                for i in range(args.clients):
                    load.start_soon(caller, i)
            await s.journal.wait_written()
            cpu = bench.cpu_seconds() - cpu0
            appended = s.journal.appended - appended0
            sent = statements.count - statements0
            kinds = dict(statements.kinds)
        nursery.cancel_scope.cancel()
    return _figures(args.seconds, done, cpu, appended, sent, kinds)


def _figures(seconds: float, requests: int, cpu: float, appended: int, sent: int, kinds: dict[str, int]) -> dict:
    """One mode's figures over ``seconds`` of it: rates, statements (the log's own, and the BEGIN and
    COMMIT of transactions) and CPU per request."""
    return {"seconds": round(seconds, 3), "requests_per_s": round(requests / seconds, 1), "requests": requests,
            "events_logged_per_s": round(appended / seconds, 1), "events_logged": appended,
            "statements": sent, "statements_per_request": round(sent / max(1, requests), 3),
            "log_statements": kinds.get("event log", 0),
            "begin_commit": sum(n for k, n in kinds.items() if k.startswith(("BEGIN", "COMMIT", "ROLLBACK"))),
            "cpu_ms_per_request": round(1000 * cpu / max(1, requests), 3)}


async def _sliced_run(bench: Bench, args, statements: Statements) -> dict:
    """One hub, the REST load and the event feed running throughout, the log switched on and off
    every ``--slice`` seconds in the order off, on, on, off, ... (``Journal.enabled``; at each switch to
    off what the log holds is written first, outside both modes' counts). A change of the shared
    host's speed within the run falls on both modes alike, which separate runs of 20 s do not give:
    runs of the same mode moved by a quarter between them on a busy host. Per mode: as ``_cost_run``."""
    async with trio.open_nursery() as nursery:
        s, base, org_id, headers = await bench.hub(nursery, event_log=True)
        async with httpx.AsyncClient(timeout=30) as client:
            devices = await _devices(client, base, headers, 10)
            done = 0
            totals = {m: collections.Counter() for m in ("on", "off")}
            kinds: dict[str, collections.Counter] = {m: collections.Counter() for m in ("on", "off")}
            slices = max(2, round(args.seconds / args.slice))
            slices += slices % 2
            running = True

            async def caller(i: int) -> None:
                nonlocal done
                while running:
                    r = await client.get(f"{base}/v1/devices/{devices[i % len(devices)]}", headers=headers)
                    r.raise_for_status()
                    done += 1

            async with trio.open_nursery() as load:
                load.start_soon(_feed, s, org_id, devices, args.rate, args.seconds * 2 + 60)
                for i in range(args.clients):
                    load.start_soon(caller, i)
                await trio.sleep(args.slice)  # the callers' connections made, the feed under way
                for k in range(slices):
                    mode = "on" if k % 4 in (1, 2) else "off"
                    s.journal.enabled = mode == "on"
                    if mode == "off":
                        await s.journal.wait_written()  # the last on-slice's events, counted in neither
                    started, done0, cpu0 = trio.current_time(), done, bench.cpu_seconds()
                    appended0, statements0 = s.journal.appended, statements.count
                    kinds0 = collections.Counter(statements.kinds)
                    await trio.sleep(args.slice)
                    t = totals[mode]
                    t["seconds"] += trio.current_time() - started
                    t["requests"] += done - done0
                    t["cpu"] += bench.cpu_seconds() - cpu0
                    t["events_logged"] += s.journal.appended - appended0
                    t["statements"] += statements.count - statements0
                    kinds[mode].update(collections.Counter(statements.kinds) - kinds0)
                running = False
                load.cancel_scope.cancel()
        s.journal.enabled = True
        nursery.cancel_scope.cancel()
    return {mode: _figures(t["seconds"], t["requests"], t["cpu"], t["events_logged"], t["statements"], kinds[mode])
            for mode, t in totals.items()}


async def part_cost(bench: Bench, args) -> dict:
    """``--pairs`` pairs, each one hub whose log is switched every ``--slice`` seconds
    (``_sliced_run``), or with ``--slice 0`` two fresh hubs, log off and on, the order alternating from
    pair to pair (a drift of the machine's load falls on both modes alike); each pair's ratio on/off,
    and their median and spread: the machine may be shared, and one pair says little. PostgreSQL round trips are counted
    in both modes (``Statements``): the log's extra statements per request, which no load blurs."""
    statements = Statements()
    pairs = []
    try:
        for i in range(args.pairs):
            pair = {}
            if args.slice:
                pair.update(await _sliced_run(bench, args, statements))
                log(f"cost pair {i + 1}/{args.pairs}, one hub, the log switched every {args.slice:g} s: {pair}")
            else:
                for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                    pair[mode] = await _cost_run(bench, args, mode, statements)
                    log(f"cost pair {i + 1}/{args.pairs}, log {mode}: {pair[mode]}")
            pair["ratio"] = round(pair["on"]["requests_per_s"] / pair["off"]["requests_per_s"], 4)
            pair["cpu_ratio"] = round(pair["off"]["cpu_ms_per_request"] / pair["on"]["cpu_ms_per_request"], 4)
            pairs.append(pair)
    finally:
        statements.close()
    ratios = sorted(p["ratio"] for p in pairs)
    cpu_ratios = sorted(p["cpu_ratio"] for p in pairs)

    def total(mode: str, key: str) -> int:
        return sum(p[mode][key] for p in pairs)

    # the log's own statements, and the BEGIN/COMMIT it adds (those of the rest are in both modes)
    extra = total("on", "log_statements") + max(0, total("on", "begin_commit") - total("off", "begin_commit"))
    seconds = total("on", "seconds")  # the log's own time: half of each run when it is switched
    return {"pairs": pairs, "ratio_median": round(statistics.median(ratios), 4),
            "ratio_min": ratios[0], "ratio_max": ratios[-1],
            "ratio_iqr": [round(percentile(ratios, 25), 4), round(percentile(ratios, 75), 4)],
            "cpu_ratio_median": round(statistics.median(cpu_ratios), 4),
            "cpu_ratio_iqr": [round(percentile(cpu_ratios, 25), 4), round(percentile(cpu_ratios, 75), 4)],
            "cpu_ratio_range": [cpu_ratios[0], cpu_ratios[-1]],
            "cpu_ms_per_request_median": {m: round(statistics.median(p[m]["cpu_ms_per_request"] for p in pairs), 3)
                                          for m in ("on", "off")},
            "requests_per_s_median": {m: round(statistics.median(p[m]["requests_per_s"] for p in pairs), 1)
                                      for m in ("on", "off")},
            "events_logged_per_s": round(statistics.median(p["on"]["events_logged_per_s"] for p in pairs), 1),
            "statements_per_request": {m: round(total(m, "statements") / max(1, total(m, "requests")), 3)
                                       for m in ("on", "off")},
            "log_statements_per_1000_events": round(1000 * extra / max(1, total("on", "events_logged")), 1),
            "log_statements_per_s": round(extra / seconds, 1)}


async def part_append(bench: Bench, args) -> dict:
    """What one append costs, apart from any REST load: ``--append-events`` device events written
    through ``EventLog.append`` one batch after another, at the batch size the journal reaches at
    1,000 events a second (100: one batch per ``PACE``) and at its largest (500). CPU seconds (of this process, and of
    PostgreSQL: ``Bench.cpu_seconds``) per event, which a shared machine blurs less than a rate."""
    from storage.events import new_event
    out = {}
    async with trio.open_nursery() as nursery:
        s, base, org_id, headers = await bench.hub(nursery)
        async with httpx.AsyncClient(timeout=30) as client:
            devices = await _devices(client, base, headers, 10)
        for size in (100, 500):
            count = max(2, args.append_events // size)
            records = [[_event(s, devices[i % len(devices)], i) for i in range(size)] for _ in range(count)]
            await s.stores.event_log.append([new_event(org_id, e) for e in records[0]])  # the statement prepared
            both0, mine0 = bench.cpu_seconds(), time.process_time()
            for batch in records[1:]:
                await s.stores.event_log.append([new_event(org_id, e) for e in batch])
            n = size * (count - 1)
            mine = time.process_time() - mine0
            out[str(size)] = {"events": n, "hub_us_per_event": round(1e6 * mine / n, 1),
                              "postgres_us_per_event": round(1e6 * (bench.cpu_seconds() - both0 - mine) / n, 1)}
            log(f"append, batches of {size}: {out[str(size)]}")
        nursery.cancel_scope.cancel()
    runs: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(2):
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
            runs[mode].append(await _recorded(bench, args, mode))
    on, off = statistics.median(runs["on"]), statistics.median(runs["off"])
    out["recorded"] = {"on_us_per_event": round(on, 1), "off_us_per_event": round(off, 1),
                       "log_us_per_event": round(on - off, 1), "runs": runs}
    log(f"append, recorded in a running hub: {out['recorded']}")
    return out


async def _recorded(bench: Bench, args, mode: str) -> float:
    """CPU per event (this process and PostgreSQL, above what they spend idle) while ``--rate`` device
    events a second are recorded through a running hub's Journal with the log on or off, and nothing
    else runs: what recording costs where it happens, its pacing, publishing and the append with it.
    On minus off is what the log adds per event."""
    seconds = max(2.0, args.seconds / 4)
    async with trio.open_nursery() as nursery:
        s, base, org_id, headers = await bench.hub(nursery, event_log=(mode == "on"))
        async with httpx.AsyncClient(timeout=30) as client:
            devices = await _devices(client, base, headers, 10)
        await trio.sleep(1.0)  # what the start left behind settles
        idle0 = bench.cpu_seconds()
        await trio.sleep(seconds)
        idle = (bench.cpu_seconds() - idle0) / seconds
        cpu0 = bench.cpu_seconds()
        started = trio.current_time()
        fed = await _feed(s, org_id, devices, args.rate, seconds)
        await s.journal.wait_written()
        cpu = bench.cpu_seconds() - cpu0 - idle * (trio.current_time() - started)
        nursery.cancel_scope.cancel()
    return 1e6 * cpu / max(1, fed)
