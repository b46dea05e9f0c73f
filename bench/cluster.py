"""Several hub nodes on this machine: what a second node buys, what a hop costs, how fast a takeover is.

    python bench/cluster.py [--smoke] [--measures rest,rtt,takeover] [--duration 10] [--rounds 2]
                            [--rtt-devices 200] [--requests 2000] [--takeover-devices 5000]
                            [--takeover-batches 20] [--lease-seconds 10] [--hold-devices 30000]

One ``fleethub cluster --nodes 2 --devices 0`` (a real nats-server, the embedded PostgreSQL, two
``fleethub serve`` node processes) is started for the whole run, and measured side by side:

- **rest**: ``GET /v1/devices/{id}`` throughput with every connection on node A, then the same
  connections spread over A and B (two load generators, half the connections each, run at once).
  The two node processes and the load generator share this machine's two cores, so the ratio is a
  floor for what two machines would give; the load average is printed with it.
- **rtt**: ``POST /v1/devices/{id}/ping`` to devices linked to node A (their agents given only A's
  URL), asked through A and through B, which forwards over NATS to A: p50 and p99 ratios.
- **hold**: half of 30,000 simulated devices linked to node A alone, then the other half to node B:
  each node's VmRSS growth per device it holds, with one node holding and with both (ratio, aim 1.0).
- **takeover**: agents given both URLs (A first) link to A, and A owns a batched rollout to them; A
  is killed with SIGKILL once the rollout is under way; the seconds until B holds the rollout's lease,
  until every device is linked to B again (its presence row says node B and online), and until the
  rollout settles a device it had not settled before the kill.

The figures go to bench/RESULTS.md (``--smoke``: bench/out/RESULTS.smoke.md, tiny sizes, verdicts
informative).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (OUT_DIR, REPO, Verdicts, Worker, command_line, facts_line, fleethub_cmd,  # noqa: E402
                     http_get, http_json, insert_devices, loadavg, log, machine_facts, md_table, rss_kib,
                     shm_tempdir, write_section)
from command_rtt import load  # noqa: E402
from http_ratio import run_python_load, run_wrk  # noqa: E402


class LocalCluster:
    """``fleethub cluster --nodes 2 --devices 0`` in its own process group, and what it wrote."""

    def __init__(self, data_dir: Path, lease_seconds: float) -> None:
        self.data_dir = data_dir
        OUT_DIR.mkdir(parents=True, exist_ok=True)  # a fresh clone has no bench/out yet
        self.log = (OUT_DIR / f"cluster-{os.getpid()}.log").open("wb")
        # the nodes inherit the environment: their rollout lease time is the one measured
        env = {**os.environ, "FLEETHUB_ROLLOUT_LEASE_SECONDS": str(lease_seconds)}
        self.proc = subprocess.Popen([*fleethub_cmd(), "cluster", "--nodes", "2", "--devices", "0",
                                      "--data-dir", str(data_dir)], stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=str(REPO), start_new_session=True, env=env)
        deadline = time.monotonic() + 120
        while not (data_dir / "cluster.json").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fleethub cluster did not start; see {self.log.name}")
            time.sleep(0.2)
        time.sleep(0.2)  # written before the banner: let the file be complete
        self.summary = json.loads((data_dir / "cluster.json").read_text())
        self.demo = json.loads((data_dir / "demo.json").read_text())
        self.urls = [n["url"] for n in self.summary["nodes"]]
        self.headers = {"X-API-Token-ID": self.demo["pat"]["id"], "X-API-Secret-Key": self.demo["pat"]["secret"],
                        "X-Organization-ID": self.demo["org_id"]}
        from storage.embedded import EmbeddedPostgres

        pg = EmbeddedPostgres.running(data_dir / "pg")
        if pg is None:
            raise RuntimeError("the cluster's PostgreSQL is not running")
        self.dsn = pg.dsn
        self.admin("set-tier", self.demo["org_id"], "enterprise", "--rate-limit", "2000000000")

    def admin(self, *args: str) -> None:
        r = subprocess.run([*fleethub_cmd(), "--log-level", "WARNING", "admin", "--data-dir", str(self.data_dir),
                            *args], capture_output=True, text=True, cwd=str(REPO), timeout=120,
                           env={**os.environ, "FLEETHUB_DATABASE_URL": self.dsn})
        if r.returncode != 0:
            raise RuntimeError(f"fleethub admin {' '.join(args)} failed: {r.stderr[-1000:]}")

    def node_pid(self, node_id: str) -> int:
        """The pid of ``fleethub serve --node-id <node_id>`` (the cluster command started it)."""
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"serve" in argv and b"--node-id" in argv and argv[argv.index(b"--node-id") + 1] == node_id.encode():
                    return int(entry.name)
        raise RuntimeError(f"no process for node {node_id}")

    def sql(self, query: str, *args) -> object:
        import asyncpg

        async def run() -> object:
            conn = await asyncpg.connect(self.dsn)
            try:
                return await conn.fetchval(query, *args)
            finally:
                await conn.close()

        return asyncio.run(run())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # the command stops its nodes, NATS and PostgreSQL
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


class Sim:
    """``fleethub sim`` with ``count`` devices provisioned through ``hub_urls``' first node."""

    def __init__(self, cluster: LocalCluster, hub_urls: list[str], count: int, name: str) -> None:
        d = cluster.data_dir / f"sim-{name}"
        self.log = (OUT_DIR / f"cluster-sim-{name}-{os.getpid()}.log").open("wb")
        self.proc = subprocess.Popen(
            [*fleethub_cmd(), "sim", "--hub", ",".join(hub_urls), "--devices", str(count), "--data-dir", str(d),
             "--pat-id", cluster.demo["pat"]["id"], "--pat-secret", cluster.demo["pat"]["secret"],
             "--org", cluster.demo["org_id"], "--fleet", cluster.demo["fleet_id"]],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def linked(cluster: LocalCluster, node: str | None = None) -> int:
    """Devices online whose link ``node`` holds (any node when None), from the presence rows."""
    if node is None:
        return int(cluster.sql("SELECT count(*) FROM devices WHERE online"))
    return int(cluster.sql("SELECT count(*) FROM devices WHERE online AND link_node = $1", node))


def wait_linked(cluster: LocalCluster, node: str, at_least: int, timeout: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if linked(cluster, node) >= at_least:
            return time.monotonic() - t0
        time.sleep(0.25)
    return None


# -- the measures ---------------------------------------------------------------------------------
def measure_rest(cluster: LocalCluster, args) -> dict:
    status, body = http_json("POST", cluster.urls[0] + "/v1/devices", {"name": "bench-rest"}, cluster.headers)
    if status != 201:
        raise RuntimeError(f"POST /v1/devices answered {status}: {body}")
    path = f"/v1/devices/{body['data']['id']}"
    wrk = bool(shutil_which("wrk")) and not args.python_load

    def one(url: str, conns: int, duration: float | None = None) -> dict:
        if wrk:
            return run_wrk(url + path, cluster.headers, 1, conns, duration or args.duration)
        return run_python_load(url, path, cluster.headers, conns, duration or args.duration)

    def spread(urls: list[str]) -> dict:
        results: list[dict] = [{}] * len(urls)
        per = max(1, args.connections // len(urls))

        def run(i: int, url: str) -> None:
            results[i] = one(url, per)

        threads = [threading.Thread(target=run, args=(i, u)) for i, u in enumerate(urls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"rps": round(sum(r.get("rps", 0) for r in results), 1),
                "non2xx": sum(r.get("non2xx", 0) for r in results),
                "socket_errors": sum(r.get("socket_errors", 0) for r in results),
                "p99": max((r.get("p99") or 0) for r in results)}

    for url in cluster.urls:
        one(url, args.connections, 2.0)  # warm-up
    rounds = []
    for rnd in range(args.rounds):
        single = spread([cluster.urls[0], cluster.urls[0]])  # the same two generators, both on A
        both = spread(cluster.urls)
        rounds.append({"one_node": single, "two_nodes": both, "load": loadavg()})
        log(f"rest round {rnd + 1}: one node {single['rps']} req/s, two nodes {both['rps']} req/s")
    one_rps = sum(r["one_node"]["rps"] for r in rounds) / len(rounds)
    two_rps = sum(r["two_nodes"]["rps"] for r in rounds) / len(rounds)
    return {"generator": "wrk" if wrk else "bench/_httpload.py", "rounds": rounds, "one_rps": round(one_rps, 1),
            "two_rps": round(two_rps, 1), "ratio": round(two_rps / one_rps, 2) if one_rps else None}


def measure_rtt(cluster: LocalCluster, args) -> dict:
    before = linked(cluster)
    sim = Sim(cluster, [cluster.urls[0]], args.rtt_devices, "rtt")
    try:
        if wait_linked(cluster, "node-1", before + args.rtt_devices, 180) is None:
            raise RuntimeError("the rtt devices did not all link to node A")
        ids = [str(r) for r in json.loads(cluster.sql(
            "SELECT coalesce(json_agg(id), '[]') FROM devices WHERE online AND link_node = 'node-1'"))]
        n = args.warmup + args.requests
        paths = [f"/v1/devices/{ids[i % len(ids)]}/ping" for i in range(n)]
        out = {}
        for label, url in (("via A (holder)", cluster.urls[0]), ("via B (over NATS)", cluster.urls[1])):
            r = load({"url": url, "method": "POST", "headers": cluster.headers, "timeout": 30, "paths": paths,
                      "concurrency": args.concurrency, "warmup": args.warmup}, timeout=600)
            out[label] = {"p50": r["summary"].get("p50"), "p99": r["summary"].get("p99"), "rps": r["rps"],
                          "statuses": r["statuses"], "errors": r["error_count"]}
            log(f"rtt {label}: {json.dumps(out[label])}")
        a, b = out["via A (holder)"], out["via B (over NATS)"]
        return {"devices": len(ids), "levels": out,
                "p50_ratio": round(b["p50"] / a["p50"], 2) if a["p50"] else None,
                "p99_ratio": round(b["p99"] / a["p99"], 2) if a["p99"] else None}
    finally:
        sim.stop()
        deadline = time.monotonic() + 30
        while linked(cluster) and time.monotonic() < deadline:  # its devices offline before the next measure
            time.sleep(0.25)


def node_connected(url: str) -> int:
    """The node's own gauge of device links it holds (its /metrics)."""
    status, body = http_get(f"{url}/metrics", timeout=30)
    if status != 200:
        return -1
    for line in body.decode().splitlines():
        if line.startswith("fleethub_connected_devices "):
            return int(float(line.split()[1]))
    return -1


def wait_node_connected(url: str, target: int, timeout: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if node_connected(url) >= target:
            return time.monotonic() - t0
        time.sleep(1.0)
    return None


def measure_hold(cluster: LocalCluster, args) -> dict:
    """Half of ``--hold-devices`` linked to node A alone (one node holding them), then the other half to
    node B (two nodes holding them all): each node's VmRSS growth per device it links, from the same
    kind of simulator workers as bench/capacity.py (real Agents, inserted in SQL like capacity.py's)."""
    half = args.hold_devices // 2
    root = shm_tempdir("fleethub-bench-cluster-hold-")
    workers: list[Worker] = []
    pids = {node: cluster.node_pid(node) for node in ("node-1", "node-2")}
    out: dict = {"devices": 2 * half, "per_node": half, "phases": []}
    try:
        devices = insert_devices(cluster.dsn, cluster.demo["org_id"], 2 * half, prefix=f"hold-{os.getpid()}")
        for phase, (node, url) in enumerate((("node-1", cluster.urls[0]), ("node-2", cluster.urls[1]))):
            before = {n: rss_kib(pid) for n, pid in pids.items()}
            mine = devices[phase * half:(phase + 1) * half]
            new = [Worker("agent", "--hub", url, "--data-dir", str(root / f"{node}-w{i}"),
                          "--connect-concurrency", "200", name=f"cluster-hold-{node}-{i}")
                   for i in range(args.hold_procs)]
            workers += new
            for i, (w, chunk) in enumerate(zip(new, [mine[k::len(new)] for k in range(len(new))])):
                f = root / f"{node}-w{i}.json"
                f.write_text(json.dumps(chunk))
                w.send({"cmd": "add", "devices_file": str(f), "timeout": args.hold_timeout})
            took = wait_node_connected(url, half, args.hold_timeout)
            for w in new:
                w.receive(args.hold_timeout + 60)
            if took is None:
                raise RuntimeError(f"{node} did not reach {half} links within {args.hold_timeout} s")
            time.sleep(args.hold_settle)  # heartbeats and presence rows settle before the reading
            after = {n: rss_kib(pid) for n, pid in pids.items()}
            row = {"node": node, "linked": node_connected(url), "connect_seconds": round(took, 1),
                   "rss_before_mib": round(before[node] / 1024, 1), "rss_after_mib": round(after[node] / 1024, 1),
                   "kib_per_device": round((after[node] - before[node]) / half, 1),
                   "other_node_linked": node_connected(cluster.urls[1 - phase]),
                   "total_online": linked(cluster), "load": loadavg()}
            log(f"hold: {json.dumps(row)}")
            out["phases"].append(row)
        one, two = out["phases"][0]["kib_per_device"], out["phases"][1]["kib_per_device"]
        out["ratio"] = round(two / one, 2) if one else None
        return out
    finally:
        for w in workers:
            w.stop()
        deadline = time.monotonic() + 120
        while linked(cluster) and time.monotonic() < deadline:  # offline again before the next measure
            time.sleep(0.5)
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def lease_owner(cluster: LocalCluster, rollout_id: str) -> str | None:
    return cluster.sql("SELECT owner FROM rollout_leases WHERE rollout_id = $1::uuid", rollout_id)


def rollout_counts(cluster: LocalCluster, url: str, rollout_id: str) -> dict:
    status, body = http_json("GET", f"{url}/v1/rollouts/{rollout_id}", headers=cluster.headers, timeout=30)
    if status != 200:
        raise RuntimeError(f"GET /v1/rollouts/{rollout_id} answered {status}: {body}")
    return {"state": body["data"]["state"], **body["data"]["counts"]}


def measure_takeover(cluster: LocalCluster, args) -> dict:
    """Devices linked to A and a rollout A owns; A is SIGKILLed once the rollout has settled some
    devices. Seconds until: every device is linked to B; B holds the rollout's lease; the rollout has
    settled a device it had not settled before the kill (it moved on)."""
    n = args.takeover_devices
    t0 = time.monotonic()
    sim = Sim(cluster, cluster.urls, n, "takeover")
    try:
        linked_in = wait_linked(cluster, "node-1", n, max(120, n / 20))
        if linked_in is None:
            raise RuntimeError(f"the {n} devices did not all link to node A")
        a = cluster.urls[0]
        status, body = http_json("POST", f"{a}/v1/configurations", {"name": f"takeover-{os.getpid()}", "spec": {}},
                                 headers=cluster.headers, timeout=30)
        if status != 201:
            raise RuntimeError(f"POST /v1/configurations answered {status}: {body}")
        batch = max(1, n // args.takeover_batches)
        status, body = http_json("POST", f"{a}/v1/rollouts", {"fleet_ids": [cluster.demo["fleet_id"]],
                                                             "configuration_id": body["data"]["id"],
                                                             "batch_size": batch}, headers=cluster.headers, timeout=60)
        if status != 201:
            raise RuntimeError(f"POST /v1/rollouts answered {status}: {body}")
        rollout_id = body["data"]["id"]
        deadline = time.monotonic() + 300
        while True:  # A owns it and has settled at least its canary and one batch, not all of them
            counts = rollout_counts(cluster, a, rollout_id)
            if lease_owner(cluster, rollout_id) == "node-1" and counts["succeeded"] > batch:
                break
            if counts["state"] != "running" or time.monotonic() > deadline:
                raise RuntimeError(f"the rollout did not get under way on node A before the kill: {counts}")
            time.sleep(0.1)
        log(f"takeover: {n} devices linked to node A in {time.monotonic() - t0:.1f} s, rollout at {counts}; "
            f"SIGKILL node A")
        os.kill(cluster.node_pid("node-1"), signal.SIGKILL)
        killed = time.monotonic()
        b = cluster.urls[1]
        at_kill = rollout_counts(cluster, b, rollout_id)
        lease_back = devices_back = moved_on = None
        deadline = killed + max(180, n / 10)
        while time.monotonic() < deadline and None in (lease_back, devices_back, moved_on):
            now = time.monotonic() - killed
            if lease_back is None and lease_owner(cluster, rollout_id) == "node-2":
                lease_back = now
            if devices_back is None and linked(cluster, "node-2") >= n:
                devices_back = now
            if moved_on is None:
                counts = rollout_counts(cluster, b, rollout_id)
                if counts["succeeded"] > at_kill["succeeded"] or counts["state"] == "completed":
                    moved_on = now
            time.sleep(0.1)
        return {"devices": n, "batch_size": batch, "rollout_at_kill": at_kill,
                "seconds_all_back": round(devices_back, 2) if devices_back is not None else None,
                "seconds_lease_taken": round(lease_back, 2) if lease_back is not None else None,
                "seconds_rollout_moved_on": round(moved_on, 2) if moved_on is not None else None,
                "lease_seconds": args.lease_seconds, "load": loadavg()}
    finally:
        sim.stop()


def shutil_which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, well under 2 minutes; results to bench/out/")
    p.add_argument("--measures", default="rest,rtt,hold,takeover")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per REST load run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--python-load", action="store_true", help="bench/_httpload.py even if wrk is installed")
    p.add_argument("--rtt-devices", type=int, default=200)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--takeover-devices", type=int, default=5000)
    p.add_argument("--hold-devices", type=int, default=30000, help="devices held by the two nodes, half each")
    p.add_argument("--hold-procs", type=int, default=2, help="simulator processes per node")
    p.add_argument("--hold-timeout", type=float, default=600.0, help="seconds for a node's half to link")
    p.add_argument("--hold-settle", type=float, default=20.0, help="seconds between linked and the reading")
    p.add_argument("--lease-seconds", type=float, default=10.0,
                   help="FLEETHUB_ROLLOUT_LEASE_SECONDS of the nodes (10, the default, unless told)")
    p.add_argument("--takeover-batches", type=int, default=20, help="the killed node's rollout: devices / batch size")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="wait up to this long for the machine to be quiet before starting")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.duration, args.rounds, args.rtt_devices, args.requests, args.warmup = 2.0, 1, 10, 200, 50
        args.takeover_devices, args.takeover_batches = 20, 5
        args.hold_devices, args.hold_procs, args.hold_timeout, args.hold_settle = 40, 1, 60.0, 1.0
    measures = set(args.measures.split(","))
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    data_dir = shm_tempdir("fleethub-bench-cluster-")
    results: dict = {}
    cluster = LocalCluster(data_dir, args.lease_seconds)
    try:
        log(f"cluster up: {cluster.urls}")
        if "rest" in measures:
            results["rest"] = measure_rest(cluster, args)
        if "rtt" in measures:
            results["rtt"] = measure_rtt(cluster, args)
        if "hold" in measures:
            results["hold"] = measure_hold(cluster, args)
        if "takeover" in measures:
            results["takeover"] = measure_takeover(cluster, args)  # last: it kills node A
    finally:
        cluster.stop()
        import shutil

        shutil.rmtree(data_dir, ignore_errors=True)

    (OUT_DIR / f"cluster{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(results, indent=1))
    verdicts = Verdicts("cluster", smoke=args.smoke)
    if "rest" in results:
        verdicts.at_least("REST req/s, 2 nodes / 1 node (one machine)", results["rest"]["ratio"], 1.6, "x")
    if "rtt" in results:
        verdicts.at_most("ping p50 through B / through A", results["rtt"]["p50_ratio"], 1.5, "x")
        verdicts.at_most("ping p99 through B / through A", results["rtt"]["p99_ratio"], 2.0, "x")
    if "hold" in results:
        # "memory per device no worse than one node's"; a tolerance of 10 % for the noise of VmRSS readings
        verdicts.at_most(f"memory per device, two nodes holding {results['hold']['devices']:,} / one node holding "
                         f"{results['hold']['per_node']:,}", results["hold"]["ratio"], 1.1, "x")
    if "takeover" in results:
        # our own bound (the issue asks for the seconds): a survivor should take over well within a minute
        x = results["takeover"]
        verdicts.at_most(f"seconds until {x['devices']:,} devices of a killed node are linked "
                         f"to the other", x["seconds_all_back"], 60, " s")
        # the lease's own bound: one lease time plus a renewal round (docs/cluster.md)
        verdicts.at_most("seconds until the killed node's rollout lease is taken over", x["seconds_lease_taken"],
                         round(x["lease_seconds"] * 4 / 3 + 1, 1), " s")
    body = render(results, facts, args) + "\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('cluster', body, smoke=args.smoke)}")
    broken = any(r.get("non2xx") or r.get("socket_errors") for rr in results.get("rest", {}).get("rounds", [])
                 for r in (rr["one_node"], rr["two_nodes"]))
    broken |= any(v["errors"] or set(v["statuses"]) - {"200"} for v in results.get("rtt", {}).get("levels", {}).values())
    broken |= "takeover" in results and None in (results["takeover"]["seconds_all_back"],
                                                 results["takeover"]["seconds_lease_taken"],
                                                 results["takeover"]["seconds_rollout_moved_on"])
    return verdicts.exit_code(broken=broken)


def render(r: dict, facts: dict, args) -> str:
    out = ["## A cluster on one machine (bench/cluster.py)", "", f"`{command_line()}`", "",
           f"{facts_line(facts)}; load average at end {loadavg()}", "",
           "`fleethub cluster --nodes 2` on this 2-core machine: a real nats-server, the embedded PostgreSQL and two "
           "`fleethub serve` node processes; the load generators run on the same two cores.", ""]
    if "rest" in r:
        x = r["rest"]
        out += [f"**REST** `GET /v1/devices/{{id}}`, {args.connections} connections in all from two {x['generator']} "
                f"processes, {args.duration:g} s per run, rounds alternating:", "",
                md_table(["round", "all on node A req/s", "spread over A and B req/s", "p99 ms (A only / A+B)",
                          "non-2xx", "load average"],
                         [[i + 1, rr["one_node"]["rps"], rr["two_nodes"]["rps"],
                           f"{rr['one_node']['p99']} / {rr['two_nodes']['p99']}",
                           rr["one_node"]["non2xx"] + rr["two_nodes"]["non2xx"], rr["load"]]
                          for i, rr in enumerate(x["rounds"])]), "",
                f"Two nodes / one node: **{x['ratio']}×** (mean {x['two_rps']} vs {x['one_rps']} req/s). Two node "
                "processes on two cores compete with the load generators and with PostgreSQL for the same cores: on "
                "separate machines the second node's share would not be taken from the first.", ""]
    if "rtt" in r:
        x = r["rtt"]
        out += [f"**Command round trip** `POST /v1/devices/{{id}}/ping` to {x['devices']} devices linked to node A, "
                f"{args.requests:,} requests at concurrency {args.concurrency} (after {args.warmup} warm-up):", "",
                md_table(["asked through", "p50 ms", "p99 ms", "req/s", "statuses", "errors"],
                         [[k, v["p50"], v["p99"], v["rps"], json.dumps(v["statuses"]), v["errors"]]
                          for k, v in x["levels"].items()]), "",
                f"Through B / through A: p50 **{x['p50_ratio']}×**, p99 **{x['p99_ratio']}×**.", ""]
    if "hold" in r:
        x = r["hold"]
        out += [f"**Devices held**: {x['devices']:,} simulated devices (real Agents, {args.hold_procs} simulator "
                f"processes per node), {x['per_node']:,} linked to node A alone, then {x['per_node']:,} more to "
                "node B; VmRSS growth of the node that linked them, per device:", "",
                md_table(["phase", "node", "connect s", "VmRSS before → after MiB", "KiB per device",
                          "devices online in all", "load average"],
                         [[("A alone", "B beside A")[i], p["node"], p["connect_seconds"],
                           f"{p['rss_before_mib']} → {p['rss_after_mib']}", p["kib_per_device"], p["total_online"],
                           p["load"]] for i, p in enumerate(x["phases"])]), "",
                f"Per device with two nodes holding {x['devices']:,} / one node holding {x['per_node']:,}: "
                f"**{x['ratio']}×**.", ""]
    if "takeover" in r:
        x = r["takeover"]
        out += [f"**Takeover**: {x['devices']:,} devices (agents given both URLs, node A first) linked to A, and a "
                f"rollout to all of them (batches of {x['batch_size']:,}) whose lease A held; A killed with SIGKILL "
                f"when the rollout stood at {json.dumps(x['rollout_at_kill'])}:", "",
                md_table(["after the SIGKILL", "seconds"],
                         [["node B holds the rollout's lease", x["seconds_lease_taken"]],
                          ["every device linked to node B (presence rows: online, link node B)", x["seconds_all_back"]],
                          ["the rollout settled a device it had not before the kill", x["seconds_rollout_moved_on"]]]),
                "", f"Rollout lease time {x['lease_seconds']:g} s (`FLEETHUB_ROLLOUT_LEASE_SECONDS`). The rollout "
                "moves on once devices of its next batch are online on B, so its figure follows the devices' "
                f"reconnection. Load average then {x['load']}.", ""]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
