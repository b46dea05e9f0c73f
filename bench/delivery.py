"""Secret-file delivery: upload → "on_device", for one device and for one configuration file to a fleet.

    python bench/delivery.py [--smoke] [--devices 1000] [--uploads 50] [--modes rollout,put]
                             [--put-concurrency 16] [--py-spy]

``fleethub serve`` in its own process; ``--devices`` devices inserted in SQL (bench/_common.py
``insert_devices``) and put into one fleet (``POST /v1/fleets``, then ``UPDATE devices SET fleet_id``
on the hub's database — ``insert_devices`` does not set it — before any agent connects, so the hub
has no cached copy of the rows yet); all of them connected from one load-generator process of real
``device_client.agent.Agent`` s (bench/_simworker.py, state dirs on tmpfs). The agents run with
``ignore_owner=True``: _simworker.py builds them with ``ignore_owner=None``, which reads
``FLEETHUB_AGENT_IGNORE_OWNER``, set to 1 in the worker's environment here.

1. **One device file** (``--uploads`` times, one device, the same path with new content each time):
   ``POST /v1/devices/{id}/secret-files`` {path, content_base64}, then ``GET /v1/devices/{id}/secret-files``
   every ``--poll-ms`` until that file shows the new content's fingerprint and status ``on_device``.
   Reported: the client's time (upload sent → the poll that saw ``on_device``, so up to one poll
   interval late) and the hub's own (``secret_file_deliveries.updated_at − secret_files.updated_at``:
   saved → the device's confirmation recorded). Both clocks are this machine's.
2. **One configuration file to every device**: ``POST /v1/configurations`` {name, spec: {}} (no
   workload, so the agents' health verification passes at once), one file uploaded to it
   (``POST /v1/configurations/{id}/secret-files``), then the configuration is delivered to all devices:
   - ``rollout``: ``POST /v1/rollouts`` {fleet_id, config_id, force: true} (one batch, window bypassed);
   - ``put``: ``PUT /v1/devices/{id}/configuration`` {configId} for every device, ``--put-concurrency``
     requests at a time (keep-alive connections from threads of this process);
   a new configuration for each mode. ``GET /v1/configurations/{id}/secret-files`` is polled every 0.5 s
   until its ``deliveries.on_device`` count reaches the device count; then per device the time from the
   start instant (just before the first request) to its delivery row's ``updated_at`` (read from the
   database): p50, p99 and the last one (all done).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import hashlib
import http.client
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (OUT_DIR, REPO, HubProcess, PySpy, Worker, command_line, cpu_seconds, facts_line,  # noqa: E402
                     insert_devices, loadavg, log, machine_facts, md_table, percentile, shm_tempdir,
                     tree_cpu_seconds, wait_quiet, write_section)

UTC = dt.timezone.utc
DEVICE_FILE = "/var/lib/fleethub/secrets/bench/device-token"
CONFIG_FILE = "/var/lib/fleethub/secrets/bench/config-token"


# -- small clients ------------------------------------------------------------------------------------
class Api:
    """A keep-alive JSON client on one connection (http.client), reconnecting after any error."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float = 30.0) -> None:
        u = urlsplit(base_url)
        self.host, self.port, self.timeout = u.hostname, u.port, timeout
        self.headers = dict(headers)
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self.headers, **({"Content-Type": "application/json"} if data is not None else {})}
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                raw = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    self.close()
                return r.status, (json.loads(raw) if raw else {})
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Pg:
    """One asyncpg connection to the hub's database, used from synchronous code."""

    def __init__(self, dsn: str) -> None:
        import asyncpg

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(asyncpg.connect(dsn))

    def fetch(self, sql: str, *args) -> list:
        return self.loop.run_until_complete(self.conn.fetch(sql, *args))

    def execute(self, sql: str, *args) -> str:
        return self.loop.run_until_complete(self.conn.execute(sql, *args))

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.conn.close())
        finally:
            self.loop.close()


