"""bench/events.py's harness: hubs in the bench's trio run, each on a fresh database of one PostgreSQL
server, and the synthetic device load (events recorded through the hub's Journal at a fixed rate)."""

from __future__ import annotations

import asyncio
import time
import uuid
from functools import partial
from pathlib import Path

import httpx
import trio

from _common import tree_cpu_seconds


class Bench:
    """Hubs in this trio run, each on a fresh database of one PostgreSQL server, with an admin PAT."""

    def __init__(self, server_dsn: str, data_dir: Path, pg_dir: Path | None = None) -> None:
        self.server_dsn, self.data_dir, self.pg_dir = server_dsn, data_dir, pg_dir
        self.count = 0

    def cpu_seconds(self) -> float:
        """CPU seconds of this process (the hub, the REST clients, the feed: every thread) and of the
        PostgreSQL server (the postmaster and its children, the backends)."""
        total = time.process_time()
        if self.pg_dir is None:
            return total
        return total + tree_cpu_seconds(int((self.pg_dir / "postmaster.pid").read_text().split()[0]))

    async def hub(self, nursery: trio.Nursery, **settings):
        import asyncpg

        from hub.auth.pat import digest, new_pat
        from hub.server import run_hub
        from hub.settings import Settings

        self.count += 1
        name = f"bench_events_{self.count}_{uuid.uuid4().hex[:6]}"
        async def create() -> None:  # asyncpg on its own loop in a thread: this run is trio's
            c = await asyncpg.connect(self.server_dsn)
            try:
                await c.execute(f"CREATE DATABASE {name}")
            finally:
                await c.close()

        await trio.to_thread.run_sync(lambda: asyncio.run(create()))
        dsn = self.server_dsn.rsplit("/", 1)[0] + "/" + name
        data_dir = self.data_dir / name
        data_dir.mkdir(parents=True)
        cfg = Settings(data_dir=data_dir, database_url=dsn, port=0, log_level="WARNING", **settings)
        services, base_url = await nursery.start(partial(run_hub, cfg))
        now = services.clock.now()
        org = await services.stores.orgs.create_org("bench", now)
        # out of the request rate limit (1,000 an hour on the standard tier), as bench/_common.py does
        await services.db.execute("UPDATE organizations SET tier = 'enterprise', rate_limit = 2000000000 "
                                  "WHERE id = $1", org["id"])
        user = await services.stores.orgs.create_user(f"bench-{uuid.uuid4().hex[:6]}@bench.local", now)
        await services.stores.orgs.add_member(org["id"], user["id"], "admin", now)
        pat_id, secret = new_pat()
        await services.stores.tokens.create_pat(pat_id, user["id"], digest(secret), now)
        headers = {"X-API-Token-ID": pat_id, "X-API-Secret-Key": secret, "X-Organization-ID": str(org["id"])}
        return services, base_url, org["id"], headers


async def _devices(client: httpx.AsyncClient, base: str, headers: dict, n: int) -> list[str]:
    out = []
    for i in range(n):
        r = await client.post(base + "/v1/devices", json={"name": f"d{i}"}, headers=headers)
        r.raise_for_status()
        out.append(r.json()["data"]["id"])
    return out


def _event(s, device_id: str, n: int) -> dict:
    from device_client.shared.clock import rfc3339
    return {"kind": "device.event.telemetry", "deviceId": device_id, "at": rfc3339(s.clock.now()),
            "payload": {"n": n}}


async def _feed(s, org_id, devices: list[str], rate: float, seconds: float, sent: dict | None = None,
                limit: int | None = None) -> int:
    """``rate`` events a second (at most ``limit``), in ticks of 10 ms, round robin over ``devices``;
    returns how many."""
    n, started = 0, trio.current_time()
    while trio.current_time() - started < seconds and (limit is None or n < limit):
        due = int((trio.current_time() - started) * rate)
        if limit is not None:
            due = min(due, limit)
        while n < due:
            if sent is not None:
                sent[n] = trio.current_time()
            s.journal.record(org_id, _event(s, devices[n % len(devices)], n))
            n += 1
        await trio.sleep(0.01)
    return n
