"""Reconnect storm: every device dropped at once and reconnecting, while REST clients keep asking.

    python bench/storm.py [--smoke] [--devices 1000] [--rate 50] [--before 15] [--after 15]

``fleethub serve`` in its own process; ``--devices`` devices provisioned in SQL and connected from one
load-generator process of real ``device_client.agent.Agent`` s (bench/delivery.py ``start_fleet``:
tmpfs state dirs, ``ignore_owner``). A REST client process (this script with ``--client``: trio + h11,
keep-alive, ``--concurrency`` connections, a fixed ``--rate`` of requests per second, half
``GET /v1/devices/{random id}`` and half ``GET /v1/devices?limit=50&page=random``, bounded by
``--max-seconds``) runs through three phases:

1. **before**: ``--before`` seconds with every device connected;
2. **during**: the load-generator process is killed with SIGKILL (every link ends in the same moment,
   the kernel closes the sockets) and a new one started on the same state directory at once, so every
   device reconnects together; the phase ends when the hub's gauge ``fleethub_connected_devices``
   (/metrics, polled every 0.2 s) is back at N after having dropped;
3. **after**: ``--after`` seconds more.

Reported: REST p50/p99/max per phase (client-side, request sent → answer read), errors (any non-2xx
or transport error), time from the kill until every device is online again (and from the new
process's start), the lowest gauge reading seen, ``GET /v1/devices?online=true`` total at the end,
hub CPU % per phase and hub VmRSS before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    OUT_DIR,
    PY,
    REPO,
    Verdicts,
    Worker,
    command_line,
    cpu_seconds,
    facts_line,
    http_json,
    loadavg,
    log,
    machine_facts,
    md_table,
    percentile,
    rss_kib,
    write_section,
)


# -- the REST client process (also used by bench/soak.py) ---------------------------------------------
async def _request(state: dict, method: str, target: str, body: bytes | None) -> tuple[int, bytes]:
    """One request on the worker's keep-alive connection (h11), reopened after any end of it."""
    import h11
    import trio

    if state.get("stream") is None or state["conn"].our_state is not h11.IDLE:
        await _close(state)
        state["stream"] = await trio.open_tcp_stream(state["host"], state["port"])
        state["conn"] = h11.Connection(h11.CLIENT)
    conn, stream = state["conn"], state["stream"]
    hdrs = [("Host", f"{state['host']}:{state['port']}"), *state["headers"]]
    if body is not None:
        hdrs += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    elif method in ("POST", "PUT", "PATCH", "DELETE"):
        hdrs.append(("Content-Length", "0"))
    out = conn.send(h11.Request(method=method, target=target, headers=hdrs))
    if body is not None:
        out += conn.send(h11.Data(data=body))
    await stream.send_all(out + conn.send(h11.EndOfMessage()))
    status, data = 0, bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            data += event.data
        elif isinstance(event, h11.EndOfMessage):
            break
        elif isinstance(event, h11.ConnectionClosed):
            raise ConnectionError("closed mid-response")
    if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
        conn.start_next_cycle()
    else:
        await _close(state)
    return status, bytes(data)


async def _close(state: dict) -> None:
    if state.get("stream") is not None:
        await state["stream"].aclose()
    state["stream"] = state["conn"] = None


def _fill(template, values: dict):
    """``{device}``, ``{page}``, ``{rand}`` … in a path or a JSON body, drawn afresh for each request."""
    if isinstance(template, str):
        return template.format(**values)
    if isinstance(template, dict):
        return {k: _fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, values) for v in template]
    return template


