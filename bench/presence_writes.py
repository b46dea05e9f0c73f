"""How many presence rows one PostgreSQL takes per second, written the way the hub writes them.

    python bench/presence_writes.py [--smoke] [--devices 100000] [--batch 250,1000] [--seconds 10]

Heartbeats are written behind (storage/behind.py): each node sends one ``UPDATE devices … FROM
unnest(…)`` of the rows gathered since its last flush (every 0.5 s). This script runs exactly that
statement (``storage.devices.Devices.write_presence``) through the hub's own bridge against the
embedded PostgreSQL, in a closed loop from ``--writers`` concurrent writers (nodes), each batch a
random sample of its own share of ``--devices`` rows (each node writes only the devices it holds), and
reports rows per second. docs/capacity.md divides the heartbeat
rate of a million devices by it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shutil
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio  # noqa: E402

from _common import OUT_DIR, Verdicts, command_line, facts_line, insert_devices, log, loadavg, machine_facts, \
    md_table, shm_tempdir, write_section  # noqa: E402


async def run(dsn: str, ids: list[uuid.UUID], batch: int, writers: int, seconds: float) -> dict:
    from storage.db import Database
    from storage.devices import Devices

    db = Database(dsn, min_size=writers, max_size=writers)
    await db.open()
    try:
        devices = Devices(db)
        rows_written = statements = 0
        started = trio.current_time()
        rng = random.Random(7)

        async def writer(own: list[uuid.UUID]) -> None:
            nonlocal rows_written, statements
            while trio.current_time() - started < seconds:
                now = dt.datetime.now(dt.timezone.utc)
                rows = [{"id": i, "online": True, "state": "online", "last_seen_at": now}
                        for i in rng.sample(own, min(batch, len(own)))]
                await devices.write_presence(rows)
                rows_written += len(rows)
                statements += 1

        async with trio.open_nursery() as nursery:
            for k in range(writers):
                # each writer its own devices, as each node writes only the devices it holds
                nursery.start_soon(writer, ids[k::writers])
        wall = trio.current_time() - started
        return {"batch": batch, "writers": writers, "seconds": round(wall, 2), "statements": statements,
                "rows": rows_written, "rows_per_s": round(rows_written / wall), "ms_per_statement":
                round(1000 * wall * writers / statements, 2) if statements else None}
    finally:
        await db.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--devices", type=int, default=100_000)
    p.add_argument("--batch", default="250,1000", help="rows per statement, one run each")
    p.add_argument("--writers", type=int, default=4, help="concurrent writers (nodes flushing at once)")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--quiet-wait", type=float, default=60.0)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.devices, args.batch, args.seconds = 2_000, "100", 2.0
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    from hub.services import start_embedded
    from storage.db import Database
    from storage.migrate import migrate

    data_dir = shm_tempdir("fleethub-bench-presence-")
    pg = start_embedded(data_dir)
    results = []
    try:
        async def setup() -> str:
            db = Database(pg.dsn, min_size=1, max_size=1)
            await db.open()
            try:
                await migrate(db)
                org = uuid.uuid4()
                await db.execute("INSERT INTO organizations (id, name, created_at) VALUES ($1, 'bench', now())", org)
                return str(org)
            finally:
                await db.close()

        org = trio.run(setup)
        ids = [uuid.UUID(d) for d, _ in insert_devices(pg.dsn, org, args.devices)]
        log(f"{len(ids):,} devices in the embedded PostgreSQL")
        for batch in [int(b) for b in args.batch.split(",")]:
            r = trio.run(run, pg.dsn, ids, batch, args.writers, args.seconds)
            results.append(r)
            log(json.dumps(r))
    finally:
        pg.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    (OUT_DIR / f"presence_writes{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(results, indent=1))
    body = "\n".join([
        "## Presence rows one PostgreSQL takes (bench/presence_writes.py)", "", f"`{command_line()}`", "",
        f"{facts_line(facts)}; load average at end {loadavg()}", "",
        f"The hub's own presence statement (`Devices.write_presence`: one `UPDATE devices … FROM unnest(…)` per "
        f"batch) over {args.devices:,} device rows in the embedded PostgreSQL, {args.writers} writers in a closed "
        f"loop (as that many nodes flushing at once, each over its own devices), each batch a random sample of them.", "",
        md_table(["rows per statement", "writers", "seconds", "statements", "rows/s", "ms per statement"],
                 [[r["batch"], r["writers"], r["seconds"], f"{r['statements']:,}", f"{r['rows_per_s']:,}",
                   r["ms_per_statement"]] for r in results]), ""])
    verdicts = Verdicts("presence_writes", smoke=args.smoke)
    body += "\n(no numeric aim: docs/capacity.md uses the figure)\n"
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('presence_writes', body, smoke=args.smoke)}")
    return verdicts.exit_code(broken=not results or any(r["statements"] == 0 for r in results))


if __name__ == "__main__":
    sys.exit(main())
