"""Real agents pulling with podman through the hub's registry proxy (device_client/pullroute.py):

- fallback: the registry refuses the device (podman's connections are dropped by the relay in front
  of it) while the hub still reaches it; the version is applied with the image pulled through the hub;
- always, the fleet's setting (``registry_proxy_mode``, sent with the version; the agent keeps its
  default flag): a device of that fleet pulls through the hub though the registry is up, podman never
  connects to the registry, and the hub's cache serves it, so the registry gives each blob once for
  both devices; when the hub cannot fetch a new version's image, the pull fails with an error naming
  the proxy, and podman still has not connected to the registry.

A fleet with the proxy off is refused by the hub (tests/api/test_registry_proxy.py); the agent's error
then names both reasons (tests/device_client/test_pullroute.py). With podman that case did not settle
within 120 s here (podman retries the unreachable registry, and again after the mirror's refusal), so it
is not run with podman.
"""

from __future__ import annotations

import trio

from device_client.containers import LABEL_MANAGED, engine_name
from tests.containertools import (
    needs_containers,
    podman,
    remove_everything,
    start_registry,
)
from tests.hubtools import device, start_agent, start_hub, wait_for
from tests.registrytools import start_relay

pytestmark = needs_containers


async def test_devices_fall_back_to_the_proxy_or_use_it_always(nursery, db_url, tmp_path):
    engines = []
    try:
        with trio.fail_after(300):
            reg = await start_registry(nursery, tmp_path / "registry")
            await reg.push("app/web", "1", files={"/www/index.html": b"via the hub\n"})
            relay = await start_relay(nursery, int(reg.host.rsplit(":", 1)[1]))
            hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, registries=(relay.host,))
            proxied = (await hub.call("POST", "/v1/fleets", json={"name": "proxied", "registry_proxy": True})).json()["data"]["id"]
            r = await hub.call("POST", "/v1/configurations", json={"name": "web", "spec": {"containers": [
                {"name": "web", "healthCheck": {"http": {"port": 8080, "path": "/"}, "timeoutSeconds": 8,
                                                "graceSeconds": 0.3},
                 "image": f"{relay.host}/app/web:1"}]}})
            assert r.status_code == 201, r.text
            cid, v1 = r.json()["data"]["id"], r.json()["data"]["version"]["id"]

            async def agent(name: str, fleet: str, mode: str):
                dev, token = await hub.provision(name, fleet_id=fleet)
                engines.append(podman(tmp_path / f"podman-{name}"))
                running = await start_agent(nursery, hub.base_url, token, tmp_path / name,
                                            container_engine=engines[-1], registry_proxy=mode)
                r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid})
                assert r.status_code in (200, 202), r.text
                return dev, running, engines[-1]

            async def settled(dev: str) -> dict:
                conf: dict = {}

                async def done() -> bool:
                    conf.update((await device(hub, dev))["configuration"])
                    return conf.get("status") in ("applied", "rejected")

                await wait_for(done, timeout=120, interval=0.3)
                return conf

            relay.block_podman = True  # the registry is down for devices, up for the hub
            dev, _, engine = await agent("fallback", proxied, "fallback")
            conf = await settled(dev)
            assert (conf["status"], conf["applied_version_id"]) == ("applied", v1), conf
            assert relay.refused >= 1  # podman did try the registry first
            assert {c.name for c in await engine.containers(LABEL_MANAGED)} == {engine_name(v1, "web")}
            served_once = hub.services.registry_proxy.served
            assert served_once > 0
            blob_gets = relay.blob_gets()
            assert blob_gets >= 1

            relay.block_podman = False  # the registry is up: a device of an "always" fleet still pulls via the hub
            always = (await hub.call("POST", "/v1/fleets", json={"name": "always", "registry_proxy": True,
                                                                  "registry_proxy_mode": "always"})).json()["data"]
            assert always["registry_proxy_mode"] == "always", always
            podman_before = relay.podman_connections
            dev, _, engine = await agent("always", always["id"], "fallback")
            conf = await settled(dev)
            assert (conf["status"], conf["applied_version_id"]) == ("applied", v1), conf
            assert hub.services.registry_proxy.served >= 2 * served_once - 16  # its own copy of every object
            assert relay.blob_gets() == blob_gets  # served from the hub's cache: no blob asked again
            assert relay.podman_connections == podman_before, "podman asked the registry itself"

            # the hub's proxy fails (it cannot reach the registry): the pull fails, the registry unasked
            await reg.push("app/web", "2", files={"/www/index.html": b"version 2\n"})
            r = await hub.call("POST", f"/v1/configurations/{cid}/versions", json={"spec": {"containers": [
                {"name": "web", "healthCheck": {"http": {"port": 8080, "path": "/"}, "timeoutSeconds": 8,
                                                "graceSeconds": 0.3},
                 "image": f"{relay.host}/app/web:2"}]}})
            assert r.status_code == 201, r.text
            v2 = r.json()["data"]["id"]
            relay.block_hub = True
            r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid, "versionId": v2})
            assert r.status_code in (200, 202), r.text

            async def refused() -> bool:
                c = (await device(hub, dev))["configuration"]
                return c.get("status") == "rejected" and c.get("version_id") == v2

            await wait_for(refused, timeout=120, interval=0.3)
            conf = (await device(hub, dev))["configuration"]
            assert "registry proxy only" in conf["error"], conf
            assert conf["applied_version_id"] == v1, conf
            assert relay.podman_connections == podman_before, "podman asked the registry itself"
            assert {c.name for c in await engine.containers(LABEL_MANAGED)} == {engine_name(v1, "web")}
    finally:
        with trio.CancelScope(shield=True):
            for engine in engines:
                await remove_everything(engine)
