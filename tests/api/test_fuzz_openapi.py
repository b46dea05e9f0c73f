"""schemathesis against /v1/openapi.json on a real hub, authenticated, every operation: no 5xx, and
every response matches the documented status codes, content type and schema.

CI runs a bounded number of examples per operation (FLEETHUB_FUZZ_EXAMPLES, default 4) within a time
budget (FLEETHUB_FUZZ_SECONDS, default 90); a larger run by hand is the same test with larger values
(docs/operations.md). Server-sent event streams are left
out (they stream until the client goes away) and so is the device WebSocket.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import trio

from tests.hubtools import start_agent, start_hub

EXAMPLES = int(os.environ.get("FLEETHUB_FUZZ_EXAMPLES", "4"))
MAX_TIME = int(os.environ.get("FLEETHUB_FUZZ_SECONDS", "90"))
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
EXCLUDE = r"/events$|/progress$|/stream$|/device/link$|/signal$"


CPYTHON_AST_RACE = "AST constructor recursion depth mismatch"


def st_exe() -> str:
    exe = Path(sys.executable).parent / "st"
    found = str(exe) if exe.exists() else shutil.which("st")
    assert found, "schemathesis (the `st` command) is not installed: it is in the test extra of pyproject.toml"
    return found


async def fuzz(hub, tmp_path, *, examples: int = EXAMPLES, max_time: int = MAX_TIME,
               exclude: str = EXCLUDE) -> trio.CompletedProcess:
    s = hub.services
    # enough requests for the run: the fuzzer is one caller of one organisation
    await s.db.execute("UPDATE organizations SET tier = 'enterprise', rate_limit = 100000000 WHERE id = $1::uuid",
                       hub.org_id)
    await s.invalidate(f"org:{hub.org_id}")
    args = [st_exe(), "run", f"{hub.base_url}/v1/openapi.json",
            "-H", f"X-API-Token-ID: {hub.pat[0]}", "-H", f"X-API-Secret-Key: {hub.pat[1]}",
            "-H", f"X-Organization-ID: {hub.org_id}",
            "--checks", CHECKS, "--phases", "examples,coverage,fuzzing", "-n", str(examples),
            "--max-time", str(max_time), "--request-timeout", "20", "--warnings", "off",
            "--exclude-path-regex", exclude, "--seed", "1", "--workers", "2",
            "--generation-allow-x00", "false"]
    return await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False,
                                  cwd=str(tmp_path), env={**os.environ, "NO_COLOR": "1"})


async def test_every_operation_keeps_its_documented_contract(nursery, db_url, tmp_path):
    with trio.fail_after(2 * MAX_TIME + 120):  # room for the one rerun below
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        r = await hub.call("POST", "/v1/fleets", json={"name": "fuzz-fleet"})
        fleet_id = r.json()["data"]["id"]
        _, token = await hub.provision("fuzz-device", fleet_id=fleet_id)
        await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        await hub.call("POST", "/v1/configurations", json={"name": "fuzz-config", "spec": {"a": 1}})
        result = await fuzz(hub, tmp_path)
        out = result.stdout.decode(errors="replace")
        if result.returncode != 0 and CPYTHON_AST_RACE in out:
            # CPython gh-106905 (tests/astparse.py) inside schemathesis: hypothesis parses a lambda's
            # source to describe it while st's other worker thread compiles, and the run stops with a
            # runtime error, not a finding (CI25: 6,296 cases generated, 6,296 passed). Run it again.
            result = await fuzz(hub, tmp_path)
            out = result.stdout.decode(errors="replace")
        assert result.returncode == 0, out[-12000:] + result.stderr.decode(errors="replace")[-2000:]
        assert "Tested:" in out, out[-3000:]