def expect(status: int, body: dict, ok: tuple[int, ...], what: str) -> dict:
    if status not in ok:
        raise RuntimeError(f"{what} answered {status}: {json.dumps(body)[:500]}")
    return body


def stats_ms(values: list[float]) -> dict:
    v = sorted(values)
    if not v:
        return {"n": 0}
    return {"n": len(v), "p50": round(percentile(v, 50), 1), "p90": round(percentile(v, 90), 1),
            "p99": round(percentile(v, 99), 1), "max": round(v[-1], 1), "min": round(v[0], 1),
            "mean": round(sum(v) / len(v), 1)}


def code_version() -> str:
    """The commit measured (the hub changes under the benchmarks), and whether its code was modified."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=str(REPO), capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "hub", "actors", "storage", "device_client"],
                               cwd=str(REPO), capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev or "unknown") + (" with uncommitted changes in hub/actors/storage/device_client" if dirty else "")


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (no tie correction: the instants are microseconds apart)."""
    n = len(xs)
    if n < 3:
        return None

    def ranks(v: list[float]) -> list[int]:
        order = sorted(range(n), key=v.__getitem__)
        r = [0] * n
        for rank, i in enumerate(order):
            r[i] = rank
        return r

    rx, ry = ranks(xs), ranks(ys)
    d2 = sum((a - b) ** 2 for a, b in zip(rx, ry, strict=True))
    return round(1 - 6 * d2 / (n * (n * n - 1)), 3)


CROSSING = "fleethub_storage_crossing_seconds"


def crossings(hub: HubProcess) -> dict[str, float]:
    """The hub's storage-crossing histogram (/metrics): count, sum and the cumulative buckets."""
    m = hub.metrics()
    return {k[len(CROSSING):]: v for k, v in m.items() if k.startswith(CROSSING)}


def crossing_delta(before: dict, after: dict, devices: int) -> dict:
    """Crossings between two readings: how many (per device), their mean, the share slower than 5/10 ms."""
    n = after.get("_count", 0) - before.get("_count", 0)
    if n <= 0:
        return {"count": 0}
    total = after.get("_sum", 0) - before.get("_sum", 0)

    def over(bound: str) -> float:
        key = f'_bucket{{le="{bound}"}}'
        return round(100 * (1 - (after.get(key, 0) - before.get(key, 0)) / n), 1)

    return {"count": int(n), "per_device": round(n / max(1, devices), 1), "mean_ms": round(1000 * total / n, 2),
            "over_5ms_pct": over("0.005"), "over_10ms_pct": over("0.01")}


def pg_cpu_seconds(hub: HubProcess) -> float:
    """CPU seconds of the hub's PostgreSQL: the postmaster and every backend (its children)."""
    root = hub.pg_pid()
    return 0.0 if root is None else tree_cpu_seconds(root)


# -- a hub with a fleet of connected simulated devices -----------------------------------------------
@dataclass
class Fleet:
    hub: HubProcess
    api: Api
    pg: Pg
    fleet_id: str
    devices: list[tuple[str, str]]
    worker: Worker | None = None
    sim_root: Path | None = None
    connect_seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return [d for d, _ in self.devices]

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.api.close()
        try:
            self.pg.close()
        except Exception:  # noqa: BLE001 — the hub may already be gone
            pass
        self.hub.stop()
        if self.sim_root is not None:
            shutil.rmtree(self.sim_root, ignore_errors=True)


