"""``fleethub cluster --nodes N``: a whole cluster on this machine, for trying it and for tests.

It starts nats-server (Debian's package) on a free 127.0.0.1 port, the embedded PostgreSQL in the data
dir, the demo organisation (hub/demo.py ``bootstrap``), N ``fleethub serve`` node processes sharing the
data dir's keys, and one ``fleethub sim`` per node with the simulated devices spread over them. What
it started is written to ``<data dir>/cluster.json`` (node ids and URLs; the PAT is in demo.json,
readable by the owner only). Ctrl-C stops the simulators, the nodes (drained), NATS and PostgreSQL.

Devices here hold one hub URL each: a device whose node stops reconnects to that URL only (agents
with a list of hub URLs are not built yet, docs/cluster.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from hub.settings import Settings

NATS_SERVER = "/usr/sbin/nats-server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fleethub() -> str:
    exe = Path(sys.executable).parent / "fleethub"
    return str(exe) if exe.exists() else (shutil.which("fleethub") or "fleethub")


def _spread(devices: int, nodes: int) -> list[int]:
    return [devices // nodes + (1 if i < devices % nodes else 0) for i in range(nodes)]


async def _wait_listening(port: int, proc: subprocess.Popen, what: str, timeout: float = 30) -> None:
    with trio.fail_after(timeout):
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{what} exited with {proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                await trio.sleep(0.05)


async def _wait_ready(url: str, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    async with httpx.AsyncClient(timeout=2) as client:
        with trio.fail_after(timeout):
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"{what} exited with {proc.returncode}")
                try:
                    if (await client.get(url + "/readyz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.1)


def _stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def run_local_cluster(data_dir: Path, nodes: int, devices: int, stopping: trio.Event) -> None:
    from hub.demo import bootstrap, write_demo_file
    from hub.services import open_services, start_embedded

    nats_bin = shutil.which("nats-server") or NATS_SERVER
    if not os.path.exists(nats_bin):
        raise SystemExit("nats-server is not installed (make system-deps installs Debian's package)")
    data_dir.mkdir(parents=True, exist_ok=True)
    logs = data_dir / "logs"
    logs.mkdir(exist_ok=True)
    children: list[subprocess.Popen] = []
    pg = None

    def spawn(args: list[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        with (logs / log_name).open("ab") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        children.append(proc)
        return proc

    try:
        pg = await trio.to_thread.run_sync(start_embedded, data_dir)
        nats_port = _free_port()
        nats = spawn([nats_bin, "-a", "127.0.0.1", "-p", str(nats_port)], "nats.log")
        await _wait_listening(nats_port, nats, "nats-server")
        nats_url = f"nats://127.0.0.1:{nats_port}"
        # the org, PAT and fleet, and the data dir's keys, before any node starts (they share them)
        async with open_services(Settings(data_dir=data_dir, database_url=pg.dsn), serving=False) as s:
            info = await bootstrap(s, data_dir)
        env = {"FLEETHUB_DATABASE_URL": pg.dsn, "FLEETHUB_NATS_URL": nats_url, "FLEETHUB_DATA_DIR": str(data_dir),
               "FLEETHUB_DRAIN_WINDOW": "1"}
        started = []
        for i in range(nodes):
            node_id, port = f"node-{i + 1}", _free_port()
            proc = spawn([_fleethub(), "serve", "--port", str(port), "--node-id", node_id], f"{node_id}.log", env)
            started.append((node_id, f"http://127.0.0.1:{port}", proc))
        for node_id, url, proc in started:
            await _wait_ready(url, proc, node_id)
        sims = []
        for i, ((node_id, url, _), count) in enumerate(zip(started, _spread(devices, nodes))):
            if count:
                # its own node first, then the others in turn: a node that dies loses its devices to the rest
                urls = ",".join(u for _, u, _ in started[i:] + started[:i])
                sims.append(spawn([_fleethub(), "sim", "--hub", urls, "--devices", str(count),
                                   "--data-dir", str(data_dir / "sim" / node_id), "--pat-id", info["pat"]["id"],
                                   "--pat-secret", info["pat"]["secret"], "--org", info["org_id"],
                                   "--fleet", info["fleet_id"]], f"sim-{node_id}.log"))
        # the PAT and the admin's password, as `fleethub demo` writes them (readable by the owner only)
        write_demo_file(data_dir / "demo.json", {"base_url": started[0][1], **info})
        summary = {"nats": nats_url, "org_id": info["org_id"], "fleet_id": info["fleet_id"],
                   "nodes": [{"id": n, "url": u, "devices": c} for (n, u, _), c in zip(started, _spread(devices, nodes))]}
        path = data_dir / "cluster.json"
        path.write_text(json.dumps(summary, indent=2))
        print(f"fleethub cluster: {nodes} nodes, NATS {nats_url}, {devices} simulated devices spread over them\n"
              + "\n".join(f"  {n['id']}  {n['url']}  ({n['devices']} devices)" for n in summary["nodes"])
              + f"\n  written to {path}; the PAT is in {data_dir / 'demo.json'}\nCtrl-C stops everything.",
              flush=True)
        await stopping.wait()
    finally:
        with trio.CancelScope(shield=True):
            # devices first, then the nodes (they drain), then NATS, then PostgreSQL
            for proc in reversed(children):
                await trio.to_thread.run_sync(_stop, proc)
            if pg is not None:
                await trio.to_thread.run_sync(pg.stop)
