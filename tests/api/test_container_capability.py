"""The hello's container capability: an agent started with a container engine says so
(capabilities.containerEngine, from the engine at start); the hub sends a container version only to
such a device, and a rollout of one counts the others ineligible, with the reason, in its impact and
in its steps. A real hub and real agents; the engine is the fake one and the images are put into a
real registry with its HTTP API, so no podman is needed."""

from __future__ import annotations

import trio

from device_client.engine.fake import FakeEngine
from tests.api.test_rollouts import rollout_state
from tests.containertools import needs_registry, start_registry
from tests.hubtools import device, start_agent, start_hub, wait_for

pytestmark = needs_registry


async def test_only_devices_with_a_container_engine_get_a_container_version(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        reg = await start_registry(nursery, tmp_path / "registry", build=False)
        image = await reg.push_blank("app/web", "1")
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, registries=(reg.host,))
        fid = (await hub.call("POST", "/v1/fleets", json={"name": "edge"})).json()["data"]["id"]
        with_engine, token = await hub.provision("with-engine", fleet_id=fid)
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "a", container_engine=FakeEngine())
        without, token = await hub.provision("without-engine", fleet_id=fid)
        plain = await start_agent(nursery, hub.base_url, token, tmp_path / "b")

        assert running.agent.capabilities.containerEngine.model_dump() == {"name": "fake", "version": "1"}
        assert plain.agent.capabilities.containerEngine is None
        facts = (await device(hub, with_engine)).get("facts") or {}
        if facts:  # the device view shows the last hello's facts where it has them
            assert facts["capabilities"]["containerEngine"]["name"] == "fake"

        r = await hub.call("POST", "/v1/configurations", json={
            "name": "shop", "spec": {"containers": [{"name": "web", "image": image}]}})
        assert r.status_code == 201, r.text
        cid, vid = r.json()["data"]["id"], r.json()["data"]["version"]["id"]

        r = await hub.call("POST", "/v1/rollouts/impact", json={"fleet_id": fid, "target_version_id": vid})
        impact = r.json()["data"]
        assert impact["eligible_device_ids"] == [with_engine], impact
        [out] = impact["ineligible_devices"]
        assert out["device_id"] == without and "no container engine" in out["reason"], out

        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid})
        assert r.status_code == 201, r.text
        rid = r.json()["data"]["id"]

        async def completed():
            return (await rollout_state(hub, rid))["state"] == "completed"

        await wait_for(completed, timeout=30, interval=0.2)
        steps = {d["device_id"]: d for d in (await rollout_state(hub, rid))["devices"]}
        assert steps[with_engine]["step"] == "succeeded"
        assert steps[without]["step"] == "ineligible" and "no container engine" in steps[without]["error"]
        assert running.agent.configs.version_applied() == vid

        # assigned directly: the hub records why and sends nothing (the agent never saw the version)
        handled = plain.agent.commands.handled
        r = await hub.call("PUT", f"/v1/devices/{without}/configuration", json={"configId": cid})
        assert r.status_code == 202, r.text

        async def rejected():
            return (await device(hub, without))["configuration"]["status"] == "rejected"

        await wait_for(rejected, timeout=20, interval=0.1)
        conf = (await device(hub, without))["configuration"]
        assert "has no container engine" in conf["error"], conf
        assert plain.agent.configs.version_applied() is None
        assert plain.agent.commands.handled == handled