def start_fleet(n: int, name: str, connect_timeout: float = 180.0, worker_args: tuple[str, ...] = ()) -> Fleet:
    """``fleethub serve`` + bootstrap + one fleet holding ``n`` SQL-provisioned devices, all connected
    from one _simworker.py process of Agents (ignore_owner). Stops what it started if it fails."""
    from command_rtt import wait_all_connected

    hub = HubProcess.start(heartbeat_interval=30.0, name=name)
    fleet: Fleet | None = None
    try:
        hub.bootstrap()
        api = Api(hub.base_url, hub.headers)
        pg = Pg(hub.dsn())
        fleet_id = expect(*api.call("POST", "/v1/fleets", {"name": f"{name}-fleet"}), (201,),
                          "POST /v1/fleets")["data"]["id"]
        fleet = Fleet(hub=hub, api=api, pg=pg, fleet_id=fleet_id, devices=[])
        fleet.extra["rate_limit"] = hub.extra.get("rate_limit")
        fleet.devices = insert_devices(hub.dsn(), hub.org_id, n, prefix=name)
        # insert_devices leaves fleet_id NULL; set it in SQL before any agent connects (no cached row yet)
        done = pg.execute("UPDATE devices SET fleet_id = $1 WHERE org_id = $2",
                          uuid.UUID(fleet_id), uuid.UUID(hub.org_id))
        if done != f"UPDATE {n}":
            raise RuntimeError(f"UPDATE devices SET fleet_id answered {done!r}, expected {n} rows")
        fleet.sim_root = shm_tempdir(f"fleethub-bench-{name}-")
        (fleet.sim_root / "devices.json").write_text(json.dumps(fleet.devices))
        os.environ["FLEETHUB_AGENT_IGNORE_OWNER"] = "1"  # the Worker inherits it: ignore_owner=None reads it
        fleet.worker = Worker("agent", "--hub", hub.base_url, "--data-dir", str(fleet.sim_root), *worker_args,
                              name=f"{name}-sim")
        t0 = time.monotonic()
        fleet.worker.send({"cmd": "add", "devices_file": str(fleet.sim_root / "devices.json"),
                           "timeout": connect_timeout})
        if not wait_all_connected(hub, n, connect_timeout + 30):
            raise RuntimeError(f"the {n} devices did not all connect; see {fleet.worker.log_path}")
        fleet.connect_seconds = round(time.monotonic() - t0, 1)
        fleet.worker.receive(connect_timeout + 60)
        log(f"{n} devices of fleet {fleet_id} connected to {hub.base_url} in {fleet.connect_seconds} s")
        time.sleep(1.0)  # let the hellos' presence rows and delivery jobs settle
        return fleet
    except BaseException:
        if fleet is not None:
            fleet.stop()
        else:
            hub.stop()
        raise


def quiet(fleet: Fleet, args) -> tuple[float | None, float | None]:
    """wait_quiet before a measured part; also the hub's own CPU % meanwhile (is the hub what keeps the
    machine busy?)."""
    if args.smoke:
        return None, None
    c0, t0 = cpu_seconds(fleet.hub.pid), time.monotonic()
    busy = wait_quiet(args.round_quiet_wait)
    return round(busy), round(100 * (cpu_seconds(fleet.hub.pid) - c0) / (time.monotonic() - t0), 1)


