"""The hub on an external PostgreSQL as docs/production.md sets one up: the distribution's server (not
the embedded one), a login role that owns its database and is no superuser, FLEETHUB_DATABASE_URL.
`fleethub serve` migrates it at start; `fleethub admin` works against it; a backup made beside the
running hub restores into it with the stopped hub, with tools of the server's own major version (the
embedded wheel's newer pg_restore sends `SET transaction_timeout`, which a server before 17 refuses)."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.e2e.clitools import api, clean_env, fleethub_exe, free_port, wait_until

SETUP = """CREATE ROLE fleethub LOGIN PASSWORD '{password}';
CREATE DATABASE fleethub OWNER fleethub ENCODING 'UTF8' TEMPLATE template0;"""


def system_postgres() -> Path | None:
    """The newest server of the distribution's own packages (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


class Server:
    """A PostgreSQL server of our own: initdb, a superuser with a password, TCP on 127.0.0.1 only."""

    def __init__(self, bindir: Path) -> None:
        self.bindir, self.port = bindir, free_port()
        self.root = Path(tempfile.mkdtemp(prefix="fleethub-extpg-"))
        self.data = self.root / "data"
        self.password = "superuser-" + os.urandom(8).hex()
        # the server refuses to run as root: as the embedded server does, use its system user then
        user = pwd.getpwnam("fleethub_pg") if os.geteuid() == 0 else None
        self.run_as = {"user": user.pw_uid, "group": user.pw_gid} if user else {}
        if user:
            os.chown(self.root, user.pw_uid, user.pw_gid)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if user:
            os.chown(pwfile, user.pw_uid, user.pw_gid)
        subprocess.run([str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=scram-sha-256",
                        f"--pwfile={pwfile}", "--no-sync"], check=True, capture_output=True, **self.run_as)
        pwfile.unlink()
        self.log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen([str(bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                                      "-k", str(self.root), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     **self.run_as)

    def url(self, user: str, password: str, database: str) -> str:
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str) -> None:
        async def run() -> None:
            deadline = time.monotonic() + 30
            while True:
                try:
                    conn = await asyncpg.connect(self.url("postgres", self.password, "postgres"), timeout=2)
                    break
                except (OSError, asyncpg.PostgresError):
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise
                    await asyncio.sleep(0.2)
            try:
                for statement in sql.split(";\n"):
                    await conn.execute(statement)
            finally:
                await conn.close()

        asyncio.run(run())

    def stop(self) -> None:
        self.proc.terminate()  # "smart" shutdown: the hub is stopped by now
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


def fleethub(args: list[str], env: dict[str, str]) -> dict:
    r = subprocess.run([fleethub_exe(), *args], capture_output=True, text=True, timeout=120,
                       env={**clean_env(), **env}, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"fleethub {' '.join(args)} -> {r.returncode}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout)


def test_serve_backup_and_restore_on_an_external_postgresql(tmp_path, procs):
    bindir = system_postgres()
    if bindir is None:
        pytest.skip("no PostgreSQL server package (/usr/lib/postgresql/N/bin/postgres)")
    server = Server(bindir)
    try:
        password = "role-" + os.urandom(8).hex()
        server.execute(SETUP.format(password=password))
        env = {"FLEETHUB_DATABASE_URL": server.url("fleethub", password, "fleethub"),
               "FLEETHUB_DATA_DIR": str(tmp_path / "hub"), "FLEETHUB_DRAIN_WINDOW": "0"}
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        serve = procs("serve", ["serve", "--port", str(port)], env=env)
        wait_until(lambda: httpx.get(base + "/readyz", timeout=2).status_code == 200, timeout=60,
                   what="the hub on the external server", proc=serve)
        log = serve.log_path.read_text()
        assert "applied migrations: 0001_foundation" in log and "embedded PostgreSQL" not in log, log
        assert password not in log

        org = fleethub(["admin", "create-org", "External Org"], env)
        fleethub(["admin", "create-user", "ops@ext.test", "--org", org["id"], "--role", "admin"], env)
        pat = fleethub(["admin", "create-pat", "ops@ext.test"], env)
        with api(base, pat, org["id"]) as c:
            assert c.post("/v1/fleets", json={"name": "kept"}).status_code == 201
        dump = tmp_path / "fleethub.dump"
        assert fleethub(["admin", "backup", str(dump)], env)["bytes"] > 0  # beside the running hub
        with api(base, pat, org["id"]) as c:
            assert c.post("/v1/fleets", json={"name": "after-backup"}).status_code == 201
        assert serve.interrupt() == 0

        assert fleethub(["admin", "restore", str(dump)], env) == {"restored": str(dump)}
        serve = procs("serve-again", ["serve", "--port", str(port)], env=env)
        wait_until(lambda: httpx.get(base + "/readyz", timeout=2).status_code == 200, timeout=60,
                   what="the hub after the restore", proc=serve)
        with api(base, pat, org["id"]) as c:
            assert {f["name"] for f in c.get("/v1/fleets").json()["data"]} == {"kept"}
        assert re.search(r"applied migrations", serve.log_path.read_text()) is None  # nothing left to apply
        assert serve.interrupt() == 0
    finally:
        server.stop()
