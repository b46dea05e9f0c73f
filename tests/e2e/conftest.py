from __future__ import annotations

import pytest

from tests.e2e.clitools import Proc, stop_leftover_postgres


@pytest.fixture
def procs(tmp_path):
    """Start ``fleethub`` subprocesses with ``procs(name, args, env=None)`` (env: added to the user's); whatever is still running at the
    end of the test is killed, and an embedded PostgreSQL left behind under tmp_path is stopped."""
    started: list[Proc] = []

    def start(name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, args, tmp_path / "logs", env)
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.kill()
    stop_leftover_postgres(tmp_path)