# -- 1. one device file ------------------------------------------------------------------------------
def one_device(fleet: Fleet, uploads: int, poll: float, timeout: float) -> dict:
    api = Api(fleet.hub.base_url, fleet.hub.headers)  # its own connection for uploads and polls
    device = fleet.ids[0]
    client_ms, hub_ms, polls = [], [], []
    try:
        for i in range(uploads):
            content = f"bench upload {i} {secrets.token_hex(16)}\n".encode()
            sha = hashlib.sha256(content).hexdigest()
            t0 = time.monotonic()
            status, body = api.call("POST", f"/v1/devices/{device}/secret-files",
                                    {"path": DEVICE_FILE, "content_base64": base64.b64encode(content).decode()})
            saved = expect(status, body, (200, 201), "POST /v1/devices/{id}/secret-files")["data"]
            file_id = saved["id"]
            n_polls, seen = 0, None
            while time.monotonic() - t0 < timeout:
                if saved["sha256Prefix"] == sha[:16] and saved["status"] == "on_device":
                    seen = time.monotonic()
                    break
                time.sleep(poll)
                n_polls += 1
                status, body = api.call("GET", f"/v1/devices/{device}/secret-files")
                files = expect(status, body, (200,), "GET /v1/devices/{id}/secret-files")["data"]
                saved = next((f for f in files if f["id"] == file_id), saved)
            if seen is None:
                raise RuntimeError(f"upload {i} was not on_device within {timeout}s: {saved}")
            client_ms.append((seen - t0) * 1000)
            polls.append(n_polls)
            row = fleet.pg.fetch(
                "SELECT f.updated_at AS saved, d.updated_at AS confirmed, d.status FROM secret_files f "
                "JOIN secret_file_deliveries d ON d.file_id = f.id AND d.device_id = f.device_id "
                "WHERE f.id = $1", uuid.UUID(file_id))[0]
            hub_ms.append((row["confirmed"] - row["saved"]).total_seconds() * 1000)
    finally:
        api.close()
    return {"device": device, "uploads": uploads, "poll_ms": poll * 1000, "client": stats_ms(client_ms),
            "hub": stats_ms(hub_ms), "polls_mean": round(sum(polls) / max(1, len(polls)), 1),
            "client_ms": [round(x, 2) for x in client_ms], "hub_ms": [round(x, 2) for x in hub_ms]}


# -- 2. one configuration file to every device ---------------------------------------------------------
def put_all(fleet: Fleet, config_id: str, concurrency: int) -> dict:
    """PUT /v1/devices/{id}/configuration for every device, ``concurrency`` keep-alive clients."""
    local = threading.local()
    clients: list[Api] = []
    lock = threading.Lock()

    def one(device_id: str) -> tuple[int, float]:
        api = getattr(local, "api", None)
        if api is None:
            api = local.api = Api(fleet.hub.base_url, fleet.hub.headers)
            with lock:
                clients.append(api)
        t0 = time.monotonic()
        status, _ = api.call("PUT", f"/v1/devices/{device_id}/configuration", {"configId": config_id})
        return status, (time.monotonic() - t0) * 1000

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            answers = list(pool.map(one, fleet.ids))
    finally:
        for c in clients:
            c.close()
    statuses: dict[str, int] = {}
    for st, _ in answers:
        statuses[str(st)] = statuses.get(str(st), 0) + 1
    return {"statuses": statuses, "request_ms": stats_ms([ms for _, ms in answers])}


