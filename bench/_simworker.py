"""A load-generator process holding many WebSocket links, driven by JSON lines on stdin.

    python bench/_simworker.py agent --hub http://127.0.0.1:P --data-dir DIR
    python bench/_simworker.py echo  --url ws://127.0.0.1:P/ws --interval 30

``agent`` runs real ``device_client.agent.Agent`` objects (the same code ``fleethub sim`` runs: one
trio nursery, a shared CapacityLimiter around the handshakes; its tunnel engine too, with no targets,
so the hellos are those of ``fleethub sim``); ``echo`` runs bare trio-websocket
clients that send a hello-sized frame and then one heartbeat-sized frame per interval, for the bare
echo server of bench/capacity.py.

Commands (one JSON object a line; every command is answered with one JSON line on stdout):
    {"cmd": "add", "devices_file": F}   agent: start agents for [[id, token], ...] in F
    {"cmd": "add", "n": K}              echo: open K more links
        … answered once every link added so far is up, or after "timeout" seconds
    {"cmd": "stats"}                    counts: connected, links, failures, heartbeats, commands
    {"cmd": "events", "rate": R, "seconds": T}
                                        agent: R device events a second in all, for T seconds
    {"cmd": "quit"}
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections import Counter
from pathlib import Path

import trio
from trio_websocket import open_websocket_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from device_client.agent import Agent, AgentConfig  # noqa: E402
from device_client.engine.fake import FakeEngine  # noqa: E402
from device_client.shared.clock import Clock  # noqa: E402
from webrtc.device_tunnel import attach as tunnel_engine  # noqa: E402

HELLO_LIKE = json.dumps({"type": "hello", "protocol": 1, "agentVersion": "0.1.0", "firmware": "x" * 40,
                         "architecture": "x86_64", "capabilities": {"memoryTest": {"online": False}},
                         "bootReason": "power_on", "deviceClock": "2026-01-01T00:00:00.000000Z",
                         "tunnelPublicKey": "k" * 44})
HEARTBEAT_LIKE = json.dumps({"type": "event", "kind": "heartbeat",
                             "payload": {"deviceClock": "2026-01-01T00:00:00.000000Z", "uptime": 12.345}})


class EchoClient:
    def __init__(self, url: str, interval: float, limiter: trio.CapacityLimiter) -> None:
        self.url, self.interval, self.limiter = url, interval, limiter
        self.connected = False
        self.heartbeats_sent = 0
        self.failures = 0
        self.up = trio.Event()

    async def run(self) -> None:
        while True:
            try:
                await self.limiter.acquire_on_behalf_of(self)
                held = True
                try:
                    async with open_websocket_url(self.url, connect_timeout=10, disconnect_timeout=5) as ws:
                        await ws.send_message(HELLO_LIKE)
                        await ws.get_message()
                        self.limiter.release_on_behalf_of(self)
                        held = False
                        self.connected = True
                        self.up.set()
                        await trio.sleep(random.uniform(0, self.interval))
                        while True:
                            await ws.send_message(HEARTBEAT_LIKE)
                            await ws.get_message()
                            self.heartbeats_sent += 1
                            await trio.sleep(self.interval)
                finally:
                    if held:
                        self.limiter.release_on_behalf_of(self)
                    self.connected = False
            except Exception:  # noqa: BLE001 — any end of a link: count it, back off, reconnect
                self.failures += 1
                await trio.sleep(random.uniform(0.1, 1.0))


async def send_events(agents: list, rate: float, seconds: float) -> dict:
    """``rate`` device events a second in all, each from the next connected agent in turn, for
    ``seconds``: a steady flow for the hub's organisation streams to carry. Counts what was sent and
    what could not be (an agent without a link at that moment)."""
    sent = refused = 0
    started = trio.current_time()
    n = 0
    while trio.current_time() - started < seconds:
        linked = [a for a in agents if a.statistics().connected]
        if linked:
            agent = linked[n % len(linked)]
            if await agent.send_event("bench.tick", {"n": n}):
                sent += 1
            else:
                refused += 1
        n += 1
        await trio.sleep_until(started + n / rate)
    return {"sent": sent, "refused": refused, "seconds": round(trio.current_time() - started, 3)}


async def main(args: argparse.Namespace) -> None:
    clients: list = []
    limiter = trio.CapacityLimiter(args.connect_concurrency)
    clock = Clock()

    def out(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def stats() -> dict:
        if args.mode == "agent":
            st = [a.statistics() for a in clients]
            return {"total": len(clients), "connected": sum(s.connected for s in st),
                    "links": sum(s.links for s in st), "link_failures": sum(s.link_failures for s in st),
                    "heartbeats_sent": sum(s.heartbeats_sent for s in st),
                    "commands_handled": sum(s.commands_handled for s in st),
                    "last_errors": dict(Counter((s.last_error or "")[:60] for s in st if s.last_error)
                                        .most_common(5))}
        return {"total": len(clients), "connected": sum(c.connected for c in clients),
                "link_failures": sum(c.failures for c in clients),
                "heartbeats_sent": sum(c.heartbeats_sent for c in clients)}

    async with trio.open_nursery() as nursery:
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                break
            if cmd["cmd"] == "stats":
                out(stats())
                continue
            if cmd["cmd"] == "events" and args.mode == "agent":
                out(await send_events(clients, float(cmd["rate"]), float(cmd["seconds"])))
                continue
            if cmd["cmd"] != "add":
                out({"error": f"unknown command {cmd['cmd']}"})
                continue
            started = time.monotonic()
            new = []
            if args.mode == "agent":
                devices = json.loads(Path(cmd["devices_file"]).read_text())
                for dev_id, token in devices:
                    agent = Agent(AgentConfig(args.hub, token, Path(args.data_dir) / dev_id, clock=clock,
                                              connect_limiter=limiter, tunnel_engine=tunnel_engine,
                                              container_engine=FakeEngine() if args.fake_engine else None))
                    new.append(agent)
                    nursery.start_soon(agent.run)
            else:
                for _ in range(int(cmd["n"])):
                    client = EchoClient(args.url, args.interval, limiter)
                    new.append(client)
                    nursery.start_soon(client.run)
            clients.extend(new)
            with trio.move_on_after(float(cmd.get("timeout", 300))):
                for c in new:
                    await (c.wait_connected() if args.mode == "agent" else c.up.wait())
            out({**stats(), "added": len(new), "seconds": round(time.monotonic() - started, 3)})
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["agent", "echo"])
    p.add_argument("--hub")
    p.add_argument("--data-dir")
    p.add_argument("--url")
    p.add_argument("--interval", type=float, default=30.0)
    p.add_argument("--connect-concurrency", type=int, default=200)
    p.add_argument("--log-level", default="ERROR")
    p.add_argument("--fake-engine", action="store_true", help="agents run containers on the in-memory engine "
                                                               "(device_client/engine/fake.py)")
    a = p.parse_args()
    logging.basicConfig(level=getattr(logging, a.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    trio.run(main, a)
