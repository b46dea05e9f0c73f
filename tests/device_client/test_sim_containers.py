"""``fleethub sim`` devices run containers on the fake engine (device_client/engine/fake.py): a simulated
fleet takes a version with containers, through the agent's whole apply, against a real hub. The
version's image is pinned from a real registry (the hub checks it at creation); nothing is pulled."""

from __future__ import annotations

import functools

import trio

from device_client.sim import run_sim
from hub.cli import build_parser
from tests.containertools import needs_registry, start_registry
from tests.hubtools import device, start_hub, wait_for

pytestmark = needs_registry

FAST = {"backoff_initial": 0.05, "backoff_max": 0.5}


def test_fleethub_sim_gives_devices_the_fake_engine_unless_told_not_to():
    parser = build_parser()
    args = parser.parse_args(["sim", "--hub", "http://127.0.0.1:8080", "--data-dir", "/tmp/x"])
    assert args.no_containers is False
    args = parser.parse_args(["sim", "--hub", "http://127.0.0.1:8080", "--data-dir", "/tmp/x", "--no-containers"])
    assert args.no_containers is True


async def test_a_simulated_fleet_takes_a_container_version(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        reg = await start_registry(nursery, tmp_path / "registry", build=False)
        image = await reg.push_blank("sim/web", "1")
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, registries=(reg.host,))
        devices = [await hub.provision(f"sim-{i}") for i in range(3)]
        agents = await nursery.start(functools.partial(
            run_sim, hub.base_url, 3, tmp_path / "sim", devices=devices, fake_containers=True,
            agent_options=FAST, workload_user=None))
        assert all(a.connected for a in agents)
        r = await hub.call("POST", "/v1/configurations", json={"name": "web", "spec": {"containers": [
            {"name": "web", "image": image, "ports": [{"port": 8080}],
             "healthCheck": {"http": {"port": 8080, "path": "/"}}}]}})
        assert r.status_code == 201, r.text
        cid, vid = r.json()["data"]["id"], r.json()["data"]["version"]["id"]
        for dev, _ in devices:
            r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid})
            assert r.status_code in (200, 202), r.text

        async def all_applied() -> bool:
            statuses = [(await device(hub, dev))["configuration"]["status"] for dev, _ in devices]
            return statuses == ["applied"] * len(devices)

        await wait_for(all_applied, timeout=60, interval=0.2)
        for agent in agents:
            running = await agent.containers.engine.containers("fleethub.managed")
            assert [c.running for c in running] == [True]
            assert running[0].labels["fleethub.version"] == vid
