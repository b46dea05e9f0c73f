"""Rollouts of a container version go through the same gates as a command-line version (issue 36
item 5): an update window queues the devices until it opens, pause holds them and resume continues,
a forced rollout passes a closed window, and a device whose workload a memory test holds is deferred
until the test ends. A real hub and real agents; the engine is the fake one (nothing runs, but the
agent pulls, creates, starts and checks as with podman) and the images are in a real registry, so
these are quick. The real-podman end to end is tests/api/test_container_rollout.py."""

from __future__ import annotations

import json
import uuid

import trio

from device_client.containers import LABEL_MANAGED, engine_name
from device_client.engine.fake import FakeEngine
from tests.api.test_memtests import _agent_options, mt
from tests.api.test_rollouts import closed_window, open_window, rollout_state
from tests.containertools import needs_registry, start_registry
from tests.hubtools import start_agent, start_hub, wait_for

pytestmark = needs_registry


async def _setup(nursery, db_url, tmp_path, n: int, **agent_options):
    reg = await start_registry(nursery, tmp_path / "registry", build=False)
    image = await reg.push_blank("app/web", "1")
    hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, registries=(reg.host,))
    fid = (await hub.call("POST", "/v1/fleets", json={"name": "edge"})).json()["data"]["id"]
    engines = {}
    for i in range(n):
        dev, token = await hub.provision(f"edge-{i}", fleet_id=fid)
        engines[dev] = FakeEngine()
        await start_agent(nursery, hub.base_url, token, tmp_path / f"edge-{i}", container_engine=engines[dev],
                          **agent_options)
    r = await hub.call("POST", "/v1/configurations", json={"name": "shop", "spec": {"containers": [
        {"name": "web", "image": image, "healthCheck": {"http": {"port": 8080, "path": "/"}, "graceSeconds": 0}}]}})
    assert r.status_code == 201, r.text
    return hub, fid, engines, r.json()["data"]["id"], r.json()["data"]["version"]["id"]


async def _runs(engine: FakeEngine, vid: str) -> bool:
    return {c.name: c.running for c in await engine.containers(LABEL_MANAGED)} == {engine_name(vid, "web"): True}


async def _state(hub, rid: str) -> str:
    return (await rollout_state(hub, rid))["state"]


async def test_a_window_queues_pause_holds_and_resume_completes(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub, fid, engines, cid, vid = await _setup(nursery, db_url, tmp_path, 3)
        closed = closed_window(hub)
        assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=closed)).status_code == 200
        r = await hub.call("POST", "/v1/rollouts/impact", json={"fleet_id": fid, "target_version_id": vid})
        assert r.json()["data"]["queued_for_next_window"] == 3, r.text
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1})
        rid = r.json()["data"]["id"]

        async def queued():
            return (await rollout_state(hub, rid))["counts"]["QUEUED_MAINTENANCE"] >= 1

        await wait_for(queued, timeout=20, interval=0.1)
        assert (await hub.call("POST", f"/v1/rollouts/{rid}/pause")).json()["data"]["state"] == "paused"
        assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=open_window(closed))).status_code == 200
        await trio.sleep(1.5)  # the window is open, but a paused rollout starts nobody
        st = await rollout_state(hub, rid)
        assert st["state"] == "paused" and st["counts"]["succeeded"] == 0, st["counts"]
        assert not any([await engine.containers(LABEL_MANAGED) for engine in engines.values()])
        assert (await hub.call("POST", f"/v1/rollouts/{rid}/resume")).json()["data"]["state"] == "running"

        async def completed():
            return await _state(hub, rid) == "completed"

        await wait_for(completed, timeout=40, interval=0.2)
        assert (await rollout_state(hub, rid))["counts"]["succeeded"] == 3
        for engine in engines.values():
            assert await _runs(engine, vid)


async def test_a_forced_rollout_passes_a_closed_window(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub, fid, engines, cid, vid = await _setup(nursery, db_url, tmp_path, 2)
        assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=closed_window(hub))).status_code == 200
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "force": True})
        assert r.status_code == 201, r.text
        rid = r.json()["data"]["id"]

        async def completed():
            return await _state(hub, rid) == "completed"

        await wait_for(completed, timeout=40, interval=0.2)
        for engine in engines.values():
            assert await _runs(engine, vid)


async def test_a_device_under_a_memory_test_is_deferred_until_it_ends(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub, fid, engines, cid, vid = await _setup(nursery, db_url, tmp_path, 1, **_agent_options(budget=32 << 20))
        [(dev, engine)] = engines.items()
        r = await hub.call("POST", mt(dev), json={"impact": "stopped", "bitFade": False, "passes": 20})
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["runId"]

        # The rollout reads the hold from the device's presence row, written behind within a second of
        # the device saying so: a rollout started inside that second can reach the device first, which
        # then holds the apply until the test ends (not counted failed, but not shown as deferred).
        # Under CI's load that second stretched; the test starts the rollout once the hold is stored.
        async def held() -> bool:
            return await hub.services.db.fetchval(
                "SELECT COALESCE(facts->>'workloadHeld' = 'true', false) FROM devices WHERE id = $1",
                uuid.UUID(dev))

        await wait_for(held, timeout=20, interval=0.1)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "force": True})
        assert r.status_code == 201, r.text
        rid = r.json()["data"]["id"]

        async def deferred():
            steps = {d["device_id"]: d["step"] for d in (await rollout_state(hub, rid))["devices"]}
            return steps.get(dev) == "deferred_memory_test"

        await wait_for(deferred, timeout=20, interval=0.1)
        assert await engine.containers(LABEL_MANAGED) == [] and engine.pulls == 0, "applied during the test"
        assert (await hub.call("POST", mt(dev, "/cancel"), json={"runId": run_id})).status_code == 202

        async def completed():
            return await _state(hub, rid) == "completed"

        await wait_for(completed, timeout=40, interval=0.2)
        assert await _runs(engine, vid)


async def test_pull_progress_reaches_the_devices_event_stream(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        reg = await start_registry(nursery, tmp_path / "registry", build=False)
        image = await reg.push_blank("app/web", "1")
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, registries=(reg.host,))
        dev, token = await hub.provision("slow-pull")
        await start_agent(nursery, hub.base_url, token, tmp_path / "agent",
                          container_engine=FakeEngine(image_size=10 << 20, pull_seconds=2.0))
        r = await hub.call("POST", "/v1/configurations", json={"name": "shop", "spec": {"containers": [
            {"name": "web", "image": image}]}})
        cid = r.json()["data"]["id"]
        seen: list[dict] = []

        async def watch(task_status=trio.TASK_STATUS_IGNORED) -> None:
            async with hub.client.stream("GET", hub.base_url + f"/v1/devices/{dev}/events", headers=hub.headers) as s:
                task_status.started()
                async for line in s.aiter_lines():
                    if line.startswith("data: ") and "container.pul" in line:
                        seen.append(json.loads(line[6:]))
                        if "container.pulled" in line:
                            return

        async with trio.open_nursery() as watchers:
            await watchers.start(watch)
            r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid})
            assert r.status_code == 202, r.text
        kinds = [e.get("kind") for e in seen]
        assert kinds == ["device.event.container.pull_progress", "device.event.container.pulled"], seen
        assert seen[0]["payload"]["bytes"] == 5 << 20 and seen[0]["payload"]["rateBps"] > 0, seen[0]
