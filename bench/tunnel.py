"""Tunnel data plane: time to the first echoed byte, and one forwarded TCP stream's throughput beside
direct loopback TCP.

    python bench/tunnel.py [--smoke] [--mb 64] [--rounds 3] [--sessions 5] [--no-write]

Four processes, as in use: the *client* (the CLI's peer, webrtc/peer.py, listening on 127.0.0.1),
the *device* (the agent's peer, connecting each channel to the target), the *target* (an asyncio TCP
server: a sink that answers with the byte count at EOF, or an echo), and this process, the load
generator (blocking sockets). The hub is not involved: offer and answer travel over the workers'
pipes, so "first byte" is measured from the moment the client is asked for its offer (the hub's own
share, signing the grant and relaying the command, is measured by the e2e path, not here).

- first byte: offer → answer → connected → listener up → connect, send 1 byte to the echo, read it.
- throughput: ``--mb`` MiB in 64 KiB writes to the sink, until its count comes back; the same through
  a second pair of peers running aiortc's own SCTP acknowledgements (webrtc/sctp.py switched off);
  the same bytes straight to the sink over loopback TCP. Rounds alternate the three.

ICE is limited to 127.0.0.1 (FLEETHUB_ICE_ADDRESSES) so the peers meet on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (OUT_DIR, PY, REPO, command_line, cpu_seconds, facts_line, loadavg, log,  # noqa: E402
                     machine_facts, md_table, write_section)

CHUNK = 64 * 1024


# ---- workers ---------------------------------------------------------------------------------------

def target_worker() -> None:
    """First byte picks the service: b"S" sink (answer 8-byte count at EOF), b"E" echo, b"G" + an
    8-byte count: a source that sends that many bytes, then closes (bench/tunnel_interactive.py)."""

    block = os.urandom(CHUNK)

    class Target(asyncio.Protocol):
        def connection_made(self, transport):
            self.t, self.mode, self.count, self.header, self.paused = transport, None, 0, b"", False

        def data_received(self, data):
            if self.mode is None:
                self.mode, data = data[:1], data[1:]
            if self.mode == b"E":
                self.t.write(data)
            elif self.mode == b"G":
                self.header += data
                if len(self.header) >= 8 and not self.count:
                    self.count = struct.unpack("!Q", self.header[:8])[0]
                    self.resume_writing()
            else:
                self.count += len(data)

        def pause_writing(self):
            self.paused = True

        def resume_writing(self):
            self.paused = False
            while self.mode == b"G" and self.count > 0 and not self.paused:
                n = min(self.count, CHUNK)
                self.count -= n
                self.t.write(block[:n])
            if self.mode == b"G" and self.count == 0:
                self.t.close()

        def eof_received(self):
            if self.mode == b"S":
                self.t.write(struct.pack("!Q", self.count))
            self.t.close()

    async def main():
        server = await asyncio.get_running_loop().create_server(Target, "127.0.0.1", 0)
        print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())


def peer_worker(role: str, target_port: int) -> None:
    import logging

    import trio

    logging.basicConfig(level=os.environ.get("BENCH_LOG_LEVEL", "WARNING"))  # to bench/out/tunnel-*.log

    from webrtc.peer import TunnelPeer

    async def main() -> None:
        stdin = trio.lowlevel.FdStream(os.dup(0))
        buffer = b""
        peers: list[TunnelPeer] = []
        current: TunnelPeer | None = None
        while True:
            while b"\n" not in buffer:
                data = await stdin.receive_some(1 << 20)
                if not data:
                    return
                buffer += data
            line, buffer = buffer.split(b"\n", 1)
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                for p in peers:
                    await p.close()
                return
            if cmd["cmd"] == "offer":
                current = TunnelPeer()
                peers.append(current)
                out = {"offer": await current.create_offer()}
            elif cmd["cmd"] == "answer":
                current = TunnelPeer()
                peers.append(current)
                out = {"answer": await current.answer(cmd["offer"], target=("127.0.0.1", target_port))}
            elif cmd["cmd"] == "connect":
                await current.set_answer(cmd["answer"])
                await current.wait_control_open()
                _, port = await current.listen("127.0.0.1", 0)
                out = {"port": port}
            elif cmd["cmd"] == "state":
                out = {"state": current.state if current else None}
            elif cmd["cmd"] == "sctp":  # what sits in the association (bench/tunnel_interactive.py)
                sctp = current.conn.pc.sctp
                out = {"queued": sum(len(m[2]) for m in list(sctp._data_channel_queue)),
                       "outbound": sum(len(c.user_data) for c in list(sctp._outbound_queue)),
                       "flight": sctp._flight_size, "cwnd": sctp._cwnd}
            elif cmd["cmd"] == "close":
                for p in peers:
                    await p.close()
                peers.clear()
                out = {"closed": True}
            print(json.dumps(out), flush=True)

    trio.run(main)


def hub_client_worker(hub_url: str, device_id: str) -> None:
    """The CLI's side through the hub: webrtc.client.run_tunnel (on trio_client.py's asyncio thread), one session per ``open``."""
    import trio

    from webrtc.client import Credentials
    from webrtc.trio_client import run_tunnel_in_trio

    credentials = Credentials(org_id=os.environ["BENCH_ORG"], pat_id=os.environ["BENCH_PAT_ID"],
                              pat_secret=os.environ["BENCH_PAT_SECRET"])

    async def main() -> None:
        stdin = trio.lowlevel.FdStream(os.dup(0))
        buffer = b""
        async with trio.open_nursery() as nursery:
            scope: trio.CancelScope | None = None
            while True:
                while b"\n" not in buffer:
                    data = await stdin.receive_some(65536)
                    if not data:
                        nursery.cancel_scope.cancel()
                        return
                    buffer += data
                line, buffer = buffer.split(b"\n", 1)
                cmd = json.loads(line)
                if scope is not None:
                    scope.cancel()  # one session at a time: Ctrl-C the previous one
                    await trio.sleep(0.5)
                if cmd["cmd"] == "quit":
                    nursery.cancel_scope.cancel()
                    return
                scope = trio.CancelScope()

                async def one(scope: trio.CancelScope, task_status=trio.TASK_STATUS_IGNORED) -> None:
                    with scope:
                        await run_tunnel_in_trio(hub_url, credentials, device_id, "echo", task_status=task_status)

                ready = await nursery.start(one, scope)
                # run_tunnel times from just before its POST (the offer is made by then)
                print(json.dumps({"port": ready.port, "posted_at": time.time() - ready.seconds_to_connect,
                                  "connected": ready.seconds_to_connect}), flush=True)

    trio.run(main)


def hub_first_bytes(target_port: int, sessions: int) -> tuple[list[float], list[float], dict]:
    """Hub, agent and CLI as processes: from the session POST to the first echoed byte."""
    from _common import HubProcess, http_json, tunnel_device

    hub = HubProcess.start(name="tunnel-hub", env={"FLEETHUB_TUNNELS": "on"})
    agent = client = None
    try:
        hub.bootstrap()
        dev_id, token, env = tunnel_device(hub, "tunnel-bench")
        with (OUT_DIR / "tunnel-agent.log").open("wb") as err:
            agent = subprocess.Popen([PY, "-m", "hub.cli", "agent", "--hub", hub.base_url, "--data-dir",
                                      str(hub.data_dir / "device"), "--tunnel-target",
                                      f"echo=127.0.0.1:{target_port}"], stdout=err, stderr=err, env=env,
                                     cwd=str(REPO))
        deadline = time.monotonic() + 60
        while True:
            status, body = http_json("GET", f"{hub.base_url}/v1/devices/{dev_id}", headers=hub.headers)
            if status == 200 and body["data"].get("online"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the agent did not come online; see bench/out/tunnel-agent.log")
            time.sleep(0.2)
        client = Proc("hubclient", hub.base_url, dev_id, name="hubclient",
                      env={"BENCH_ORG": hub.org_id, "BENCH_PAT_ID": hub.pat_id, "BENCH_PAT_SECRET": hub.pat_secret})
        connected, echoed = [], []
        for i in range(sessions):
            ready = client.request({"cmd": "open"}, timeout=90)
            echoed.append(first_echo(ready["port"]) - ready["posted_at"])
            connected.append(ready["connected"])
            log(f"through the hub, session {i + 1}: connected {connected[-1] * 1000:.0f} ms after the POST, "
                f"first echo {echoed[-1] * 1000:.0f} ms")
        return connected, echoed, {"grant_seconds": hub.env.get("FLEETHUB_TUNNEL_GRANT_SECONDS", "600 (default)")}
    finally:
        if client is not None:
            client.stop()
        if agent is not None:
            agent.terminate()
            agent.wait(20)
        hub.stop()


class Proc:
    def __init__(self, *args: str, name: str, env: dict[str, str] | None = None) -> None:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = OUT_DIR / f"tunnel-{name}.log"
        env = {**os.environ, "FLEETHUB_ICE_ADDRESSES": "127.0.0.1", "PYTHONUNBUFFERED": "1", **(env or {})}
        with self.log_path.open("wb") as err:
            self.proc = subprocess.Popen([PY, __file__, "--worker", *args], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, cwd=str(REPO), env=env)

    def request(self, cmd: dict | None, timeout: float = 60) -> dict:
        if cmd is not None:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not box or not box[0]:
            raise RuntimeError(f"worker did not answer {cmd}; see {self.log_path}")
        return json.loads(box[0])

    def stop(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(20)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


# ---- measurements ------------------------------------------------------------------------------------

def first_echo(port: int) -> float:
    """Connect, send one byte to the echo, read it back; the wall time (time.time) it came back."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"Ex")
        assert s.recv(1) == b"x"
    return time.time()