def to_fleet(fleet: Fleet, mode: str, args, tag: str) -> dict:
    n = len(fleet.devices)
    api = fleet.api
    cfg = expect(*api.call("POST", "/v1/configurations", {"name": f"bench-delivery-{mode}-{tag}", "spec": {}}),
                 (201,), "POST /v1/configurations")["data"]
    content = f"bench configuration file {mode} {secrets.token_hex(16)}\n".encode()
    f = expect(*api.call("POST", f"/v1/configurations/{cfg['id']}/secret-files",
                         {"path": CONFIG_FILE, "content_base64": base64.b64encode(content).decode()}),
               (201,), "POST /v1/configurations/{id}/secret-files")["data"]
    busy, hub_busy = quiet(fleet, args)
    cross0 = crossings(fleet.hub)
    spy = PySpy(fleet.hub.pid, OUT_DIR / f"delivery-{mode}-hub.pyspy.txt") if args.py_spy else None
    hub_cpu0, pg_cpu0, sim_cpu0 = cpu_seconds(fleet.hub.pid), pg_cpu_seconds(fleet.hub), cpu_seconds(fleet.worker.pid)
    start_wall, t0 = time.time(), time.monotonic()
    out: dict = {"mode": mode, "devices": n, "config_id": cfg["id"], "file_id": f["id"],
                 "busy_before": None if busy is None else round(busy), "hub_busy_before": hub_busy}
    if mode == "rollout":
        ro = expect(*api.call("POST", "/v1/rollouts", {"fleet_id": fleet.fleet_id, "config_id": cfg["id"],
                                                        "force": True}), (201,), "POST /v1/rollouts")["data"]
        out["rollout_id"] = ro["id"]
        out["eligible"] = ro["counts"]
        out["request_ms"] = round((time.monotonic() - t0) * 1000, 1)
    else:
        out.update(put_all(fleet, cfg["id"], args.put_concurrency))
        out["requests_seconds"] = round(time.monotonic() - t0, 2)
    counts: dict = {}
    polls = 0
    poll_ms: list[float] = []
    seen_done = None
    while time.monotonic() - t0 < args.fleet_timeout:
        p0 = time.monotonic()
        status, body = api.call("GET", f"/v1/configurations/{cfg['id']}/secret-files")
        poll_ms.append((time.monotonic() - p0) * 1000)
        polls += 1
        files = expect(status, body, (200,), "GET /v1/configurations/{id}/secret-files")["data"]
        counts = files[0]["deliveries"] if files else {}
        if counts.get("on_device", 0) + counts.get("failed", 0) >= n:
            seen_done = time.monotonic() - t0
            break
        time.sleep(0.5)
    hub_cpu = cpu_seconds(fleet.hub.pid) - hub_cpu0
    pg_cpu = pg_cpu_seconds(fleet.hub) - pg_cpu0
    sim_cpu = cpu_seconds(fleet.worker.pid) - sim_cpu0
    if spy:
        spy.stop()
        out["py_spy"] = spy.summary(top=80)
    out["crossings"] = crossing_delta(cross0, crossings(fleet.hub), n)
    out["counts"] = counts
    out["polls"] = polls
    out["poll_ms"] = stats_ms(poll_ms)  # what an API call costs while the delivery runs
    out["seen_done_s"] = None if seen_done is None else round(seen_done, 2)
    rows = fleet.pg.fetch("SELECT device_id, status, updated_at FROM secret_file_deliveries WHERE file_id = $1",
                          uuid.UUID(f["id"]))
    start = dt.datetime.fromtimestamp(start_wall, UTC)
    done = [(r["updated_at"] - start).total_seconds() * 1000 for r in rows if r["status"] == "on_device"]
    out["statuses"] = out.get("statuses") or {}
    out["delivery_rows"] = {s: sum(1 for r in rows if r["status"] == s) for s in {r["status"] for r in rows}}
    out["on_device_ms"] = stats_ms(done)
    # Are devices served one after the other? Rank correlation between the order the hub starts them in
    # (a rollout: its steps' order, batch then device id; PUTs: request order) and their on_device instant.
    order = sorted(fleet.ids, key=uuid.UUID) if mode == "rollout" else fleet.ids
    at = {str(r["device_id"]): r["updated_at"] for r in rows if r["status"] == "on_device"}
    out["order_rank_correlation"] = spearman([i for i, d in enumerate(order) if d in at],
                                             [at[d].timestamp() for d in order if d in at])
    out["all_done_s"] = round(max(done) / 1000, 2) if len(done) == n else None
    out["cpu_seconds"] = {"hub": round(hub_cpu, 2), "postgres": round(pg_cpu, 2), "agents": round(sim_cpu, 2)}
    out["hub_cpu_ms_per_device"] = round(1000 * hub_cpu / n, 2)
    if mode == "rollout":
        # the rollout settles at its next tick; wait for it (bounded) so the next mode starts clean
        deadline = time.monotonic() + 60
        while True:
            body = expect(*api.call("GET", f"/v1/rollouts/{out['rollout_id']}"), (200,), "GET /v1/rollouts/{id}")
            if body["data"]["state"] in ("completed", "failed", "cancelled", "paused") or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        out["rollout_state"] = body["data"]["state"]
        out["rollout_seen_s"] = round(time.monotonic() - t0, 2)
        out["rollout_counts"] = {k: v for k, v in body["data"]["counts"].items() if v}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny size, < 30 s; results go to bench/out/")
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--uploads", type=int, default=50)
    p.add_argument("--poll-ms", type=float, default=10.0, help="poll interval of the one-device part")
    p.add_argument("--modes", default="rollout,put", help="how the configuration reaches the fleet: rollout, put")
    p.add_argument("--put-concurrency", type=int, default=16)
    p.add_argument("--fleet-timeout", type=float, default=300.0, help="bound on each fleet delivery")
    p.add_argument("--py-spy", action="store_true", help="record the hub with py-spy during each fleet delivery")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="wait up to this long for the machine to be < 25%% busy before measuring")
    p.add_argument("--round-quiet-wait", type=float, default=60.0, help="and up to this long before each part")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.devices, args.uploads, args.fleet_timeout = 20, 5, 60.0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(modes) - {"rollout", "put"}:
        p.error("--modes takes rollout and/or put")
    facts = machine_facts(0 if args.smoke else args.quiet_wait)

    results: dict = {"fleet": [], "code": code_version()}
    fleet = start_fleet(args.devices, "delivery")
    try:
        results["rate_limit"] = fleet.extra.get("rate_limit")
        results["connect_seconds"] = fleet.connect_seconds
        busy, hub_busy = quiet(fleet, args)
        results["one"] = one_device(fleet, args.uploads, args.poll_ms / 1000, timeout=30.0)
        results["one"]["busy_before"], results["one"]["hub_busy_before"] = busy, hub_busy
        log(f"one device: client {results['one']['client']}, hub {results['one']['hub']}")
        tag = secrets.token_hex(3)
        for mode in modes:
            r = to_fleet(fleet, mode, args, tag)
            results["fleet"].append(r)
            log(f"{mode}: {json.dumps({k: v for k, v in r.items() if k != 'py_spy'})}")
        stats = fleet.worker.request({"cmd": "stats"}, timeout=60)
        results["agents"] = {k: stats.get(k) for k in ("total", "connected", "link_failures", "commands_handled",
                                                        "last_errors")}
        results["hub_alive"] = fleet.hub.alive()
    finally:
        fleet.stop()

    (OUT_DIR / f"delivery{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(results, indent=1))
    body = render(results, facts, args)
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('delivery', body, smoke=args.smoke)}")
    bad = (results["one"]["client"].get("n") != args.uploads
           or any(r["all_done_s"] is None for r in results["fleet"]))
    return 1 if (args.smoke and bad) else 0


