"""Long work followed with progress notifications, with the SDK's own client against a real hub and agent."""

from __future__ import annotations

import json

import httpx
import trio

from tests.api.test_rollouts import closed_window, open_window
from tests.hubtools import start_agent, start_hub, wait_for
from tests.mcp.mcptools import HEALTHY, call, fleet_with_agent, followed_quick_test, http_session, pat_headers


async def test_a_live_quick_test_reports_progress_and_ends_with_its_result(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        dev, token = await hub.provision("pump-1")
        await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
        async with http_session(hub.base_url, pat_headers(hub.pat, hub.org_id)) as mcp:
            await followed_quick_test(mcp, dev)


async def test_a_call_is_answered_by_a_json_body_unless_it_asks_for_progress(nursery, db_url, tmp_path):
    """Why: the SDK answers every POST of a session one way; hub/mcp/endpoint.py picks per request."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        rid = "00000000-0000-4000-8000-000000000000"
        head = {**pat_headers(hub.pat, hub.org_id), "Accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient(headers=head, timeout=30) as client:
            url = hub.base_url + "/v1/mcp"
            r = await client.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
            assert r.status_code == 200, r.text
            head = {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
            r = await client.post(url, headers=head, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert r.status_code == 202
            call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": {"name": "resume_rollout", "arguments": {"rollout_id": rid}}}
            r = await client.post(url, headers=head, json=call)
            assert r.headers["content-type"].startswith("application/json")
            assert r.json()["result"]["structuredContent"]["status"] == 404
            call["params"]["_meta"] = {"progressToken": "t1"}
            r = await client.post(url, headers=head, json={**call, "id": 3})
            assert r.headers["content-type"].startswith("text/event-stream")
            frames = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:") and line[5:].strip()]
            assert frames[-1]["id"] == 3 and frames[-1]["result"]["structuredContent"]["status"] == 404


async def test_a_cancel_mid_wait_ends_the_call_and_leaves_the_session_working(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        dev, token = await hub.provision("pump-1")
        await start_agent(nursery, hub.base_url, token, tmp_path / "dev")
        events = hub.services.events
        before = events.subscriber_count()
        async with http_session(hub.base_url, pat_headers(hub.pat, hub.org_id)) as mcp:
            first = trio.Event()

            started: list[str] = []

            async def progress(value: float, total: float | None, message: str | None) -> None:
                if not first.is_set():
                    started.append(message.rsplit(" ", 1)[-1])
                first.set()

            async def follow_long_test(task_status=trio.TASK_STATUS_IGNORED) -> None:
                with trio.CancelScope() as scope:
                    task_status.started(scope)
                    await mcp.call_tool("start_memory_test", {"device_id": dev, "impact": "running", "passes": 20,
                                                              "maxBytes": 64 << 20}, progress_callback=progress)
                assert scope.cancelled_caught, "the call ended before it was cancelled"

            async with trio.open_nursery() as inner:
                scope = await inner.start(follow_long_test)
                await first.wait()
                assert events.subscriber_count() == before + 1  # the hub is following the run
                scope.cancel()  # the SDK client sends notifications/cancelled
            # the hub's handler ended: its subscription is gone, and the session answers as before
            await wait_for(lambda: events.subscriber_count() == before, timeout=30)
            err, page = await call(mcp, "list_devices")
            assert not err and [d["id"] for d in page["data"]] == [dev]
            err, status = await call(mcp, "memory_test_status", device_id=dev)
            run = status["data"]["status"]  # the run goes on: only the wait ended
            assert not err and run["runId"] == started[0] and run["phase"] not in ("done", "cancelled"), status
            err, _ = await call(mcp, "cancel_memory_test", device_id=dev)
            assert not err


async def test_a_resumed_rollout_reports_its_devices_and_returns_when_it_completes(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub, dev, fleet = await fleet_with_agent(nursery, db_url, tmp_path)
        closed = closed_window(hub)
        await hub.call("PUT", f"/v1/fleets/{fleet}/update-window", json=closed)
        r = await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": {"workload": HEALTHY}})
        cid = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fleet], "configuration_id": cid})
        assert r.status_code == 201, r.text
        rid = r.json()["data"]["id"]
        async with http_session(hub.base_url, pat_headers(hub.pat, hub.org_id)) as mcp:
            err, paused = await call(mcp, "pause_rollout", rollout_id=rid)
            assert not err and paused["data"]["state"] == "paused"
            await hub.call("PUT", f"/v1/fleets/{fleet}/update-window", json=open_window(closed))
            heard: list[tuple[float, str | None]] = []

            async def progress(value: float, total: float | None, message: str | None) -> None:
                heard.append((value, message))

            result = await mcp.call_tool("resume_rollout", {"rollout_id": rid}, progress_callback=progress)
            assert not result.is_error, result
            out = result.structured_content
            assert out["ended"] is True and out["data"]["state"] == "completed", out
            assert out["data"]["counts"]["succeeded"] == 1
            values = [v for v, _ in heard]
            assert values[0] == 0.0 and values[-1] == 1.0 and values == sorted(set(values)), heard
            assert heard[-1][1].startswith("rollout completed"), heard
