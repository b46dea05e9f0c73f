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


async def test_a_devices_state_is_followed_over_stdio_by_either_revision(nursery, db_url, tmp_path):
    """The bridge passes a device's updates on: to a session's subscription (2025-11-25, the SDK's
    ClientSession) and to a listen stream (2026-07-28, the SDK's default ``mcp.Client``), each bridge
    process from its own subscription on the hub; a device the hub would not show is refused or left
    out."""
    import mcp_types as types
    import pytest
    from mcp import Client
    from mcp.shared.exceptions import MCPError
    from mcp.shared.subscriptions import ResourceUpdated

    from tests.hubtools import wait_for

    with trio.fail_after(150):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        dev, token = await hub.provision("pump-1")
        agent = await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
        uri = f"fleethub://devices/{dev}/state"
        missing = "fleethub://devices/00000000-0000-4000-8000-000000000000/state"
        env = pat_env(hub)
        updated: list[str] = []

        async def heard(message) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                updated.append(str(message.params.uri))

        async with stdio_client(fleethub_mcp(hub.base_url, env)) as (read, write), \
                ClientSession(read, write, message_handler=heard) as session, \
                Client(fleethub_mcp(hub.base_url, env)) as new:
            init = await session.initialize()
            assert init.capabilities.resources is not None and init.capabilities.resources.subscribe is True
            await session.subscribe_resource(uri)
            with pytest.raises(MCPError):
                await session.subscribe_resource(missing)
            assert new.session.protocol_version == "2026-07-28"
            async with new.listen(resource_subscriptions=[uri, missing]) as sub:
                assert sub.honored.resource_subscriptions == [uri]
                await agent.kill()  # the device goes offline: an event on its stream
                with trio.fail_after(30):
                    assert await sub.__anext__() == ResourceUpdated(uri=uri)
                await wait_for(lambda: uri in updated, timeout=30)
            await session.unsubscribe_resource(uri)
