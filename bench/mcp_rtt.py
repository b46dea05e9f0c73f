"""MCP tool calls over Streamable HTTP against the same REST calls, and what idle MCP sessions cost the hub.

    python bench/mcp_rtt.py [--smoke] [--devices 20] [--calls 300] [--sessions 50] [--idle 20]

``fleethub serve`` in its own process, ``--devices`` devices connected from one load-generator process
(bench/_simworker.py, real ``Agent``s). From this process, one caller at a time (closed loop,
keep-alive), alternating blocks so that drift in the machine's load falls on both alike:

- REST: ``GET /v1/devices?limit=20`` and ``POST /v1/devices/{id}/ping`` with httpx;
- MCP: ``list_devices`` and ``ping_device`` through the SDK's own client (``mcp.ClientSession`` over
  its Streamable HTTP transport), one session, the PAT in its bearer form; answered as a JSON body,
  as every call is that does not ask for progress;
- MCP with SSE answers (the A/B): the same calls with a progressToken (the client's
  ``progress_callback``), which the hub answers as an SSE stream (the SDK's default for every call,
  hub/mcp/endpoint.py); these tools send no progress, so only the answer's framing differs.

Latency is the client's, call made to answer parsed, ms; the aim is an MCP p50 at most 1.5x its REST
p50. Then ``--sessions`` MCP sessions are opened (initialize, as a client does) and left idle for
``--idle`` seconds: the hub's RSS before and after (its /metrics process collector) and the CPU it
spends while they idle.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (OUT_DIR, HubProcess, Verdicts, Worker, command_line, facts_line, hub_cpu_seconds,  # noqa: E402
                     hub_rss_kib, insert_devices, loadavg, log, machine_facts, md_table, percentile, shm_tempdir,
                     write_section)


def summary(ms: list[float]) -> dict:
    s = sorted(ms)
    return {"n": len(s), "p50": round(percentile(s, 50), 3), "p90": round(percentile(s, 90), 3),
            "p99": round(percentile(s, 99), 3)}


async def measure(hub: HubProcess, ids: list[str], calls: int, blocks: int) -> dict:
    from mcp import ClientSession
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    bearer = {"Authorization": f"Bearer {hub.pat_secret}", "X-Organization-ID": hub.org_id}
    times: dict[str, list[float]] = {k: [] for k in ("rest_list", "rest_ping", "mcp_list", "mcp_ping",
                                                     "sse_list", "sse_ping")}

    async def no_progress(value: float, total: float | None, message: str | None) -> None:
        raise AssertionError("these tools send no progress")
    per_block = max(1, calls // blocks)
    async with httpx.AsyncClient(headers=bearer, timeout=30) as rest, \
            httpx2.AsyncClient(headers=bearer, timeout=30) as raw, \
            streamable_http_client(hub.base_url + "/v1/mcp", http_client=raw) as streams, \
            ClientSession(streams[0], streams[1]) as mcp:
        await mcp.initialize()
        for i in range(3):  # warm both paths: the output schemas, the auth cache, the actors
            await rest.get(hub.base_url + "/v1/devices", params={"limit": 20})
            await mcp.call_tool("list_devices", {})
            await rest.post(f"{hub.base_url}/v1/devices/{ids[i % len(ids)]}/ping")
            await mcp.call_tool("ping_device", {"device_id": ids[i % len(ids)]})
        for _ in range(blocks):
            for i in range(per_block):
                t = time.perf_counter()
                r = await rest.get(hub.base_url + "/v1/devices", params={"limit": 20})
                r.json()
                times["rest_list"].append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, r.text
                t = time.perf_counter()
                r = await rest.post(f"{hub.base_url}/v1/devices/{ids[i % len(ids)]}/ping")
                r.json()
                times["rest_ping"].append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, r.text
            for mode, progress in (("mcp", None), ("sse", no_progress)):
                for i in range(per_block):
                    t = time.perf_counter()
                    res = await mcp.call_tool("list_devices", {}, progress_callback=progress)
                    times[f"{mode}_list"].append((time.perf_counter() - t) * 1000)
                    assert not res.is_error, res
                    t = time.perf_counter()
                    res = await mcp.call_tool("ping_device", {"device_id": ids[i % len(ids)]},
                                              progress_callback=progress)
                    times[f"{mode}_ping"].append((time.perf_counter() - t) * 1000)
                    assert not res.is_error, res
    return {k: summary(v) for k, v in times.items()}


async def idle_sessions(hub: HubProcess, n: int, idle: float) -> dict:
    from mcp import ClientSession
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    bearer = {"Authorization": f"Bearer {hub.pat_secret}", "X-Organization-ID": hub.org_id}
    m0 = hub.metrics()
    opened = 0
    out: dict = {}

    async def one(ready: trio.Event, release: trio.Event) -> None:
        nonlocal opened
        async with httpx2.AsyncClient(headers=bearer, timeout=httpx2.Timeout(30, read=None)) as raw, \
                streamable_http_client(hub.base_url + "/v1/mcp", http_client=raw) as streams, \
                ClientSession(streams[0], streams[1]) as mcp:
            await mcp.initialize()
            opened += 1
            if opened == n:
                ready.set()
            await release.wait()

    ready, release = trio.Event(), trio.Event()
    with trio.fail_after(120 + idle):
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one, ready, release)
            await ready.wait()
            await trio.sleep(1)
            m1 = hub.metrics()
            await trio.sleep(idle)
            m2 = hub.metrics()
            release.set()
    out["sessions"] = n
    out["rss_before_mib"] = round(hub_rss_kib(m0) / 1024, 1)
    out["rss_open_mib"] = round(hub_rss_kib(m2) / 1024, 1)
    out["rss_per_session_kib"] = round((hub_rss_kib(m2) - hub_rss_kib(m0)) / n, 1)
    out["idle_seconds"] = idle
    out["idle_cpu_percent"] = round(100 * (hub_cpu_seconds(m2) - hub_cpu_seconds(m1)) / idle, 2)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny size, < 30 s; results go to bench/out/")
    p.add_argument("--devices", type=int, default=20)
    p.add_argument("--calls", type=int, default=300, help="measured calls of each kind")
    p.add_argument("--blocks", type=int, default=6, help="alternating REST/MCP blocks")
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--idle", type=float, default=20.0)
    p.add_argument("--quiet-wait", type=float, default=60.0)
    args = p.parse_args()
    if args.smoke:
        args.devices, args.calls, args.blocks, args.sessions, args.idle = 3, 20, 2, 5, 2.0
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    hub = HubProcess.start(heartbeat_interval=30.0, name="mcp-hub")
    sim_root = shm_tempdir("fleethub-bench-mcp-")
    worker = None
    results: dict = {}
    broken = False
    try:
        hub.bootstrap()
        devices = insert_devices(hub.dsn(), hub.org_id, args.devices)
        ids = [d for d, _ in devices]
        worker = Worker("agent", "--hub", hub.base_url, "--data-dir", str(sim_root), name="mcp-sim")
        (sim_root / "devices.json").write_text(json.dumps(devices))
        worker.send({"cmd": "add", "devices_file": str(sim_root / "devices.json"), "timeout": 120})
        worker.receive(180)
        t0 = time.monotonic()
        while int(hub.metrics().get("fleethub_connected_devices", 0)) < args.devices:
            if time.monotonic() - t0 > 120:
                raise RuntimeError("the devices did not all connect")
            time.sleep(0.25)
        log(f"{args.devices} devices connected to {hub.base_url}")
        results["calls"] = trio.run(measure, hub, ids, args.calls, args.blocks)
        log(f"calls: {json.dumps(results['calls'])}")
        results["idle"] = trio.run(idle_sessions, hub, args.sessions, args.idle)
        log(f"idle sessions: {json.dumps(results['idle'])}")
    except Exception as exc:  # noqa: BLE001 — a bench reports a broken run and exits 1
        log(f"broken: {exc!r}")
        broken = True
    finally:
        if worker is not None:
            worker.stop()
        hub.stop()
        shutil.rmtree(sim_root, ignore_errors=True)

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"mcp_rtt{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(results, indent=1))
    verdicts = Verdicts("mcp_rtt", smoke=args.smoke)
    c = results.get("calls", {})
    for tool, rest in (("list", "rest_list"), ("ping", "rest_ping")):
        ratio = None
        if c.get(f"mcp_{tool}") and c.get(rest, {}).get("p50"):
            ratio = round(c[f"mcp_{tool}"]["p50"] / c[rest]["p50"], 2)
        results.setdefault("ratios", {})[tool] = ratio
        if c.get(f"sse_{tool}") and c.get(rest, {}).get("p50"):
            results["ratios"][f"sse_{tool}"] = round(c[f"sse_{tool}"]["p50"] / c[rest]["p50"], 2)
        verdicts.at_most(f"MCP {tool} p50 / REST p50", ratio, 1.5, "x")
    if not broken:
        body = render(results, facts, args) + "\n" + verdicts.markdown() + "\n"
        print(body)
        write_section("mcp_rtt", body, smoke=args.smoke)
    return verdicts.exit_code(broken=broken)


def render(r: dict, facts: dict, args: argparse.Namespace) -> str:
    c, idle = r["calls"], r["idle"]
    names = {"rest_list": "REST GET /v1/devices?limit=20", "mcp_list": "MCP list_devices (JSON answer)",
             "sse_list": "MCP list_devices (SSE answer)", "rest_ping": "REST POST /v1/devices/{id}/ping",
             "mcp_ping": "MCP ping_device (JSON answer)", "sse_ping": "MCP ping_device (SSE answer)"}
    rows = [[names[k], c[k]["n"], c[k]["p50"], c[k]["p90"], c[k]["p99"]]
            for k in ("rest_list", "mcp_list", "sse_list", "rest_ping", "mcp_ping", "sse_ping")]
    return "\n".join([
        "## MCP tool calls vs REST, and idle MCP sessions (bench/mcp_rtt.py)", "", f"`{command_line()}`", "",
        f"{facts_line(facts)}; load average at end {loadavg()}", "",
        f"{args.devices} devices connected (real agents in one load-generator process); one caller at a time, "
        f"keep-alive, REST, MCP with JSON answers and MCP with SSE answers (the same calls with a progressToken) in "
        f"{args.blocks} alternating rounds; the MCP client is the SDK's own "
        "(`mcp.ClientSession`, Streamable HTTP), the REST one httpx. Client latency, ms.", "",
        md_table(["call", "n", "p50 ms", "p90 ms", "p99 ms"], rows), "",
        f"p50 ratio MCP/REST with JSON answers (every call without a progressToken): list_devices "
        f"{r['ratios']['list']}x, ping {r['ratios']['ping']}x (aim ≤ 1.5x); with SSE answers (the SDK's default "
        f"mode, now only for calls that ask for progress): list_devices {r['ratios'].get('sse_list')}x, ping "
        f"{r['ratios'].get('sse_ping')}x.", "",
        f"{idle['sessions']} idle MCP sessions (initialized, each with its client's open GET stream), idle "
        f"{idle['idle_seconds']} s: hub RSS {idle['rss_before_mib']} MiB before, {idle['rss_open_mib']} MiB with them "
        f"open ({idle['rss_per_session_kib']} KiB per session); hub CPU while they idle {idle['idle_cpu_percent']} %.",
    ]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
