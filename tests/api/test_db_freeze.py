"""A frozen PostgreSQL (every process of the server SIGSTOPped: a paused VM, a stalled disk) answers
nothing, not even a cancel request. Requests must still answer 503 database_unavailable within the
storage call bound, /readyz within a second, and the hub must serve again once the server thaws
(issue 38 item 5: requests hung 18.8 s until the thaw, /readyz took 12 s)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import trio

from storage.db import Database, DatabaseUnavailable
from storage.embedded import EmbeddedPostgres
from tests.hubtools import assert_error, start_hub, wait_for
from tests.ports import free_port
from tests.proctools import wait_stopped

# What the test holds the hub to, with the default settings (db_call_timeout 4.5 s).
REQUEST_BOUND = 5.0
READY_BOUND = 1.0


def server_pids(data_dir: Path) -> list[int]:
    """The postmaster (first line of its pid file) and every process it started (backends, walwriter,
    checkpointer...): freezing only the postmaster would leave the backends answering."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # the name in parentheses may hold spaces: the parent pid is the second field after it
        if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
            pids.append(int(entry.name))
    return pids


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    """A SIGSTOP returns once every process has stopped (tests/proctools.py says why)."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    if sig == signal.SIGSTOP:
        wait_stopped(pids)


async def timed_get(hub, path: str) -> tuple[object, float]:
    started = time.monotonic()
    r = await hub.call("GET", path)
    return r, time.monotonic() - started


async def test_frozen_database_answers_503_in_bounded_time(nursery, tmp_path):
    # A private server: the suite's shared one (tests/conftest.py) must not freeze under other tests.
    pg = EmbeddedPostgres(tmp_path / "pg", port=free_port())
    await trio.to_thread.run_sync(pg.start)
    frozen: list[int] = []
    try:
        with trio.fail_after(120):
            hub = await start_hub(nursery, pg.dsn, tmp_path / "hub")
            assert (await hub.call("GET", "/v1/devices?limit=5")).status_code == 200

            frozen = server_pids(pg.data_dir)
            assert len(frozen) > 1, "the backends were not found"
            signal_all(frozen, signal.SIGSTOP)

            r, took = await timed_get(hub, "/readyz")
            assert r.status_code == 503 and r.json()["error"] == "not_ready", r.text
            assert took < READY_BOUND, f"/readyz took {took:.2f}s"
            for _ in range(2):  # the pooled connection dropped by the first makes the second connect anew
                r, took = await timed_get(hub, "/v1/devices?limit=5")
                assert_error(r, 503, "database_unavailable")
                assert took < REQUEST_BOUND, f"GET /v1/devices took {took:.2f}s"
            assert pg.dsn not in r.text  # it holds the password

            signal_all(frozen, signal.SIGCONT)
            frozen = []

            async def ready() -> bool:
                return (await hub.client.get(hub.base_url + "/readyz")).status_code == 200
            await wait_for(ready, timeout=20)
            assert (await hub.call("GET", "/v1/devices?limit=5")).status_code == 200
            r = await hub.call("POST", "/v1/fleets", json={"name": "after-the-thaw"})
            assert r.status_code == 201, r.text
    finally:
        signal_all(frozen, signal.SIGCONT)
        await trio.to_thread.run_sync(pg.stop)


@pytest.mark.parametrize("statement_timeout, call_timeout", [(0.3, 10.0), (10.0, 0.3)])
async def test_a_slow_statement_is_cut_by_either_bound(db_url, statement_timeout, call_timeout):
    # The server's statement_timeout (a live, slow server) and the hub's own bound on the call, which
    # drops the connection (what a frozen server needs), each give DatabaseUnavailable; the pool then
    # serves the next call as usual.
    db = Database(db_url, min_size=1, max_size=1, statement_timeout=statement_timeout,
                  call_timeout=call_timeout)
    with trio.fail_after(30):
        await db.open()
        try:
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable):
                await db.run(lambda conn: conn.execute("SELECT pg_sleep(3)"), transaction=True)
            assert time.monotonic() - started < 1.5
            assert await db.fetchval("SELECT 2") == 2
        finally:
            await db.close()
