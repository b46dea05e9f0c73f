"""A receiver written in Node from docs/events.md alone (tests/api/webhook_receiver.js, with the
`standardwebhooks` npm package) verifies the signatures of a real rollout's events, and refuses a
forged one. Needs `node` and the package: ``make test`` installs it under .venv/node/ (the Makefile's
``inspector`` target) when npm is there, or FLEETHUB_TEST_NODE_PATH names another node_modules; without
them the test is skipped, saying so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

from tests.api.test_rollouts import HEALTHY, config, fleet_with_agents, rollout_state
from tests.hubtools import start_hub, wait_for

RECEIVER = Path(__file__).with_name("webhook_receiver.js")
INSTALLED = Path(__file__).resolve().parents[2] / ".venv" / "node" / "node_modules"  # make inspector


def _node_env() -> dict[str, str] | None:
    node = shutil.which("node")
    if node is None:
        return None
    env = {**os.environ}
    if os.environ.get("FLEETHUB_TEST_NODE_PATH"):
        env["NODE_PATH"] = os.environ["FLEETHUB_TEST_NODE_PATH"]
    elif (INSTALLED / "standardwebhooks").exists():
        env["NODE_PATH"] = str(INSTALLED)
    found = subprocess.run([node, "-e", "require('standardwebhooks')"], env=env, capture_output=True, timeout=30)
    return env if found.returncode == 0 else None


async def test_a_node_receiver_written_from_the_docs_verifies_a_rollouts_events(nursery, db_url, tmp_path):
    env = _node_env()
    if env is None:
        pytest.skip("node with the standardwebhooks package is not installed (make inspector needs npm)")
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, webhooks_allow_private=True)
        r = await hub.call("POST", "/v1/webhooks", json={"url": "http://127.0.0.1:9/not-yet",
                                                         "event_types": ["io.fleethub.rollout.*"]})
        assert r.status_code == 201, r.text
        endpoint = r.json()["data"]
        lines: list[dict] = []
        process = await trio.lowlevel.open_process(["node", str(RECEIVER), endpoint["secret"]], env=env,
                                                   stdout=subprocess.PIPE)
        try:
            async def read() -> None:
                buffer = b""
                async for chunk in process.stdout:
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        lines.append(json.loads(line))

            nursery.start_soon(read)
            await wait_for(lambda: lines, timeout=30)
            url = f"http://127.0.0.1:{lines[0]['port']}/hook"
            r = await hub.call("PATCH", f"/v1/webhooks/{endpoint['id']}", json={"url": url})
            assert r.status_code == 200, r.text
            fid, _ = await fleet_with_agents(hub, nursery, tmp_path, 2)
            cid, _ = await config(hub, "app", HEALTHY)
            r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid,
                                                             "batch_size": 1})
            rid = r.json()["data"]["id"]

            def completed() -> bool:
                return any(e.get("type") == "io.fleethub.rollout.state" and e["data"]["state"] == "completed"
                           for e in lines[1:])

            await wait_for(completed, timeout=90, interval=0.2)
            assert (await rollout_state(hub, rid))["state"] == "completed"
            got = lines[1:]
            assert all(e["ok"] for e in got), got
            assert {e["subject"] for e in got} == {f"rollouts/{rid}"}
            assert [int(e["sequence"]) for e in got] == sorted(int(e["sequence"]) for e in got)
            assert {e["type"] for e in got} == {"io.fleethub.rollout.state", "io.fleethub.rollout.progress"}
            # a forged delivery (a signature under another secret) is refused by the same receiver
            async with httpx.AsyncClient() as client:
                forged = await client.post(url, content=b'{"id":"x"}', headers={
                    "webhook-id": "x", "webhook-timestamp": str(int(hub.services.clock.now().timestamp())),
                    "webhook-signature": "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="})
            assert forged.status_code == 400
            await wait_for(lambda: lines[-1].get("ok") is False, timeout=10)
        finally:
            process.kill()
            await process.wait()