def render(r: dict, facts: dict, args) -> str:
    one = r["one"]
    c, h = one["client"], one["hub"]
    out = ["## Secret-file delivery (bench/delivery.py)", "", f"`{command_line()}`", "",
           f"{facts_line(facts)}; load average at end {loadavg()}; code at {r.get('code')}", "",
           *([f"The bench organisation is lifted out of the hub's request rate limit: {r['rate_limit']}.", ""]
             if r.get("rate_limit") else []),
           f"`fleethub serve` with {args.devices:,} devices in one fleet (SQL-provisioned, `fleet_id` set in SQL), "
           f"all connected ({r['connect_seconds']} s) from one load-generator process of `Agent`s "
           f"(ignore_owner, state on tmpfs). Times are ms unless marked s.", "",
           f"### One device file, {one['uploads']} uploads", "",
           f"`POST /v1/devices/{{id}}/secret-files` (same path, new content each time), then "
           f"`GET /v1/devices/{{id}}/secret-files` every {one['poll_ms']:g} ms until that content is `on_device` "
           f"({one['polls_mean']} polls per upload on average). **client**: upload sent → poll that saw it "
           f"(≤ one poll interval late); **hub**: `secret_file_deliveries.updated_at − secret_files.updated_at` "
           f"(saved → device's confirmation recorded). Machine busy just before: "
           f"{'—' if one.get('busy_before') is None else str(one['busy_before']) + '%'}.", "",
           md_table(["measure", "n", "p50", "p90", "p99", "max", "mean"],
                    [["client", c.get("n"), c.get("p50"), c.get("p90"), c.get("p99"), c.get("max"), c.get("mean")],
                     ["hub", h.get("n"), h.get("p50"), h.get("p90"), h.get("p99"), h.get("max"), h.get("mean")]]),
           ""]
    if r["fleet"]:
        out += [f"### One configuration file to {args.devices:,} devices", "",
                "A new configuration (`spec: {}`: no workload, health verified at once) with one secret file, then "
                "delivered by a forced rollout (`POST /v1/rollouts` {fleet_id, config_id, force: true}) or by one "
                f"`PUT /v1/devices/{{id}}/configuration` per device ({args.put_concurrency} at a time). Per device: "
                "start (just before the first request) → its delivery row `on_device` (`updated_at`, from the "
                "database). CPU seconds over the delivery (start → all seen done, incl. the 0.5 s polls of "
                "`GET /v1/configurations/{id}/secret-files`).", ""]
        rows = []
        for x in r["fleet"]:
            s = x["on_device_ms"]
            req = (f"POST {x['request_ms']} ms" if x["mode"] == "rollout" else
                   f"{sum(x['statuses'].values()):,} PUTs in {x['requests_seconds']} s "
                   f"(p50 {x['request_ms'].get('p50')} / p99 {x['request_ms'].get('p99')} ms; {x['statuses']})")
            rows.append([x["mode"], req, f"{s.get('n', 0):,}", s.get("p50"), s.get("p90"), s.get("p99"),
                         x["all_done_s"] if x["all_done_s"] is not None else f"not all ({x['delivery_rows']})",
                         x["cpu_seconds"]["hub"], x["hub_cpu_ms_per_device"], x["cpu_seconds"]["postgres"],
                         x["cpu_seconds"]["agents"], x.get("order_rank_correlation"),
                         "—" if x.get("busy_before") is None else f"{x['busy_before']}% (hub {x['hub_busy_before']}%)"])
        out += [md_table(["delivery", "requests", "on_device", "p50 ms", "p90 ms", "p99 ms", "all done s",
                          "hub CPU s", "hub CPU ms/device", "PostgreSQL CPU s", "agents CPU s",
                          "order ↔ on_device rank corr.",
                          "machine busy before (hub's share)"], rows)]
        out += ["", "Rank correlation: between the order the hub starts the devices in (a rollout's steps: batch, "
                "then device id; the PUTs: request order) and the order they reach `on_device`; 1.0 means one "
                "device after the other."]
        out += [""] + [f"Storage crossings (trio → asyncpg, the hub's /metrics histogram) during the {x['mode']} "
                       f"delivery: {x['crossings'].get('count', 0):,} ({x['crossings'].get('per_device')} per device), "
                       f"mean {x['crossings'].get('mean_ms')} ms, {x['crossings'].get('over_5ms_pct')}% over 5 ms, "
                       f"{x['crossings'].get('over_10ms_pct')}% over 10 ms; meanwhile the "
                       f"{x['poll_ms'].get('n')} polls of `GET /v1/configurations/{{id}}/secret-files` took p50 "
                       f"{x['poll_ms'].get('p50')} ms, max {x['poll_ms'].get('max')} ms." for x in r["fleet"]]
        for x in r["fleet"]:
            if x.get("rollout_state"):
                out += ["", f"Rollout {x['rollout_id']}: {x['rollout_state']} (seen {x['rollout_seen_s']} s after the "
                        f"start), steps {x['rollout_counts']}."]
    if r.get("agents"):
        a = r["agents"]
        out += ["", f"Agents at the end: {a.get('connected')}/{a.get('total')} connected, "
                f"{a.get('link_failures')} link failures, {a.get('commands_handled')} commands handled."]
    for x in r["fleet"]:
        if x.get("py_spy"):
            out += ["", f"py-spy of the hub during the {x['mode']} delivery (share of samples, self time):", ""]
            out += [f"- {pct}% {frame}" for frame, pct in x["py_spy"]["self"][:10]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
