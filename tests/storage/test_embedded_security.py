"""The embedded PostgreSQL on a shared host: only the hub, with the generated password, gets in.

Another local user is played by ``nobody``: ``psql`` from the wheel runs as that user (the tests run
as root here) against the session's server, without a password, with a wrong one, and over the unix
socket; each is refused. The same ``psql`` with the right password gets in, which shows the refusals
are PostgreSQL's answer and not a broken harness.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path

import asyncpg
import pytest
import trio

from storage.db import Database

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from storage.embedded import PASSWORD_FILE, POSTGRES_BIN_PATH, EmbeddedPostgres

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing another local user needs root")

OTHER = pwd.getpwnam("nobody")


def psql_as_other_user(host: str, port: int, password: str | None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "PGCONNECT_TIMEOUT": "5"}
    if password is not None:
        env["PGPASSWORD"] = password
    return subprocess.run(
        [str(POSTGRES_BIN_PATH / "psql"), "-w", "-X", "-h", host, "-p", str(port), "-U", "postgres",
         "-d", "postgres", "-tAc", "SELECT 1"],
        check=False, capture_output=True, text=True, env=env, timeout=30,
        user=OTHER.pw_uid, group=OTHER.pw_gid, extra_groups=[])


def assert_other_users_refused(pg: EmbeddedPostgres) -> None:
    r = psql_as_other_user("127.0.0.1", pg.port, None)
    assert r.returncode != 0 and "no password supplied" in r.stderr, r.stdout + r.stderr
    r = psql_as_other_user("127.0.0.1", pg.port, "not-the-password")
    assert r.returncode != 0 and "password authentication failed" in r.stderr, r.stdout + r.stderr
    r = psql_as_other_user(str(pg.data_dir), pg.port, None)  # the unix socket, in the 0700 data dir
    assert r.returncode != 0 and r.stdout.strip() != "1", r.stdout + r.stderr
    r = psql_as_other_user("127.0.0.1", pg.port, pg.password)
    assert r.returncode == 0 and r.stdout.strip() == "1", "the harness itself works: " + r.stderr


@needs_root
def test_another_local_user_cannot_connect(embedded_pg):
    if embedded_pg is None:
        pytest.skip("FLEETHUB_TEST_DATABASE_URL: not our server")
    assert_other_users_refused(embedded_pg)


def test_the_password_is_private_and_never_in_the_servers_log(embedded_pg):
    if embedded_pg is None:
        pytest.skip("FLEETHUB_TEST_DATABASE_URL: not our server")
    pg = embedded_pg
    st = (pg.data_dir / PASSWORD_FILE).stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid(), "the hub's user owns it; when root, the server's system user cannot read it"
    hba = (pg.data_dir / "pg_hba.conf").read_text()
    assert "trust" not in hba.replace("no trust", "") and "scram-sha-256" in hba
    assert pg.password not in pg.log_tail(10**7)
    assert pg.password not in repr(pg) and pg.password not in pg.safe_dsn


def test_a_wrong_password_is_not_echoed(embedded_pg, caplog):
    if embedded_pg is None:
        pytest.skip("FLEETHUB_TEST_DATABASE_URL: not our server")
    wrong = "Wrong-Pass-4f1d9c"
    dsn = embedded_pg.dsn.replace(embedded_pg.password, wrong)

    async def direct() -> str:
        try:
            await asyncpg.connect(dsn, timeout=10)
        except Exception as exc:  # noqa: BLE001 - the message is what we check
            return f"{type(exc).__name__}: {exc}"
        return "connected"

    message = asyncio.run(direct())
    assert "password authentication failed" in message and wrong not in message

    async def through_the_hub() -> str:
        with trio.fail_after(30):
            db = Database(dsn, min_size=1, max_size=1)
            try:
                await db.open()
            except Exception as exc:  # noqa: BLE001
                return f"{type(exc).__name__}: {exc} {exc.__cause__!r}"
            finally:
                await db.close()
        return "opened"

    message = trio.run(through_the_hub)
    assert message != "opened" and wrong not in message and wrong not in caplog.text


def _initdb_with_trust(data_dir: Path) -> None:
    """What fleethub did before: a cluster where anybody on 127.0.0.1 is the superuser."""
    pg = EmbeddedPostgres(data_dir)
    data_dir.mkdir(parents=True)
    kwargs = pg._run_kwargs()
    if kwargs:
        from storage.embedded import _make_traversable

        _make_traversable(data_dir.parent)
        os.chown(data_dir, kwargs["user"], kwargs["group"])
    data_dir.chmod(0o700)
    subprocess.run([str(POSTGRES_BIN_PATH / "initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust",
                    "--no-sync"], check=True, capture_output=True, **kwargs)


@pytest.fixture
def shared_dir():
    """Not tmp_path: pytest resets its base directory to 0700 whenever a pytest starts, and the
    server's system user must traverse to the data dir."""
    root = Path(tempfile.mkdtemp(prefix="fleethub-test-trust-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@needs_root
def test_a_data_dir_initialised_with_trust_is_secured_on_start(shared_dir):
    data_dir = shared_dir / "pg"
    _initdb_with_trust(data_dir)
    assert "trust" in (data_dir / "pg_hba.conf").read_text()
    pg = EmbeddedPostgres(data_dir)
    pg.start()
    try:
        assert stat.S_IMODE((data_dir / PASSWORD_FILE).stat().st_mode) == 0o600
        assert_other_users_refused(pg)

        async def hub_connects() -> int:
            conn = await asyncpg.connect(pg.dsn, timeout=10)
            try:
                return await conn.fetchval("SELECT 1")
            finally:
                await conn.close()

        assert asyncio.run(hub_connects()) == 1
        # a second start keeps the password it set (nothing to migrate any more)
        password = pg.password
        pg.stop()
        again = EmbeddedPostgres(data_dir)
        again.start()
        pg = again
        assert pg.password == password
        assert asyncio.run(hub_connects()) == 1
    finally:
        pg.stop()


def test_backup_tools_get_the_password_in_their_environment_not_their_arguments():
    from hub.backup import split_password

    bare, env = split_password("postgresql://postgres:s%40cr%2Fet@127.0.0.1:5432/fleethub")
    assert bare == "postgresql://postgres@127.0.0.1:5432/fleethub" and env == {"PGPASSWORD": "s@cr/et"}
    bare, env = split_password("postgresql://app@db.example/fleethub?password=s3cret&sslmode=require")
    assert "s3cret" not in bare and "sslmode=require" in bare and env == {"PGPASSWORD": "s3cret"}
    assert split_password("postgresql://app@db.example/fleethub") == ("postgresql://app@db.example/fleethub", {})


def test_a_backup_authenticates_with_the_password(embedded_pg, db_url, tmp_path):
    from hub.backup import backup

    async def server_major() -> int:
        conn = await asyncpg.connect(db_url)
        try:
            return int(await conn.fetchval("SHOW server_version_num")) // 10000
        finally:
            await conn.close()

    out = backup(db_url, tmp_path / "t.dump", asyncio.run(server_major()))
    assert out["bytes"] > 0