def stream(port: int, total: int) -> float:
    payload = os.urandom(CHUNK)
    with socket.create_connection(("127.0.0.1", port)) as s:
        t0 = time.perf_counter()
        s.sendall(b"S")
        sent = 0
        while sent < total:
            s.sendall(payload)
            sent += len(payload)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while len(answer) < 8:
            data = s.recv(8 - len(answer))
            if not data:
                raise RuntimeError("the sink closed without its count")
            answer += data
        elapsed = time.perf_counter() - t0
    if struct.unpack("!Q", answer)[0] != sent:
        raise RuntimeError(f"the sink counted {struct.unpack('!Q', answer)[0]} of {sent} bytes")
    return elapsed


def session(client: Proc, device: Proc) -> tuple[int, float]:
    t0 = time.time()
    offer = client.request({"cmd": "offer"})["offer"]
    answer = device.request({"cmd": "answer", "offer": offer})["answer"]
    port = client.request({"cmd": "connect", "answer": answer})["port"]
    connected = time.time()
    echoed = first_echo(port)
    return port, (connected - t0, echoed - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--mb", type=int, default=64, help="MiB per throughput run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sessions", type=int, default=5, help="sessions for the first-byte figure")
    p.add_argument("--no-hub", action="store_true", help="skip the measurement through a hub")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--quiet-wait", type=float, default=60.0)
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        if args.worker[0] == "target":
            target_worker()
        elif args.worker[0] == "hubclient":
            hub_client_worker(args.worker[1], args.worker[2])
        else:
            peer_worker(args.worker[0], int(args.worker[1]) if len(args.worker) > 1 else 0)
        return 0
    if args.smoke:
        args.mb, args.rounds, args.sessions = 4, 1, 3
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    target = Proc("target", name="target")
    target_port = target.request(None)["port"]
    device = Proc("device", str(target_port), name="device")
    client = Proc("client", name="client")
    # the same peers with aiortc's own SCTP acknowledgements (one SACK per packet), for comparison
    plain_env = {"FLEETHUB_SCTP_SACK_EVERY_PACKET": "1"}
    plain_device = Proc("device", str(target_port), name="device-plain", env=plain_env)
    plain_client = Proc("client", name="client-plain", env=plain_env)
    try:
        firsts = []
        for i in range(args.sessions):
            port, (connected, echoed) = session(client, device)
            firsts.append((connected, echoed))
            log(f"session {i + 1}: connected {connected * 1000:.0f} ms, first echo {echoed * 1000:.0f} ms")
            if i < args.sessions - 1:
                client.request({"cmd": "close"})
                device.request({"cmd": "close"})
        plain_port, _ = session(plain_client, plain_device)
        total = args.mb * 1024 * 1024
        stream(port, 1024 * 1024)  # warm-up: the channel's congestion window opens
        stream(plain_port, 1024 * 1024)
        tunnel, direct, cpu, plain, plain_cpu = [], [], [], [], []

        def through(pair: tuple[Proc, Proc], to: int, rates: list[float], cpus: list[float]) -> None:
            before = sum(cpu_seconds(p.proc.pid) for p in pair)
            rates.append(total / stream(to, total) / 1e6)
            cpus.append((sum(cpu_seconds(p.proc.pid) for p in pair) - before) / args.mb)

        for r in range(args.rounds):
            through((client, device), port, tunnel, cpu)
            through((plain_client, plain_device), plain_port, plain, plain_cpu)
            direct.append(total / stream(target_port, total) / 1e6)
            log(f"round {r + 1}: tunnel {tunnel[-1]:.1f} MB/s ({cpu[-1] * 1000:.1f} ms CPU per MiB in the "
                f"two peers), with a SACK per packet {plain[-1]:.1f} MB/s ({plain_cpu[-1] * 1000:.1f} ms), "
                f"direct {direct[-1]:.1f} MB/s")
        hub_figures = None
        if not args.no_hub:
            hub_figures = hub_first_bytes(target_port, args.sessions)
    finally:
        for proc in (client, device, plain_client, plain_device, target):
            proc.stop()
    cold, warm = firsts[0], firsts[1:] or firsts
    echo_ms = sorted(e * 1000 for _, e in warm)
    conn_ms = sorted(c * 1000 for c, _ in warm)
    rows = [["offer → connected (control channel open, listener up)", f"{median(conn_ms):.0f}",
             f"{conn_ms[0]:.0f}", f"{conn_ms[-1]:.0f}", f"{cold[0] * 1000:.0f}"],
            ["offer → first byte echoed through the tunnel", f"{median(echo_ms):.0f}",
             f"{echo_ms[0]:.0f}", f"{echo_ms[-1]:.0f}", f"{cold[1] * 1000:.0f}"]]
    body = "\n\n".join([
        "## Tunnel data plane (bench/tunnel.py)", f"`{command_line()}`",
        facts_line(facts) + f"; load average at end {loadavg()}",
        "Client peer, device peer, TCP target and load generator in four processes on loopback (ICE on "
        "127.0.0.1 only); offer and answer over the workers' pipes (no hub). "
        f"{args.sessions} sessions for the first-byte figures; {args.mb} MiB per throughput run, "
        f"{args.rounds} round(s) alternating the three paths below, one TCP stream each.",
        "The first session of a process also loads aiortc (the agent imports it at its first tunnel): "
        "it is the cold column; the others are the sessions after it.",
        md_table(["from the offer request to", "median ms", "min ms", "max ms", "cold (first) ms"], rows),
        *([_hub_section(*hub_figures)] if hub_figures else []),
        md_table(["path", "MB/s (median)", "MB/s per round", "CPU ms per MiB, both peers (median)"], [
            ["TCP → tunnel (aiortc data channel) → TCP", f"{median(tunnel):.1f}",
             " / ".join(f"{v:.1f}" for v in tunnel), f"{median(cpu) * 1000:.1f}"],
            ["the same with aiortc's SACK per packet (webrtc/sctp.py off)", f"{median(plain):.1f}",
             " / ".join(f"{v:.1f}" for v in plain), f"{median(plain_cpu) * 1000:.1f}"],
            ["direct loopback TCP", f"{median(direct):.1f}", " / ".join(f"{v:.1f}" for v in direct), ""]]),
        f"- CPU of the client and device peer processes together: {median(cpu) * 1000:.1f} ms per MiB "
        "(median round): unlike MB/s, this hardly depends on how busy the shared machine is.\n"
        f"- tunnel / direct: **{median(tunnel) / median(direct):.3f}**; goal >= 10 MB/s through the tunnel: "
        f"**{'met' if median(tunnel) >= 10 else 'NOT met'}**",
    ])
    print(body)
    if not args.no_write:
        print(f"wrote {write_section('tunnel', body, smoke=args.smoke)}")
    return 0


def _hub_section(connected: list[float], echoed: list[float], _info: dict) -> str:
    cold_c, cold_e = connected[0], echoed[0]
    warm_c = sorted(c * 1000 for c in (connected[1:] or connected))
    warm_e = sorted(e * 1000 for e in (echoed[1:] or echoed))
    return ("Through a hub (`fleethub serve` with its embedded PostgreSQL, `fleethub agent` with an echo "
            "target, and the CLI's code, webrtc.client.run_tunnel, each a process of its own): from the "
            "moment the CLI sends POST /v1/cli/tunnel/session (its offer already made) until the first "
            "byte comes back through the tunnel. The hub signs the grant and relays tunnel.open; the "
            "agent verifies the grant and answers; the CLI connects and listens.\n\n"
            + md_table(["from POST /v1/cli/tunnel/session to", "median ms", "min ms", "max ms", "cold (first) ms"], [
                ["connected (control channel open, listener up)", f"{median(warm_c):.0f}", f"{warm_c[0]:.0f}",
                 f"{warm_c[-1]:.0f}", f"{cold_c * 1000:.0f}"],
                ["first byte echoed through the tunnel", f"{median(warm_e):.0f}", f"{warm_e[0]:.0f}",
                 f"{warm_e[-1]:.0f}", f"{cold_e * 1000:.0f}"]]))


if __name__ == "__main__":
    sys.exit(main())
