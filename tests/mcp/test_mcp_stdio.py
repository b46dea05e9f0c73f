"""``fleethub mcp`` as a real subprocess, driven over stdio by the SDK's own client, against a real hub."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.hubtools import start_agent, start_hub
from tests.mcp.mcptools import call, fleet_with_agent, followed_quick_test, operate, pat_env

ROOT = Path(__file__).resolve().parents[2]


def fleethub_mcp(hub_url: str, env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "hub.cli", "mcp", "--hub", hub_url],
                                 env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), **env})


async def test_fleethub_mcp_over_stdio(nursery, db_url, tmp_path):
    with trio.fail_after(150):
        hub, dev, fleet = await fleet_with_agent(nursery, db_url, tmp_path)
        env = pat_env(hub)
        async with stdio_client(fleethub_mcp(hub.base_url, env)) as (read, write):
            async with ClientSession(read, write) as mcp:
                init = await mcp.initialize()
                assert init.server_info.name == "fleethub"
                await operate(mcp, hub, dev, fleet)
                listed = {str(r.uri) for r in (await mcp.list_resources()).resources}
                assert "fleethub://openapi.json" in listed
                doc = await mcp.read_resource("fleethub://device-protocol/schema.json")
                assert '"$schema"' in doc.contents[0].text or "properties" in doc.contents[0].text


async def test_progress_is_passed_on_over_stdio(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        dev, token = await hub.provision("pump-1")
        await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
        env = pat_env(hub)
        async with stdio_client(fleethub_mcp(hub.base_url, env)) as (read, write):
            async with ClientSession(read, write) as mcp:
                await mcp.initialize()
                await followed_quick_test(mcp, dev)


async def test_fleethub_mcp_with_a_bearer_token_and_the_org_as_an_argument(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        dev, _ = await hub.provision("pump-2")
        async with stdio_client(fleethub_mcp(hub.base_url, {"FLEETHUB_TOKEN": hub.pat[1]})) as (read, write):
            async with ClientSession(read, write) as mcp:
                await mcp.initialize()
                err, page = await call(mcp, "list_devices")
                assert err and page["error"] == "missing_organization"
                err, page = await call(mcp, "list_devices", organization_id=hub.org_id)
                assert not err and [d["id"] for d in page["data"]] == [dev]


async def test_the_sdks_default_client_over_stdio(nursery, db_url, tmp_path):
    """``mcp.Client`` in its default mode, as a new user writes it: it probes ``server/discover`` over stdio
    and speaks the stateless revision with the bridge, which speaks a session's revision with the
    hub: the tools work across the two."""
    from mcp import Client
    with trio.fail_after(150):
        hub, dev, fleet = await fleet_with_agent(nursery, db_url, tmp_path)
        env = pat_env(hub)
        async with Client(fleethub_mcp(hub.base_url, env)) as mcp:
            assert mcp.session.protocol_version == "2026-07-28"
            await operate(mcp, hub, dev, fleet)
