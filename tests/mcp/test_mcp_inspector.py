"""The MCP Inspector's CLI (``@modelcontextprotocol/inspector``, node) lists the tools of both transports.

Run when the Inspector is installed: ``make test`` puts it under .venv/node/ (the Makefile's ``inspector``
target, with node 22 from the npm registry) and tests/mcp/inspector.sh runs it; ``FLEETHUB_MCP_INSPECTOR``
may name another ``mcp-inspector``, or one on PATH is used (it needs node >= 22.19; docs/mcp.md).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import trio

from tests.hubtools import start_hub

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = ROOT / ".venv" / "node" / "node_modules" / "@modelcontextprotocol" / "inspector" / "package.json"
INSPECTOR = (os.environ.get("FLEETHUB_MCP_INSPECTOR")
             or (str(ROOT / "tests" / "mcp" / "inspector.sh") if INSTALLED.exists() else None)
             or shutil.which("mcp-inspector"))

pytestmark = pytest.mark.skipif(INSPECTOR is None, reason="the MCP Inspector is not installed "
                                                           "(make inspector needs npm; docs/mcp.md)")


async def inspector(*args: str) -> dict:
    with trio.fail_after(90):
        done = await trio.run_process([INSPECTOR, "--cli", *args], capture_stdout=True, capture_stderr=True,
                                      check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return json.loads(done.stdout)


async def test_the_inspector_lists_the_tools_of_both_transports(nursery, db_url, tmp_path):
    with trio.fail_after(150):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        remote = await inspector(hub.base_url + "/v1/mcp", "--transport", "http", "--method", "tools/list",
                                 "--header", f"Authorization: Bearer {hub.pat[1]}",
                                 "--header", f"X-Organization-ID: {hub.org_id}")
        local = await inspector("-e", f"FLEETHUB_PAT_ID={hub.pat[0]}", "-e", f"FLEETHUB_PAT_SECRET={hub.pat[1]}",
                                "-e", f"FLEETHUB_ORG_ID={hub.org_id}", "-e", f"PYTHONPATH={ROOT}",
                                "--transport", "stdio", "--method", "tools/list", "--", sys.executable, "-m",
                                "hub.cli", "mcp", "--hub", hub.base_url)
        names = {t["name"] for t in remote["tools"]}
        assert {"list_devices", "ping_device", "start_memory_test", "pause_rollout"} <= names
        assert {t["name"] for t in local["tools"]} == names
        called = await inspector(hub.base_url + "/v1/mcp", "--transport", "http", "--method", "tools/call",
                                 "--tool-name", "list_fleets", "--header", f"Authorization: Bearer {hub.pat[1]}",
                                 "--header", f"X-Organization-ID: {hub.org_id}")
        assert called["structuredContent"]["data"] == []
