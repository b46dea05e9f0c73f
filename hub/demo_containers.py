"""The demo's container rollout: a local registry, a small image, one device with podman, a rollout.

What a newcomer sees in the first minute of ``make run`` (issue 36 item 6): a container version rolled
out to the demo fleet and a web page served by the container on the device.

- The registry: Debian's ``docker-registry`` on a 127.0.0.1 port, storing under the demo's data dir
  (``containers/registry``), so the image is there again at the next run, on the same port when it
  is free (versions name the registry by its port). The hub is told to
  trust it (its ``registries`` setting, FLEETHUB_REGISTRIES otherwise): it is on loopback.
- The image: a busybox rootfs (``busybox-static``) with one HTML page, imported and pushed with
  podman (hub/image_build.py, which the tests build their images with too), serving it with
  busybox's httpd on ``DEMO_PORT``.
- The device: the simulated devices (``fleethub sim``) have no engine, so they stay as they are (a
  rollout of the version to their fleet counts them ineligible, "no container engine"). One more
  device, ``demo-podman``, is a real agent with podman: a private store under the data dir (vfs, the
  containers.conf of docs/containers.md), its containers published on the host. It is alone in a
  fleet of its own, ``demo-containers``, so the README tour's rollouts to the demo fleet leave its
  container alone.
- The version and the rollout: made once; later runs find the configuration again, and the agent
  restarts its container at boot (configs.py reconcile). The demo stops the container when it stops,
  so nothing keeps serving after Ctrl-C.

Without podman, runc, docker-registry or busybox-static the demo says so in one line and goes on.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import trio

from device_client.engine.podman import Podman
from device_client.sim import load_registry, provision, run_sim, save_registry
from hub.image_build import CONTAINERS_CONF, REGISTRY_CONF, missing_tools, push_image

if TYPE_CHECKING:
    from hub.services import Services

log = logging.getLogger("fleethub.demo")

DEMO_CONFIG = "demo-web"
DEMO_DEVICE = "demo-podman"
DEMO_FLEET = "demo-containers"
DEMO_PORT = 8090
PAGE = b"<h1>Hello from a fleethub container</h1>\n<p>busybox httpd, rolled out by the demo.</p>\n"
HTTPD_CMD = ["/bin/sh", "-c", f"exec /bin/httpd -f -p {DEMO_PORT} -h /www"]


def demo_engine(directory: Path, scratch: Path) -> Podman:
    """podman with the demo's own store. Its runroot is under /tmp: podman refuses one over 50
    characters, and a data dir's path may be longer; named after the data dir, so a later run finds
    the containers it left."""
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    runroot = Path("/tmp") / f"fleethub-demo-{hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:12]}"
    return Podman(conf=conf, root=directory / "root", runroot=runroot, storage_driver="vfs", scratch=scratch)


def _registry_port(directory: Path) -> int:
    """The port of the last run when it is free: the versions made then name the registry by it, so a
    device that must pull again (an interrupted apply, a pruned image) finds the image where it was."""
    path = directory / "port"
    try:
        wanted = int(path.read_text())
    except (OSError, ValueError):
        wanted = 0
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", wanted))
        except OSError:
            s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path.write_text(f"{port}\n")
    return port


async def _serve_registry(directory: Path, port: int) -> None:
    conf = directory / "registry.yml"
    conf.write_text(REGISTRY_CONF.format(root=directory / "data", port=port))
    with (directory / "registry.log").open("ab") as log_file:
        await trio.run_process(["docker-registry", "serve", str(conf)], check=False, stdout=log_file,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def _push_image(engine: Podman, host: str, scratch: Path) -> str:
    return await push_image(engine, host, "demo/web", "1", {"/www/index.html": PAGE}, HTTPD_CMD, scratch=scratch)


async def _wait_registry(url: str) -> None:
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                try:
                    if (await client.get(f"{url}/v2/")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.1)


def _api(base_url: str, info: dict) -> httpx.AsyncClient:
    headers = {"X-API-Token-ID": info["pat"]["id"], "X-API-Secret-Key": info["pat"]["secret"],
               "X-Organization-ID": info["org_id"]}
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60)


async def _fleet(base_url: str, info: dict) -> str:
    """The id of the fleet of the podman device, made the first time."""
    async with _api(base_url, info) as client:
        found = (await client.get("/v1/fleets", params={"limit": 100})).json()["data"]
        for fleet in found:
            if fleet["name"] == DEMO_FLEET:
                return fleet["id"]
        r = await client.post("/v1/fleets", json={"name": DEMO_FLEET, "description": "The demo's device with podman"})
        if r.status_code != 201:
            raise RuntimeError(f"the fleet was refused: {r.text[:200]}")
        return r.json()["data"]["id"]


async def _roll_out(base_url: str, info: dict, image: str, fleet_id: str) -> str:
    """The demo-web configuration, rolled out to the podman device's fleet the first time; what was
    done, in words."""
    async with _api(base_url, info) as client:
        found = (await client.get("/v1/configurations", params={"limit": 100})).json()["data"]
        if any(c["name"] == DEMO_CONFIG for c in found):
            return f"configuration {DEMO_CONFIG} (from an earlier run)"
        r = await client.post("/v1/configurations", json={"name": DEMO_CONFIG, "spec": {"containers": [{
            "name": "web", "image": image, "ports": [{"port": DEMO_PORT}], "resources": {"memoryMiB": 32},
            "healthCheck": {"http": {"port": DEMO_PORT, "path": "/"}, "timeoutSeconds": 20}}]}})
        if r.status_code != 201:
            raise RuntimeError(f"the configuration was refused: {r.text[:200]}")
        cid = r.json()["data"]["id"]
        r = await client.post("/v1/rollouts", json={"fleet_ids": [fleet_id], "configuration_id": cid})
        if r.status_code != 201:
            raise RuntimeError(f"the rollout was refused: {r.text[:200]}")
        return f"rollout {r.json()['data']['id']} of configuration {DEMO_CONFIG}"


async def run_container_demo(services: "Services", base_url: str, nursery: trio.Nursery, *, data_dir: Path,
                             info: dict) -> str:
    """Start the registry and the podman device, push the image, roll it out; one line saying what
    happened (or why not), for the demo's banner."""
    missing = missing_tools()
    if missing:
        return (f"no container rollout: {', '.join(missing)} missing (make system-deps installs them; "
                "docs/containers.md)")
    directory = data_dir / "containers"
    registry_dir = directory / "registry"
    registry_dir.mkdir(parents=True, exist_ok=True)
    port = _registry_port(registry_dir)
    host = f"127.0.0.1:{port}"
    nursery.start_soon(_serve_registry, registry_dir, port)
    # the hub reads its registries setting at each pin: the demo's own registry is on loopback
    services.settings = replace(services.settings, registries=(*services.settings.registries, host))
    device_dir = directory / DEMO_DEVICE
    device_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    engine = demo_engine(directory / "podman", scratch=device_dir)
    try:
        await _wait_registry(f"http://{host}")
        image = await _push_image(engine, host, directory)
        fleet_id = await _fleet(base_url, info)
        devices = await trio.to_thread.run_sync(load_registry, device_dir)
        if not devices:
            await provision(base_url, [DEMO_DEVICE], pat_id=info["pat"]["id"], pat_secret=info["pat"]["secret"],
                            org_id=info["org_id"], fleet=fleet_id, into=devices)
            await trio.to_thread.run_sync(save_registry, device_dir, devices)
        options = {"container_engine": engine, "image_budget": 256 << 20}
        await nursery.start(lambda task_status: run_sim(
            base_url, 1, device_dir, devices=[(devices[0]["id"], devices[0]["token"])], agent_options=options,
            workload_user=None, task_status=task_status))
        nursery.start_soon(_stop_at_exit, engine)
        done = await _roll_out(base_url, info, image, fleet_id)
    except (RuntimeError, OSError, trio.TooSlowError, httpx.HTTPError) as exc:
        log.warning("demo: the container rollout did not happen: %s", exc)
        return f"no container rollout: {exc}"
    return (f"{done} to fleet {DEMO_FLEET}: device {DEMO_DEVICE} runs it with podman and serves "
            f"http://127.0.0.1:{DEMO_PORT}/ (the simulated devices have no container engine)")


async def _stop_at_exit(engine: Podman) -> None:
    """The agent leaves containers running when it stops (they are the device's applications); the
    demo is not a device, so its container stops with it and starts again at the next run."""
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            await trio.run_process([engine.binary, *engine.global_args, "stop", "--all", "-t", "2"], check=False,
                                   capture_stdout=True, capture_stderr=True, env=engine.environment())
