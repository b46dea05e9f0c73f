"""MCP tool calls over Streamable HTTP against the same REST calls, and what idle MCP sessions cost the hub.

    python bench/mcp_rtt.py [--smoke] [--devices 20] [--calls 300] [--sessions 50] [--idle 20]

``fleethub serve`` in its own process, ``--devices`` devices connected from one load-generator process
(bench/_simworker.py, real ``Agent``s). From this process, one caller at a time (closed loop,
keep-alive), alternating blocks so that drift in the machine's load falls on both alike:

- REST: ``GET /v1/devices?limit=20`` and ``POST /v1/devices/{id}/ping`` with httpx;
- MCP: ``list_devices`` and ``ping_device`` through the SDK's own client (``mcp.ClientSession`` over
  its Streamable HTTP transport), one session, the PAT in its bearer form; answered as a JSON body,
  as every call is that does not ask for progress;
- MCP through the SDK's high-level ``mcp.Client`` in its default mode, which negotiates the stateless
  2026-07-28 revision with this hub (no session; one self-contained POST per call);
- the same calls on a session written by hand with httpx, REST's own client: what the protocol costs
  in the hub with the client held the same;
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

    from mcp import Client

    bearer = {"Authorization": f"Bearer {hub.pat_secret}", "X-Organization-ID": hub.org_id}
    times: dict[str, list[float]] = {k: [] for k in ("rest_list", "rest_ping", "mcp_list", "mcp_ping",
                                                     "sse_list", "sse_ping", "new_list", "new_ping",
                                                     "raw_list", "raw_ping")}
    cpu: dict[str, float] = {k: 0.0 for k in ("rest", "mcp", "sse", "new", "raw")}

    async def no_progress(value: float, total: float | None, message: str | None) -> None:
        raise AssertionError("these tools send no progress")
    per_block = max(1, calls // blocks)
    async with httpx.AsyncClient(headers=bearer, timeout=30) as rest, \
            httpx2.AsyncClient(headers=bearer, timeout=30) as raw, \
            streamable_http_client(hub.base_url + "/v1/mcp", http_client=raw) as streams, \
            ClientSession(streams[0], streams[1]) as mcp, \
            httpx2.AsyncClient(headers=bearer, timeout=30) as raw_new, \
            Client(streamable_http_client(hub.base_url + "/v1/mcp", http_client=raw_new)) as new:
        init = await mcp.initialize()
        assert new.session.protocol_version == "2026-07-28", new.session.protocol_version
        # a session of the same revision written by hand with the REST side's own client (httpx): the
        # protocol's cost in the hub apart from the SDK client's own
        url = hub.base_url + "/v1/mcp"
        head = {"Accept": "application/json, text/event-stream"}
        r = await rest.post(url, headers=head, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": init.protocol_version, "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}})
        head = {**head, "Mcp-Session-Id": r.headers["mcp-session-id"], "Mcp-Protocol-Version": init.protocol_version}
        r = await rest.post(url, headers=head, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert r.status_code == 202, r.text
        next_id = iter(range(10_000, 10**9))

        async def raw_call(name: str, arguments: dict) -> None:
            r = await rest.post(url, headers=head, json={"jsonrpc": "2.0", "id": next(next_id), "method": "tools/call",
                                                         "params": {"name": name, "arguments": arguments}})
            assert r.status_code == 200 and not r.json()["result"]["isError"], r.text

        for i in range(3):  # warm every path: the output schemas, the auth cache, the actors
            await rest.get(hub.base_url + "/v1/devices", params={"limit": 20})
            await mcp.call_tool("list_devices", {})
            await new.call_tool("list_devices", {})
            await raw_call("list_devices", {})
            await rest.post(f"{hub.base_url}/v1/devices/{ids[i % len(ids)]}/ping")
            await mcp.call_tool("ping_device", {"device_id": ids[i % len(ids)]})
            await new.call_tool("ping_device", {"device_id": ids[i % len(ids)]})
        for _ in range(blocks):
            c0 = time.process_time()
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
            cpu["rest"] += time.process_time() - c0
            c0 = time.process_time()
            for i in range(per_block):
                t = time.perf_counter()
                res = await new.call_tool("list_devices", {})
                times["new_list"].append((time.perf_counter() - t) * 1000)
                assert not res.is_error, res
                t = time.perf_counter()
                res = await new.call_tool("ping_device", {"device_id": ids[i % len(ids)]})
                times["new_ping"].append((time.perf_counter() - t) * 1000)
                assert not res.is_error, res
            cpu["new"] += time.process_time() - c0
            c0 = time.process_time()
            for i in range(per_block):
                t = time.perf_counter()
                await raw_call("list_devices", {})
                times["raw_list"].append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                await raw_call("ping_device", {"device_id": ids[i % len(ids)]})
                times["raw_ping"].append((time.perf_counter() - t) * 1000)
            cpu["raw"] += time.process_time() - c0
            for mode, progress in (("mcp", None), ("sse", no_progress)):
                c0 = time.process_time()
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
                cpu[mode] += time.process_time() - c0
    out: dict = {k: summary(v) for k, v in times.items()}
    # the client's own CPU per call (this process: one list and one ping per pair)
    out["client_cpu_ms"] = {k: round(1000 * v / (2 * per_block * blocks), 3) for k, v in cpu.items()}
    return out



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
        ratios = results.setdefault("ratios", {})
        for mode in ("new", "mcp", "sse", "raw"):
            if c.get(f"{mode}_{tool}") and c.get(rest, {}).get("p50"):
                ratios[f"{mode}_{tool}"] = round(c[f"{mode}_{tool}"]["p50"] / c[rest]["p50"], 2)
        verdicts.at_most(f"MCP {tool} p50 / REST p50, the SDK's mcp.Client (2026-07-28)",
                         ratios.get(f"new_{tool}"), 1.5, "x")
        verdicts.at_most(f"MCP {tool} p50 / REST p50, the SDK's ClientSession (2025-11-25 session)",
                         ratios.get(f"mcp_{tool}"), 1.5, "x")
        verdicts.at_most(f"MCP {tool} p50 / REST p50, the same HTTP client as REST (httpx, a 2025-11-25 session)",
                         ratios.get(f"raw_{tool}"), 1.5, "x")
    if not broken:
        body = render(results, facts, args) + "\n" + verdicts.markdown() + "\n"
        print(body)
        write_section("mcp_rtt", body, smoke=args.smoke)
    return verdicts.exit_code(broken=broken)


def render(r: dict, facts: dict, args: argparse.Namespace) -> str:
    c, idle, q, cpu = r["calls"], r["idle"], r["ratios"], r["calls"].get("client_cpu_ms", {})
    names = {"rest": ("REST", "GET /v1/devices?limit=20", "POST /v1/devices/{id}/ping", "httpx"),
             "new": ("MCP, the SDK's `mcp.Client` (its default: the stateless 2026-07-28 revision)",
                     "list_devices", "ping_device", "mcp.Client"),
             "mcp": ("MCP, the SDK's `ClientSession` (a 2025-11-25 session), JSON answers",
                     "list_devices", "ping_device", "ClientSession"),
             "sse": ("MCP, the same session, SSE answers (a progressToken)", "list_devices", "ping_device",
                     "ClientSession"),
             "raw": ("MCP, a 2025-11-25 session written by hand with httpx, REST's own client", "list_devices",
                     "ping_device", "httpx")}
    rows = []
    for tool in ("list", "ping"):
        for mode, (label, lname, pname, _) in names.items():
            k = f"{mode}_{tool}"
            rows.append([f"{label}: {lname if tool == 'list' else pname}", c[k]["n"], c[k]["p50"], c[k]["p90"],
                         c[k]["p99"], "" if mode == "rest" else f"{q.get(k)}x", cpu.get(mode, "")])
    return "\n".join([
        "## MCP tool calls vs REST, and idle MCP sessions (bench/mcp_rtt.py)", "", f"`{command_line()}`", "",
        f"{facts_line(facts)}; load average at end {loadavg()}", "",
        f"{args.devices} devices connected (real agents in one load-generator process); one caller at a time, "
        f"keep-alive, each client in turn in {args.blocks} alternating rounds. Client latency in ms (call made to "
        "answer parsed), the p50 over REST's, and the client's own CPU per call (this process, ms; one list and "
        "one ping).", "",
        md_table(["call", "n", "p50 ms", "p90 ms", "p99 ms", "p50 / REST", "client CPU ms per call"], rows), "",
        "The rows written with httpx are the protocol's cost in the hub, the client held the same as REST's; the "
        "SDK's clients add their own CPU per call on top (the last column).", "",
        f"{idle['sessions']} idle MCP sessions (initialized, each with its client's open GET stream), idle "
        f"{idle['idle_seconds']} s: hub RSS {idle['rss_before_mib']} MiB before, {idle['rss_open_mib']} MiB with them "
        f"open ({idle['rss_per_session_kib']} KiB per session); hub CPU while they idle {idle['idle_cpu_percent']} %.",
    ]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
