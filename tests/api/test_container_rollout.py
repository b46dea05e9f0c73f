"""End to end: a real hub, real agents running podman, a real registry. A two-container version rolls out
to a fleet and passes its HTTP health check; version 2 fails its health check on the canary, which rolls
back to version 1's containers (they keep serving) and counts as failed, as a command-line workload
does. The configuration's secret file reaches the containers, read-only."""

from __future__ import annotations

import base64

import httpx
import trio

from device_client.containers import LABEL_MANAGED, engine_name
from tests.api.test_rollouts import rollout_state
from tests.containertools import needs_containers, podman, remove_everything, start_registry
from tests.hubtools import device, start_agent, start_hub, wait_for

pytestmark = needs_containers

TOKEN = "/var/lib/fleethub/secrets/app-token"


def containers(web_image: str, api_image: str, web_check_path: str) -> list[dict]:
    return [
        {"name": "web", "image": web_image, "resources": {"memoryMiB": 64, "cpus": 0.5},
         "healthCheck": {"http": {"port": 8080, "path": web_check_path}, "timeoutSeconds": 8, "graceSeconds": 0.3}},
        {"name": "api", "image": api_image, "env": {"PORT": "8081"}, "restartPolicy": "on-failure",
         "healthCheck": {"command": ["/bin/wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8081/"],
                         "timeoutSeconds": 8, "graceSeconds": 0.3}},
    ]


async def served(engine, name: str, port: int) -> str:
    address = await engine.address(name)
    async with httpx.AsyncClient(timeout=3) as client:
        return (await client.get(f"http://{address}:{port}/")).text


async def test_a_container_version_rolls_out_and_a_failing_one_rolls_back(nursery, db_url, tmp_path):
    engines = []
    try:
        with trio.fail_after(240):
            reg = await start_registry(nursery, tmp_path / "registry")
            web = await reg.push("app/web", "1", files={"/www/index.html": b"web v1\n"})
            api = await reg.push("app/api", "1", files={"/www/index.html": b"api v1\n"})
            hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5,
                                  registries=(reg.host,))
            fid = (await hub.call("POST", "/v1/fleets", json={"name": "edge"})).json()["data"]["id"]
            agents = {}
            for i in range(2):
                dev, token = await hub.provision(f"edge-{i}", fleet_id=fid)
                engines.append(podman(tmp_path / f"podman-{i}"))
                agents[dev] = (await start_agent(nursery, hub.base_url, token, tmp_path / f"edge-{i}",
                                                 container_engine=engines[-1]), engines[-1])

            r = await hub.call("POST", "/v1/configurations", json={
                "name": "shop", "spec": {"containers": containers(web, api, "/")}})
            assert r.status_code == 201, r.text
            cid, v1 = r.json()["data"]["id"], r.json()["data"]["version"]["id"]
            r = await hub.call("POST", f"/v1/configurations/{cid}/secret-files", json={
                "path": TOKEN, "content_base64": base64.b64encode(b"t0ken").decode(), "mode": "0440"})
            assert r.status_code == 201, r.text
            r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid,
                                                             "batch_size": 1})
            assert r.status_code == 201, r.text
            rid = r.json()["data"]["id"]

            async def completed():
                return (await rollout_state(hub, rid))["state"] == "completed"

            await wait_for(completed, timeout=120, interval=0.3)
            for dev, (running, engine) in agents.items():
                assert (await device(hub, dev))["configuration"]["applied_version_id"] == v1
                assert await served(engine, engine_name(v1, "web"), 8080) == "web v1\n"
                assert await served(engine, engine_name(v1, "api"), 8081) == "api v1\n"
                code, out = await engine.exec(engine_name(v1, "api"), ["/bin/cat", TOKEN], 10)
                assert (code, out) == (0, "t0ken")
                code, _ = await engine.exec(engine_name(v1, "api"), ["/bin/sh", "-c", f"echo x > {TOKEN}"], 10)
                assert code != 0, "a container could write to the secrets directory"

            # version 2: web's health check asks for a page that is not there
            r = await hub.call("POST", f"/v1/configurations/{cid}/versions", json={
                "spec": {"containers": containers(web, api, "/missing")}})
            assert r.status_code == 201, r.text
            v2 = r.json()["data"]["id"]
            r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid,
                                                             "batch_size": 1})
            rid = r.json()["data"]["id"]

            async def stopped():
                return (await rollout_state(hub, rid))["state"] in ("paused", "failed")

            await wait_for(stopped, timeout=120, interval=0.3)
            steps = {d["device_id"]: d["step"] for d in (await rollout_state(hub, rid))["devices"]}
            canary = next(dev for dev, step in steps.items() if step == "failed")
            conf = (await device(hub, canary))["configuration"]
            assert (conf["version_id"], conf["applied_version_id"], conf["status"]) == (v2, v1, "rejected"), conf
            assert "GET :8080/missing answered 404" in conf["error"], conf
            for dev, (running, engine) in agents.items():
                names = {c.name: c.running for c in await engine.containers(LABEL_MANAGED)}
                assert names == {engine_name(v1, "web"): True, engine_name(v1, "api"): True}, (dev, names)
                assert await served(engine, engine_name(v1, "web"), 8080) == "web v1\n"
                assert running.agent.configs.version_applied() == v1
    finally:
        with trio.CancelScope(shield=True):
            for engine in engines:
                await remove_everything(engine)
