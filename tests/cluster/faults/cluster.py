"""The fault suite's cluster: one private embedded PostgreSQL, one nats-server, N ``fleethub serve``
node processes on fixed ports (a killed node comes back where its agents look for it), and what the
nemesis does to each of them. Every server binds 127.0.0.1."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import trio

from storage.db import Database
from storage.embedded import EmbeddedPostgres
from tests.api.test_db_freeze import server_pids, signal_all
from tests.cluster.natstools import NatsServer
from tests.e2e.killtools import EnvProc
from tests.ports import free_port
from tests.proctools import sigstop

# Every rollout write, with the node whose connection made it (application_name, storage/db.py) and
# the lease's owner in that very transaction: the checker's "no write after a lease was lost".
# Test-only SQL on the suite's private database, not a migration.
WRITES_SQL = """
CREATE TABLE fault_writes (at timestamptz NOT NULL DEFAULT clock_timestamp(), rollout_id uuid NOT NULL,
                           writer text NOT NULL, owner text);
CREATE FUNCTION fault_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE rid uuid := COALESCE(to_jsonb(NEW)->>'rollout_id', to_jsonb(NEW)->>'id')::uuid;
BEGIN
  INSERT INTO fault_writes (rollout_id, writer, owner)
    VALUES (rid, current_setting('application_name'), (SELECT owner FROM rollout_leases WHERE rollout_id = rid));
  RETURN NEW;
END $$;
CREATE TRIGGER fault_write_rollouts AFTER UPDATE ON rollouts FOR EACH ROW EXECUTE FUNCTION fault_write();
CREATE TRIGGER fault_write_steps AFTER UPDATE ON rollout_devices FOR EACH ROW EXECUTE FUNCTION fault_write();
"""


class FaultNode:
    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name, self.env, self.log_dir = name, env, log_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: EnvProc | None = None
        self.starts = 0

    def start(self, **extra: str) -> None:
        self.starts += 1
        self.proc = EnvProc(f"node-{self.name}-{self.starts}", ["serve", "--port", str(self.port),
                                                                  "--node-id", self.name],
                            self.log_dir, {**self.env, **extra})

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.popen.poll() is None:
            if sig == signal.SIGSTOP:
                sigstop(self.proc.popen.pid)  # returns once it has stopped
            else:
                os.kill(self.proc.popen.pid, sig)

    async def kill(self) -> None:
        self.signal(signal.SIGCONT)  # a stopped process dies on SIGKILL too; this only makes it prompt
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            await trio.to_thread.run_sync(self.proc.popen.wait, 10)

    async def ready(self, client: httpx.AsyncClient, timeout: float = 60) -> None:
        with trio.fail_after(timeout):
            while True:
                assert self.proc is not None and self.proc.popen.poll() is None, f"node {self.name} exited"
                try:
                    if (await client.get(self.url + "/readyz", timeout=2)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.2)


class FaultCluster:
    def __init__(self, root: Path, nodes: int, env: dict[str, str]) -> None:
        self.root = root
        self.pg = EmbeddedPostgres(root / "pg", port=free_port())
        self.nats = NatsServer(free_port())
        self.data_dir = root / "hub"
        self.env = {"FLEETHUB_NATS_URL": self.nats.url, "FLEETHUB_DATA_DIR": str(self.data_dir), **env}
        self.nodes = [FaultNode(f"n{i + 1}", self.env, root / "logs") for i in range(nodes)]
        self.frozen: list[int] = []
        self.db: Database | None = None

    async def start(self, client: httpx.AsyncClient) -> None:
        await trio.to_thread.run_sync(self.pg.start)
        self.env["FLEETHUB_DATABASE_URL"] = self.pg.dsn
        await trio.to_thread.run_sync(self.nats.start)

    async def open_observer(self) -> Database:
        """The suite's own connection (bounded calls: a frozen server costs a sample, not the run)."""
        self.db = Database(self.pg.dsn, min_size=0, max_size=3, connect_timeout=2, statement_timeout=2,
                           call_timeout=2.5, application_name="fault-observer")
        await self.db.open()
        await self.db.execute(WRITES_SQL)
        return self.db

    async def start_nodes(self, client: httpx.AsyncClient) -> None:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            await node.ready(client)

    def node_of(self, url: str) -> str | None:
        return next((n.name for n in self.nodes if url.startswith(n.url)), None)

    # -- faults: each returns the undo ---------------------------------------------------------------

    def freeze_postgres(self) -> None:
        self.frozen = server_pids(self.pg.data_dir)
        signal_all(self.frozen, signal.SIGSTOP)

    def thaw_postgres(self) -> None:
        signal_all(self.frozen, signal.SIGCONT)
        self.frozen = []

    async def stop_postgres(self) -> None:
        await trio.to_thread.run_sync(self.pg.stop)

    async def restart_postgres(self) -> None:
        await trio.to_thread.run_sync(self.pg.start)

    def stop_nats(self) -> None:
        assert self.nats.proc is not None
        sigstop(self.nats.proc.pid)  # returns once it has stopped

    def resume_nats(self) -> None:
        assert self.nats.proc is not None
        os.kill(self.nats.proc.pid, signal.SIGCONT)

    async def kill_nats(self) -> None:
        assert self.nats.proc is not None
        self.nats.proc.kill()
        await trio.to_thread.run_sync(self.nats.proc.wait)

    async def restart_nats(self) -> None:
        await trio.to_thread.run_sync(self.nats.start)

    async def close(self) -> None:
        self.thaw_postgres()
        if self.nats.proc is not None:
            self.resume_nats()
        for node in self.nodes:
            await node.kill()
        if self.db is not None:
            await self.db.close()
        await trio.to_thread.run_sync(self.nats.stop)
        await trio.to_thread.run_sync(self.pg.stop)
