"""A two-container version rolled out to a simulated fleet whose agents run the fake engine.

    python bench/container_rollout.py [--smoke] [--devices 1000] [--batch-size 100]

As bench/rollout.py (the same fleet: ``fleethub serve``, SQL-provisioned devices, one process of real
``Agent`` s), with two differences: the agents are given the in-memory engine
(``device_client/engine/fake.py``: pull, create, start and health checks take no time and run nothing),
and the version has two containers whose image the hub pins from a real registry (Debian's
``docker-registry`` on loopback, listed in FLEETHUB_REGISTRIES, holding a busybox image built here with
podman). So the figure is the hub's and the agents' cost of a container rollout (pinning, apply
frames, the agents' switch logic, results), not podman's: a real pull and start is measured by the
tests in tests/device_client/test_containers_podman.py, a few seconds per device.

Measured: POST /v1/rollouts → state ``completed`` seen by the client (0.25 s polls), and the CPU
seconds of the hub and the agents' process over it. Results go to bench/out/ and to the
``container_rollout`` section of bench/RESULTS.md (a smoke run: bench/out/RESULTS.smoke.md). Without
podman or docker-registry (make system-deps installs them) it says so and exits 0: nothing to measure.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, cpu_seconds, free_port, log, md_table, wait_http, write_section  # noqa: E402
from delivery import expect, start_fleet  # noqa: E402
from rollout import TERMINAL, list_state  # noqa: E402

CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'


def registry_with_image(work: Path) -> tuple[subprocess.Popen, str]:
    """docker-registry on a free loopback port with a busybox image pushed as bench/web:1."""
    port = free_port()
    (work / "registry.yml").write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                                       f"    rootdirectory: {work / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(work / "registry.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/v2/", 20, proc, "docker-registry")
    with tarfile.open(work / "rootfs.tar", "w") as tar:
        tar.add("/bin/busybox", "bin/busybox")
    (work / "containers.conf").write_text(CONTAINERS_CONF)
    runroot = tempfile.mkdtemp(prefix="fh-bench-", dir="/tmp")  # podman wants it under 50 characters
    podman = ["podman", "--root", str(work / "store"), "--runroot", runroot, "--storage-driver", "vfs"]
    env = {**os.environ, "CONTAINERS_CONF": str(work / "containers.conf")}
    reference = f"127.0.0.1:{port}/bench/web:1"
    for args in (["import", "--change", 'CMD ["/bin/busybox", "httpd", "-f"]', str(work / "rootfs.tar"),
                  "localhost/bench/web:1"],
                 ["push", "--tls-verify=false", "localhost/bench/web:1", f"docker://{reference}"]):
        subprocess.run(podman + args, check=True, env=env, capture_output=True, timeout=120)
    subprocess.run(["rm", "-rf", runroot], check=False)
    return proc, reference


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="40 devices")
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args()
    if args.smoke:
        args.devices, args.batch_size, args.timeout = 40, 10, 60.0
    missing = [tool for tool in ("podman", "docker-registry") if shutil.which(tool) is None]
    if missing:
        log(f"container rollout: skipped, {' and '.join(missing)} not installed (make system-deps)")
        return 0
    work = Path(tempfile.mkdtemp(prefix="fleethub-bench-containers-"))
    registry, reference = registry_with_image(work)
    os.environ["FLEETHUB_REGISTRIES"] = reference.split("/", 1)[0]  # the hub process inherits it
    r: dict = {"devices": args.devices, "batch_size": args.batch_size, "engine": "fake (in memory)"}
    fleet = start_fleet(args.devices, "crollout", worker_args=("--fake-engine",))
    api, hub = fleet.api, fleet.hub
    try:
        r["connect_seconds"] = fleet.connect_seconds
        check = {"http": {"port": 8080, "path": "/"}, "timeoutSeconds": 10, "graceSeconds": 0}
        spec = {"containers": [{"name": "web", "image": reference, "ports": [{"port": 8080}], "healthCheck": check},
                               {"name": "worker", "image": reference, "command": ["/bin/busybox", "sleep", "1d"]}]}
        t0 = time.monotonic()
        cfg = expect(*api.call("POST", "/v1/configurations", {"name": f"bench-containers-{secrets.token_hex(3)}",
                                                              "spec": spec}), (201,), "POST /v1/configurations")["data"]
        r["create_ms"] = round(1000 * (time.monotonic() - t0), 1)  # includes pinning at the registry
        r["pinned"] = cfg["version"]["spec"]["containers"][0]["image"]
        hub_c0, sim_c0 = cpu_seconds(hub.pid), cpu_seconds(fleet.worker.pid)
        t0 = time.monotonic()
        created = expect(*api.call("POST", "/v1/rollouts", {"fleet_ids": [fleet.fleet_id],
                                                            "configuration_id": cfg["id"],
                                                            "batch_size": args.batch_size}),
                         (201,), "POST /v1/rollouts")["data"]
        state, seen = created["state"], None
        while time.monotonic() - t0 < args.timeout:
            if state in TERMINAL or state == "paused":
                seen = time.monotonic() - t0
                break
            time.sleep(0.25)
            state = list_state(api, created["id"])
        r["state"], r["seen_seconds"] = state, None if seen is None else round(seen, 2)
        r["cpu_seconds"] = {"hub": round(cpu_seconds(hub.pid) - hub_c0, 2),
                            "agents": round(cpu_seconds(fleet.worker.pid) - sim_c0, 2)}
        detail = expect(*api.call("GET", f"/v1/rollouts/{created['id']}"), (200,), "GET /v1/rollouts/{id}")["data"]
        r["counts"] = {k: v for k, v in detail["counts"].items() if v}
        log(f"container rollout {state} after {r['seen_seconds']} s: {r['counts']}; CPU {r['cpu_seconds']}")
    finally:
        fleet.stop()
        registry.terminate()
        registry.wait(10)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / f"container-rollout{'-smoke' if args.smoke else ''}.json"
    out.write_text(json.dumps(r, indent=1))
    print(json.dumps(r, indent=1))
    command = "python bench/container_rollout.py" + (" --smoke" if args.smoke else
                                                     f" --devices {args.devices} --batch-size {args.batch_size}")
    write_section("container_rollout", "\n".join([
        "## Container rollout (bench/container_rollout.py)", "",
        f"`{command}`, {time.strftime('%Y-%m-%d', time.gmtime())}: a two-container version (images pinned from a "
        "loopback docker-registry) rolled out to agents on the fake engine (docs/containers.md): the hub's and "
        "the agents' cost, not podman's.", "",
        md_table(["devices", "batch size", "state", "POST → completed", "create (pinning)", "hub CPU", "agents CPU"],
                 [[r["devices"], r["batch_size"], r["state"], f"{r['seen_seconds']} s", f"{r['create_ms']} ms",
                   f"{r['cpu_seconds']['hub']} s", f"{r['cpu_seconds']['agents']} s"]])]), smoke=args.smoke)
    return 0 if r["state"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