async def run_client(cfg: dict) -> dict:
    """Requests at a fixed rate (each of ``concurrency`` workers paced at rate/concurrency, its next
    start one period after the previous one's, never catching up in a burst), drawn by weight from
    ``mix``; until a line (or EOF) on stdin, ``max_seconds`` or ``max_requests``. Every request is
    recorded as [start (time.monotonic, the same clock in every process), kind, status, ms];
    status 0 is a transport error or a timeout."""
    import h11
    import trio

    u = urlsplit(cfg["url"])
    headers = list(cfg["headers"].items())
    mix = cfg["mix"]
    weights = [m.get("weight", 1) for m in mix]
    pools = {k: list(v) for k, v in cfg.get("pools", {}).items()}
    conc, rate = int(cfg["concurrency"]), float(cfg["rate"])
    period, timeout = conc / rate, float(cfg.get("timeout", 30))
    samples: list[list] = []
    errors: list[str] = []
    stop = trio.Event()
    budget = {"left": int(cfg.get("max_requests", 10**9))}

    async def watch_stdin() -> None:
        await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        stop.set()

    async def worker(k: int) -> None:
        rng = random.Random(k)
        state = {"host": u.hostname, "port": u.port, "headers": headers}
        next_at = trio.current_time() + rng.uniform(0, period)
        try:
            while not stop.is_set() and budget["left"] > 0:
                await trio.sleep_until(next_at)
                next_at = max(next_at + period, trio.current_time())
                budget["left"] -= 1
                m = rng.choices(mix, weights)[0]
                values = {name: rng.choice(pool) for name, pool in pools.items()}
                values.update(page=rng.randint(1, int(cfg.get("pages", 1))), rand=f"{rng.getrandbits(48):012x}")
                body = json.dumps(_fill(m["body"], values)).encode() if "body" in m else None
                t0 = time.monotonic()
                try:
                    with trio.fail_after(timeout):
                        status, raw = await _request(state, m["method"], _fill(m["path"], values), body)
                except (OSError, trio.TooSlowError, ConnectionError, h11.ProtocolError) as exc:
                    status, raw = 0, repr(exc).encode()
                    await _close(state)
                samples.append([round(t0, 4), m["kind"], status, round((time.monotonic() - t0) * 1000, 2)])
                if not 200 <= status < 300 and len(errors) < 30:
                    errors.append(f"{m['kind']} {status}: {raw[:200]!r}")
        finally:
            await _close(state)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_stdin)
        with trio.move_on_after(float(cfg["max_seconds"])):
            async with trio.open_nursery() as workers:
                for k in range(conc):
                    workers.start_soon(worker, k)
                await stop.wait()
                workers.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    return {"samples": samples, "errors": errors}


class Client:
    """This script with ``--client CONFIG`` in its own process; ``finish()`` stops it and returns its result."""

    def __init__(self, cfg: dict, name: str) -> None:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        self.cfg_path = OUT_DIR / f"{name}-client-{os.getpid()}.json"
        self.out_path = OUT_DIR / f"{name}-client-{os.getpid()}.out.json"
        self.cfg_path.write_text(json.dumps({**cfg, "out": str(self.out_path)}))
        self.log = (OUT_DIR / f"{name}-client-{os.getpid()}.log").open("wb")
        self.proc = subprocess.Popen([PY, str(Path(__file__).resolve()), "--client", str(self.cfg_path)],
                                     stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=str(REPO))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def finish(self, timeout: float = 60) -> dict:
        try:
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        if self.proc.returncode != 0:
            raise RuntimeError(f"the REST client exited with {self.proc.returncode}; see {self.log.name}")
        result = json.loads(self.out_path.read_text())
        self.cfg_path.unlink(missing_ok=True)
        return result


def latency(samples: list[list], t_from: float, t_to: float, kind: str | None = None) -> dict:
    """p50/p99/max of the 2xx answers started in [t_from, t_to), and the count of everything else."""
    inside = [s for s in samples if t_from <= s[0] < t_to and (kind is None or s[1] == kind)]
    ok = sorted(s[3] for s in inside if 200 <= s[2] < 300)
    bad = [s for s in inside if not 200 <= s[2] < 300]
    statuses: dict[str, int] = {}
    for s in inside:
        statuses[str(s[2])] = statuses.get(str(s[2]), 0) + 1
    return {"n": len(inside), "errors": len(bad), "statuses": statuses,
            "p50": round(percentile(ok, 50), 1) if ok else None, "p99": round(percentile(ok, 99), 1) if ok else None,
            "max": round(ok[-1], 1) if ok else None}


