"""The SDK's own MCP client (``mcp.ClientSession``) against a hub's /v1/mcp, for the tests and bench."""

from __future__ import annotations

import json
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.api.test_rollouts import closed_window
from tests.hubtools import start_agent, start_hub, wait_for

if TYPE_CHECKING:
    from hub.mcp.endpoint import McpEndpoint


async def fleet_with_agent(nursery: Any, db_url: str, tmp_path: Any) -> tuple[Any, str, str]:
    """(hub, device id, fleet id): a hub with one fleet and one device in it, its agent connected."""
    hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
    fleet = (await hub.call("POST", "/v1/fleets", json={"name": "edge"})).json()["data"]["id"]
    dev, token = await hub.provision("pump-1", fleet_id=fleet)
    await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
    return hub, dev, fleet


def pat_env(hub: Any) -> dict[str, str]:
    """The environment ``fleethub mcp`` authenticates from: the hub's PAT and organisation."""
    return {"FLEETHUB_PAT_ID": hub.pat[0], "FLEETHUB_PAT_SECRET": hub.pat[1], "FLEETHUB_ORG_ID": hub.org_id}


def endpoint_of(hub: Any) -> "McpEndpoint":
    """The hub's ``/v1/mcp`` endpoint (hub/mcp/endpoint.py), whose bookkeeping the tests read."""
    return hub.services.mcp


def pat_headers(pat: tuple[str, str], org_id: str | None) -> dict[str, str]:
    """A PAT in its bearer form: what an MCP client configured with one header sends."""
    out = {"Authorization": f"Bearer {pat[1]}"}
    if org_id is not None:
        out["X-Organization-ID"] = org_id
    return out


@asynccontextmanager
async def http_session(base_url: str, headers: dict[str, str], **session: Any):
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as client:
        async with streamable_http_client(base_url + "/v1/mcp", http_client=client) as streams:
            async with ClientSession(streams[0], streams[1], **session) as mcp:
                await mcp.initialize()
                yield mcp


@asynccontextmanager
async def stateless_client(base_url: str, headers: dict[str, str]):
    """The SDK's high-level client as a new user writes it: ``mcp.Client(url transport)`` in its default
    mode, which probes ``server/discover`` and speaks the stateless revision (2026-07-28) when the
    server answers it, as this hub does."""
    from mcp import Client
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as client:
        async with Client(streamable_http_client(base_url + "/v1/mcp", http_client=client)) as mcp:
            yield mcp


async def call(session: Any, name: str, **arguments: Any) -> tuple[bool, dict]:
    """(is_error, the structured answer) of one tool call."""
    result = await session.call_tool(name, arguments)
    if result.structured_content is not None:
        return bool(result.is_error), result.structured_content
    return bool(result.is_error), json.loads(result.content[0].text)


HEALTHY = {"command": [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
           "healthCheck": {"timeoutSeconds": 2, "graceSeconds": 0.2}}


async def operate(mcp: Any, hub: Any, dev: str, fleet: str) -> None:
    """What the issue asks of either transport: list tools and devices, ping, a Live Quick memory test
    and its result, operator_required for a test boot, a rollout paused."""
    tools = {t.name: t for t in (await mcp.list_tools()).tools}
    assert {"list_devices", "ping_device", "start_memory_test", "pause_rollout"} <= set(tools)
    assert tools["list_devices"].annotations.read_only_hint is True
    assert tools["reboot_device"].annotations.destructive_hint is True
    assert tools["list_devices"].output_schema["required"] == ["data"]

    err, page = await call(mcp, "list_devices")
    assert not err and [d["id"] for d in page["data"]] == [dev]
    assert page["pagination"]["limit"] == 20

    err, pong = await call(mcp, "ping_device", device_id=dev)
    assert not err and pong["data"]["deviceId"] == dev and pong["data"]["roundTripMs"] >= 0

    err, started = await call(mcp, "start_memory_test", device_id=dev, impact="running", quick=True,
                              maxBytes=1 << 20)
    assert not err, started
    run_id = started["data"]["runId"]

    async def finished() -> bool:
        err, status = await call(mcp, "memory_test_status", device_id=dev)
        assert not err, status
        return any(r.get("runId") == run_id for r in status["data"]["history"])

    await wait_for(finished, timeout=60, interval=0.3)
    err, results = await call(mcp, "memory_test_results", device_id=dev)
    assert not err and results["data"]["results"][0]["runId"] == run_id

    # a test boot is refused as the spec says, as a tool error
    err, refused = await call(mcp, "start_memory_test", device_id=dev, impact="stopped", placement="offline")
    assert err and refused["status"] == 403 and refused["error"] == "operator_required"

    # a rollout held by a closed window, paused through MCP
    await hub.call("PUT", f"/v1/fleets/{fleet}/update-window", json=closed_window(hub))
    r = await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": {"workload": HEALTHY}})
    cid = r.json()["data"]["id"]
    r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fleet], "configuration_id": cid})
    assert r.status_code == 201, r.text
    rid = r.json()["data"]["id"]
    err, paused = await call(mcp, "pause_rollout", rollout_id=rid)
    assert not err and paused["data"]["state"] == "paused"



async def followed_quick_test(mcp: Any, dev: str) -> list[tuple[float, float | None, str | None]]:
    """A Live Quick memory test started with a progressToken: progress notifications, rising, then the
    call's own answer once the run has ended, with the run in the device's history."""
    heard: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        heard.append((value, total, message))

    result = await mcp.call_tool("start_memory_test", {"device_id": dev, "impact": "running", "quick": True,
                                                       "maxBytes": 1 << 20}, progress_callback=progress)
    assert not result.is_error, result
    out = result.structured_content
    run_id = out["started"]["runId"]
    assert out["ended"] is True
    assert any(r.get("runId") == run_id for r in out["data"]["history"]), out
    values = [v for v, _, _ in heard]
    assert len(values) >= 2 and values == sorted(set(values)), heard  # each above the one before
    assert values[0] == 0.0 and values[-1] == 1.0 and all(t == 1.0 for _, t, _ in heard)
    assert "memory test" in heard[-1][2]
    return heard
