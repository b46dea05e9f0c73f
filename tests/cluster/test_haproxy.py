"""HAProxy (Debian's haproxy package) in front of three node processes: REST calls spread over the
nodes all see one hub, and a device linked through the balancer is reached from whichever node a
command lands on."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest
import trio

from tests.cluster.clustertools import seed
from tests.e2e.clitools import free_port
from tests.hubtools import start_agent

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def _config(port: int, backends: list[int]) -> str:
    servers = "\n".join(f"    server n{i} 127.0.0.1:{p} check inter 500ms" for i, p in enumerate(backends))
    return f"""global
    maxconn 256
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout tunnel 1h
frontend hub
    bind 127.0.0.1:{port}
    default_backend nodes
backend nodes
    balance roundrobin
    option httpchk GET /readyz
{servers}
"""


async def test_three_nodes_behind_haproxy_serve_one_hub(nats_server, db_url, tmp_path, nodes):
    if not shutil.os.path.exists(HAPROXY):
        pytest.skip("haproxy is not installed (make system-deps)")
    with trio.fail_after(90):
        org_id, headers = await seed(db_url, tmp_path / "hub")
        started = [nodes(name, db_url, nats_server.url) for name in ("a", "b", "c")]
        port = free_port()
        cfg = tmp_path / "haproxy.cfg"
        cfg.write_text(_config(port, [n.port for n in started]))
        proxy = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(timeout=10) as client, trio.open_nursery() as nursery:
                for n in started:
                    await n.ready(client)
                seen = set()
                with trio.fail_after(20):
                    while len(seen) < 3:  # the balancer's health checks pass for every node
                        r = await client.get(url + "/readyz")
                        if r.status_code == 200:
                            seen.add(r.json()["data"]["cluster"]["node"])
                        await trio.sleep(0.05)
                r = await client.post(url + "/v1/devices", json={"name": "edge"}, headers=headers)
                assert r.status_code == 201, r.text
                device_id, token = r.json()["data"]["id"], r.json()["data"]["token"]
                agent = await start_agent(nursery, url, token, tmp_path / "agent")  # linked through HAProxy
                answered = []
                for _ in range(60):
                    r = await client.post(f"{url}/v1/devices/{device_id}/ping", headers=headers)
                    answered.append(r.status_code)
                    if answered[-6:] == [200] * 6:  # six in a row: every node of the rotation, twice
                        break
                    await trio.sleep(0.05)
                assert answered[-6:] == [200] * 6, answered
                r = await client.get(f"{url}/v1/devices", headers=headers)
                assert [d["id"] for d in r.json()["data"]] == [device_id]
                await agent.kill()
                nursery.cancel_scope.cancel()
        finally:
            proxy.terminate()
            proxy.wait(10)