# -- the storm ---------------------------------------------------------------------------------------
def gauge(hub) -> int:
    return int(hub.metrics().get("fleethub_connected_devices", 0))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true", help="50 devices, short phases; results go to bench/out/")
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--rate", type=float, default=50.0, help="REST requests per second")
    p.add_argument("--concurrency", type=int, default=8, help="REST client connections")
    p.add_argument("--before", type=float, default=15.0, help="seconds measured before the drop")
    p.add_argument("--after", type=float, default=15.0, help="seconds measured after every device is back")
    p.add_argument("--timeout", type=float, default=300.0, help="bound on the reconnection")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="wait up to this long for the machine to be < 25%% busy before measuring")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.client:
        import trio

        cfg = json.loads(Path(args.client).read_text())
        Path(cfg["out"]).write_text(json.dumps(trio.run(run_client, cfg)))
        return 0
    if args.smoke:
        args.devices, args.before, args.after, args.rate, args.timeout = 50, 4.0, 3.0, 30.0, 60.0
    from delivery import code_version, start_fleet

    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    r: dict = {"devices": args.devices, "rate": args.rate, "concurrency": args.concurrency, "code": code_version()}
    fleet = start_fleet(args.devices, "storm")
    hub, client = fleet.hub, None
    try:
        r["rate_limit"] = fleet.extra.get("rate_limit")
        r["connect_seconds"] = fleet.connect_seconds
        pages = max(1, -(-args.devices // 50))
        cfg = {"url": hub.base_url, "headers": hub.headers, "rate": args.rate, "concurrency": args.concurrency,
               "max_seconds": args.before + args.after + args.timeout + 30, "timeout": 30, "pages": pages,
               "pools": {"device": fleet.ids},
               "mix": [{"kind": "device", "method": "GET", "path": "/v1/devices/{device}"},
                       {"kind": "list", "method": "GET", "path": "/v1/devices?limit=50&page={page}"}]}
        client = Client(cfg, "storm")
        time.sleep(2.0)  # the client process starts and opens its connections; not measured
        rss0, t_start = rss_kib(hub.pid), time.monotonic()
        cpu = [cpu_seconds(hub.pid)]
        time.sleep(args.before)
        cpu.append(cpu_seconds(hub.pid))

        # -- the drop: every link ends in the same moment, and every device comes back together --------
        old = fleet.worker
        t_kill = time.monotonic()
        os.kill(old.pid, signal.SIGKILL)
        old.proc.wait()
        fleet.worker = Worker("agent", "--hub", hub.base_url, "--data-dir", str(fleet.sim_root), name="storm-sim2")
        t_restart = time.monotonic()
        fleet.worker.send({"cmd": "add", "devices_file": str(fleet.sim_root / "devices.json"),
                           "timeout": args.timeout})
        lowest, dropped, t_back, timeline = args.devices, False, None, []
        while time.monotonic() - t_kill < args.timeout:
            n = gauge(hub)
            timeline.append((round(time.monotonic() - t_kill, 2), n))
            lowest = min(lowest, n)
            dropped = dropped or n < args.devices
            if dropped and n >= args.devices:
                t_back = time.monotonic()
                break
            time.sleep(0.2)
        cpu.append(cpu_seconds(hub.pid))
        t_end_during = t_back or time.monotonic()
        r["all_back"] = t_back is not None
        r["back_after_kill_s"] = round(t_back - t_kill, 2) if t_back else None
        r["back_after_restart_s"] = round(t_back - t_restart, 2) if t_back else None
        r["lowest_gauge"], r["gauge_dropped"] = lowest, dropped
        r["gauge_timeline"] = timeline
        log(f"storm: all back {r['all_back']} after {r['back_after_kill_s']} s (lowest gauge {lowest})")
        time.sleep(args.after)
        cpu.append(cpu_seconds(hub.pid))
        t_stop = time.monotonic()
        result = client.finish()
        client = None
        r["rss_before_kib"], r["rss_after_kib"] = rss0, rss_kib(hub.pid)
        status, body = http_json("GET", f"{hub.base_url}/v1/devices?online=true&limit=1", headers=hub.headers)
        r["online_total_end"] = body.get("pagination", {}).get("total") if status == 200 else f"HTTP {status}"
        r["readd"] = fleet.worker.receive(60)  # the new process's answer to "add"
        r["sim_stats"] = fleet.worker.request({"cmd": "stats"}, timeout=60)
        spans = {"before": (t_start, t_kill), "during": (t_kill, t_end_during), "after": (t_end_during, t_stop)}
        samples = result["samples"]
        r["phases"] = {}
        for i, (name, (a, b)) in enumerate(spans.items()):
            r["phases"][name] = {"seconds": round(b - a, 2), "all": latency(samples, a, b),
                                 "device": latency(samples, a, b, "device"), "list": latency(samples, a, b, "list"),
                                 "hub_cpu_percent": round(100 * (cpu[i + 1] - cpu[i]) / max(1e-6, b - a), 1)}
        r["errors"] = result["errors"]
        r["error_count"] = sum(1 for s in samples if not 200 <= s[2] < 300)
        r["requests"] = len(samples)
    finally:
        if client is not None:
            client.finish()
        fleet.stop()

    (OUT_DIR / f"storm{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(r, indent=1))
    verdicts = Verdicts("storm", smoke=args.smoke)
    verdicts.at_most("REST errors (non-2xx) before, during and after the storm", r["error_count"], 0)
    last_seen = r["gauge_timeline"][-1][1] if r.get("gauge_timeline") else None
    verdicts.at_least("devices connected again after the storm", last_seen, args.devices)
    body = render(r, facts, args) + "\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('storm', body, smoke=args.smoke)}")
    ok = r["all_back"] and r["error_count"] == 0 and r["online_total_end"] == args.devices
    return verdicts.exit_code(broken=not ok)  # as before: a storm that loses a device or errs fails either run


def render(r: dict, facts: dict, args) -> str:
    rows = []
    for name, ph in r["phases"].items():
        for kind in ("device", "list"):
            s = ph[kind]
            rows.append([name, f"{ph['seconds']} s", "`GET /v1/devices/{id}`" if kind == "device"
                         else "`GET /v1/devices?limit=50`", s["n"], s["errors"], s["p50"], s["p99"], s["max"],
                         ph["hub_cpu_percent"] if kind == "device" else ""])
    before, during = r["phases"]["before"]["all"], r["phases"]["during"]["all"]
    out = ["## Reconnect storm (bench/storm.py)", "", f"`{command_line()}`", "",
           f"{facts_line(facts)}; load average at end {loadavg()}. Commit {r['code']}.", "",
           "Other sessions ran tests on this machine at the same time: the latency and CPU figures are noisy.", "",
           *([f"The bench organisation is lifted out of the hub's request rate limit: {r['rate_limit']}.", ""]
             if r.get("rate_limit") else []),
           (f"{r['devices']:,} devices connected from one load-generator process of `Agent`s (first connect took "
           f"{r['connect_seconds']} s); that process is killed with SIGKILL and a new one started on the same "
           f"state directory, so every device reconnects at once. Meanwhile a REST client process sends "
           f"{r['rate']:g} requests/s over {r['concurrency']} keep-alive connections (half device reads, half "
           f"list pages). Latency: client-side, ms, 2xx answers; errors are any non-2xx or transport error."), "",
           md_table(["phase", "length", "request", "requests", "errors", "p50 ms", "p99 ms", "max ms", "hub CPU %"],
                    rows), "",
           (f"- Every device back online: **{'yes' if r['all_back'] else 'NO'}**, "
           f"{r['back_after_kill_s']} s after the kill ({r['back_after_restart_s']} s after the new process "
           f"started); lowest `fleethub_connected_devices` seen {r['lowest_gauge']}; "
           f"`GET /v1/devices?online=true` total at the end {r['online_total_end']}."),
           (f"- REST p50/p99 before → during the storm: {before['p50']}/{before['p99']} ms → "
           f"{during['p50']}/{during['p99']} ms; errors {r['error_count']} of {r['requests']:,} requests."),
           f"- Hub VmRSS {r['rss_before_kib'] / 1024:.1f} MiB before → {r['rss_after_kib'] / 1024:.1f} MiB after.",
           f"- Agents after the storm: {json.dumps({k: v for k, v in r['sim_stats'].items() if k != 'last_errors'})}."]
    if r["errors"]:
        out += ["", "First errors:", "", *[f"- `{e}`" for e in r["errors"][:5]]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
