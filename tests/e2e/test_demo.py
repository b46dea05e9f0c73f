"""``fleethub demo`` as the README's run command uses it: up, usable, Ctrl-C, and up again on the same data."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import time

import httpx

from hub.demo_containers import DEMO_PORT, PAGE, demo_engine
from hub.image_build import missing_tools
from tests.e2e.clitools import api, free_port, postgres_of, wait_until

START_TIMEOUT = 60  # first run: initdb, migrations, argon2 hash, 3 devices


def read_demo(path, port: int):
    """demo.json once it describes the hub on ``port`` (a rerun rewrites the previous one)."""
    if not path.exists():
        return None
    info = json.loads(path.read_text())
    return info if info.get("base_url") == f"http://127.0.0.1:{port}" else None


def all_online(base_url: str, info: dict) -> list[dict] | None:
    with api(base_url, info["pat"], info["org_id"]) as c:
        r = c.get("/v1/devices")
    if r.status_code != 200:
        return None
    devices = [d for d in r.json()["data"] if d["id"] in info["devices"]]  # not demo-podman
    # the hello facts are written behind (a little after "online"): wait for both
    ready = all(d["online"] and d["firmware"] and d["has_tunnel_identity"] for d in devices)
    return devices if len(devices) == 3 and ready else None


def served() -> str | None:
    try:
        r = httpx.get(f"http://127.0.0.1:{DEMO_PORT}/", timeout=2)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


def podman_applied(base_url: str, info: dict) -> bool:
    with api(base_url, info["pat"], info["org_id"]) as c:
        devices = c.get("/v1/devices").json()["data"]
    return any(d["name"] == "demo-podman" and (d.get("configuration") or {}).get("status") == "applied"
               for d in devices)


def test_demo_runs_stops_cleanly_and_reuses_its_data(tmp_path, procs):
    data = tmp_path / "demo"
    demo_json = data / "demo.json"

    # -- first run ----------------------------------------------------------------------------
    port = free_port()
    demo = procs("demo1", ["demo", "--port", str(port), "--data-dir", str(data), "--devices", "3"])
    info = wait_until(lambda: read_demo(demo_json, port), timeout=START_TIMEOUT, what="demo.json", proc=demo)
    assert set(info) == {"base_url", "org_id", "fleet_id", "pat", "admin", "devices", "containers"}
    # with podman, runc, docker-registry and busybox-static: a container rolled out to device demo-podman
    containers = not missing_tools()
    assert info["containers"].startswith("rollout " if containers else "no container rollout"), info["containers"]
    assert set(info["pat"]) == {"id", "secret"} and info["pat"]["id"].startswith("pat_")
    assert set(info["admin"]) == {"email", "password"} and "@" in info["admin"]["email"]
    assert info["admin"]["password"]
    assert len(info["devices"]) == 3 and len(set(info["devices"])) == 3
    assert stat.S_IMODE(demo_json.stat().st_mode) == 0o600, "demo.json holds secrets"
    base_url = info["base_url"]

    devices = wait_until(lambda: all_online(base_url, info), timeout=20, what="3 devices online", proc=demo)
    assert sorted(d["id"] for d in devices) == sorted(info["devices"])
    assert all(d["fleet_id"] == info["fleet_id"] for d in devices)
    with api(base_url, info["pat"], info["org_id"]) as c:
        r = c.get(f"/v1/fleets/{info['fleet_id']}")
        assert r.status_code == 200 and r.json()["data"]["device_count"] == 3  # demo-podman has a fleet of its own
        r = c.get(f"/v1/devices/{info['devices'][0]}")
        assert r.status_code == 200 and r.json()["data"]["has_tunnel_identity"] is True
        # the hub works for a real command: ping a simulated device
        r = c.post(f"/v1/devices/{info['devices'][1]}/ping")
        assert r.status_code == 200 and r.json()["data"]["device"]["pong"] is True
    for dev_id in info["devices"]:
        assert (data / "devices" / dev_id / "root").is_dir()
    if containers:
        assert PAGE.decode() in wait_until(served, timeout=90, what="the demo's container on :8090", proc=demo)
        wait_until(lambda: podman_applied(base_url, info), timeout=60, what="demo-podman's version applied",
                   proc=demo)
    assert postgres_of(data), "the demo runs its embedded PostgreSQL from the data dir"
    assert (data / "pg" / "postmaster.pid").exists()

    # -- Ctrl-C stops everything, PostgreSQL included, within a few seconds -----------------------
    asked = time.monotonic()
    status = demo.interrupt(timeout=30)
    took = time.monotonic() - asked
    assert status == 0, f"exit status {status}\n{demo.log_tail()}"
    # it took 15 s (a drain window for devices that stop with it anyway); ~1-2.5 s on a busy 2-core box
    assert took < 6, f"Ctrl-C took {took:.1f}s\n{demo.log_tail()}"
    wait_until(lambda: not postgres_of(data), timeout=10, what="PostgreSQL to exit")
    assert not (data / "pg" / "postmaster.pid").exists(), "a clean PostgreSQL shutdown removes its pid file"
    assert served() is None, "the demo's container outlived the demo"

    # -- second run on the same data dir -----------------------------------------------------------
    port2 = free_port()
    demo2 = procs("demo2", ["demo", "--port", str(port2), "--data-dir", str(data), "--devices", "3"])
    info2 = wait_until(lambda: read_demo(demo_json, port2), timeout=START_TIMEOUT, what="demo.json again",
                       proc=demo2)
    assert info2["org_id"] == info["org_id"]
    assert info2["fleet_id"] == info["fleet_id"]
    assert info2["devices"] == info["devices"]
    assert info2["pat"] == info["pat"] and info2["admin"] == info["admin"]
    devices = wait_until(lambda: all_online(info2["base_url"], info2), timeout=20,
                         what="the same 3 devices online again", proc=demo2)
    assert sorted(d["id"] for d in devices) == sorted(info["devices"])
    with api(info2["base_url"], info2["pat"], info2["org_id"]) as c:
        r = c.get("/v1/fleets")
        assert [f["id"] for f in r.json()["data"] if f["name"] != "demo-containers"] == [info["fleet_id"]]
        # the device facts of the first run were stored
        d = c.get(f"/v1/devices/{info['devices'][2]}").json()["data"]
        assert d["firmware"] and d["architecture"] and d["boot_reason"] == "power_on"
    if containers:
        assert "from an earlier run" in info2["containers"], info2["containers"]
        assert PAGE.decode() in wait_until(served, timeout=60, what="the container again", proc=demo2)
    assert demo2.interrupt(timeout=30) == 0, demo2.log_tail()
    if containers:  # the demo's podman store is in tmp_path; its runroot is in /tmp (hub/demo_containers.py)
        engine = demo_engine(data / "containers" / "podman", scratch=data)
        subprocess.run([engine.binary, *engine.global_args, "rm", "--all", "--force", "-t", "0"],
                       env=engine.environment(), capture_output=True, timeout=60, check=False)
        shutil.rmtree(engine.global_args[engine.global_args.index("--runroot") + 1], ignore_errors=True)
    wait_until(lambda: not postgres_of(data), timeout=10, what="PostgreSQL to exit")
