"""``fleethub cluster --nodes 2``: nats-server, PostgreSQL, two node processes and simulated devices
spread over them; each node's /readyz names it and the devices it holds; Ctrl-C stops everything."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from tests.cluster.natstools import NATS_SERVER
from tests.e2e.clitools import postgres_of, stop_leftover_postgres
from tests.e2e.killtools import EnvProc


@pytest.fixture
def cluster_dir(tmp_path):
    yield tmp_path / "cluster"
    stop_leftover_postgres(tmp_path)


async def test_fleethub_cluster_starts_two_nodes_with_the_devices_spread_and_stops(cluster_dir, tmp_path):
    import os
    if not os.path.exists(NATS_SERVER):
        pytest.skip("nats-server is not installed (make system-deps)")
    with trio.fail_after(120):
        proc = EnvProc("cluster", ["cluster", "--nodes", "2", "--devices", "2", "--data-dir", str(cluster_dir)],
                       tmp_path / "logs", {})
        try:
            summary_path = cluster_dir / "cluster.json"
            while not summary_path.exists():
                assert proc.popen.poll() is None, proc.log_tail()
                await trio.sleep(0.2)
            summary = json.loads(summary_path.read_text())
            assert [n["id"] for n in summary["nodes"]] == ["node-1", "node-2"]
            async with httpx.AsyncClient(timeout=5) as client:
                async def held() -> list[dict]:
                    return [(await client.get(n["url"] + "/readyz")).json()["data"]["cluster"]
                            for n in summary["nodes"]]
                while True:
                    states = await held()
                    if [s["devices"] for s in states] == [1, 1]:
                        break
                    await trio.sleep(0.2)
            assert [(s["node"], s["nats"]) for s in states] == [("node-1", "connected"), ("node-2", "connected")]
            # what it prints: "the PAT is in DIR/demo.json" (owner-only), and the PAT works on every node
            demo = cluster_dir / "demo.json"
            assert oct(demo.stat().st_mode & 0o777) == "0o600"
            pat = json.loads(demo.read_text())["pat"]
            headers = {"X-API-Token-ID": pat["id"], "X-API-Secret-Key": pat["secret"],
                       "X-Organization-ID": summary["org_id"]}
            async with httpx.AsyncClient(timeout=5) as client:
                for n in summary["nodes"]:
                    r = await client.get(n["url"] + "/v1/devices", headers=headers)
                    assert r.status_code == 200 and len(r.json()["data"]) == 2, r.text
            assert await trio.to_thread.run_sync(proc.interrupt, 60) == 0, proc.log_tail()
            assert postgres_of(cluster_dir) == []
        finally:
            proc.kill()
