"""Keystrokes under bulk: round trips of one byte through one forwarded connection while another
connection of the same tunnel session carries a bulk copy (issue 21 item 3).

    python bench/tunnel_interactive.py [--smoke] [--keys 300] [--no-write]

The processes of bench/tunnel.py (client peer, device peer, TCP target, and this process as the load
generator) on loopback. One session; through it:

- idle: ``--keys`` one-byte round trips to the echo target, one every 20 ms, nothing else running;
- upload: the same while a second connection streams to the sink (an scp to the device: the bulk
  shares the keystroke's direction, client → device);
- download: the same while a second connection reads from the target's source (an scp from the
  device: the bulk shares the echo's direction, device → client).

Each bulk run also reports its MB/s while the keystrokes run, beside a bulk stream alone, so a
latency win paid for with throughput shows. A full run repeats everything with webrtc/sctp.py's
channel turns and delay-based window switched off (bounded buffering alone). The machine is shared:
figures are noisy.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (Verdicts, command_line, facts_line, loadavg, log, machine_facts, md_table, percentile,  # noqa: E402
                     write_section)
from tunnel import CHUNK, Proc, session, stream  # noqa: E402

INTERVAL = 0.02  # seconds between keystrokes (a fast typist)


def keystrokes(port: int, count: int) -> list[float]:
    """``count`` round trips of one byte to the echo, ``INTERVAL`` apart; each in ms."""
    rtts = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"E")
        for _ in range(count):
            t0 = time.perf_counter()
            s.sendall(b"k")
            answer = s.recv(1)
            if answer != b"k":
                raise RuntimeError(f"the echo answered {answer!r}")
            rtts.append((time.perf_counter() - t0) * 1000)
            time.sleep(INTERVAL)
    return rtts


class Bulk(threading.Thread):
    """Upload to the sink or download from the source until ``stop``; ``rate`` is MB/s meanwhile."""

    def __init__(self, port: int, direction: str) -> None:
        super().__init__(daemon=True)
        self.port, self.direction = port, direction
        self.stop = threading.Event()
        self.started = threading.Event()
        self.moved = 0
        self.seconds = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port)) as s:
                payload = bytes(CHUNK)
                if self.direction == "upload":
                    s.sendall(b"S")
                else:
                    s.sendall(b"G" + struct.pack("!Q", 1 << 40))  # more than any run moves
                t0 = time.perf_counter()
                while not self.stop.is_set():
                    if self.direction == "upload":
                        s.sendall(payload)
                        self.moved += len(payload)
                    else:
                        data = s.recv(1 << 20)
                        if not data:
                            raise RuntimeError("the source closed early")
                        self.moved += len(data)
                    if self.moved >= 4 * CHUNK:
                        self.started.set()
                self.seconds = time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001 — reported by the main thread
            self.error = exc
            self.started.set()


def under(port: int, direction: str | None, keys: int) -> tuple[list[float], float | None]:
    if direction is None:
        return sorted(keystrokes(port, keys)), None
    bulk = Bulk(port, direction)
    bulk.start()
    if not bulk.started.wait(30):
        raise RuntimeError(f"the {direction} did not start")
    time.sleep(0.5)  # let the congestion window open
    try:
        rtts = keystrokes(port, keys)
    finally:
        bulk.stop.set()
        bulk.join(30)
    if bulk.error is not None:
        raise RuntimeError(f"the {direction} failed: {bulk.error!r}")
    return sorted(rtts), bulk.moved / bulk.seconds / 1e6


# webrtc/sctp.py's switches: the second variant keeps only the bounded buffering of webrtc/forward.py
VARIANTS = [("as shipped", {}),
            ("bounded buffering only (FIFO queue, loss-based window)",
             {"FLEETHUB_SCTP_FIFO": "1", "FLEETHUB_SCTP_LOSS_BASED_ONLY": "1"})]


def measure(variant: str, env: dict[str, str], target_port: int, args: argparse.Namespace,
            rows: list[list[str]]) -> float:
    device = Proc("device", str(target_port), name="device", env=env)
    client = Proc("client", name="client", env=env)
    try:
        port, _ = session(client, device)
        stream(port, 1024 * 1024)  # warm-up
        alone = args.mb * 1024 * 1024 / stream(port, args.mb * 1024 * 1024) / 1e6
        log(f"{variant}: bulk upload alone: {alone:.1f} MB/s")
        for label, direction in (("idle", None), ("under an upload (client → device)", "upload"),
                                 ("under a download (device → client)", "download")):
            rtts, rate = under(port, direction, args.keys)
            row = [variant, label, f"{percentile(rtts, 50):.1f}", f"{percentile(rtts, 75):.1f}",
                   f"{percentile(rtts, 95):.1f}", f"{rtts[-1]:.1f}", f"{rate:.1f}" if rate else ""]
            rows.append(row)
            log(f"{variant}, {label}: p50 {row[2]} ms, p75 {row[3]} ms, p95 {row[4]} ms, max {row[5]} ms"
                + (f", bulk {rate:.1f} MB/s" if rate else ""))
        return alone
    finally:
        for proc in (client, device):
            proc.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--keys", type=int, default=300, help="keystrokes per run")
    p.add_argument("--mb", type=int, default=64, help="MiB of the bulk stream alone")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--quiet-wait", type=float, default=60.0)
    args = p.parse_args()
    if args.smoke:
        args.keys, args.mb = 20, 4
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    target = Proc("target", name="target")
    target_port = target.request(None)["port"]
    rows, alone = [], {}
    try:
        for variant, env in VARIANTS[:1 if args.smoke else None]:
            alone[variant] = measure(variant, env, target_port, args, rows)
    finally:
        target.stop()
    body = "\n\n".join([
        "## Keystrokes under bulk through one tunnel session (bench/tunnel_interactive.py)", f"`{command_line()}`",
        facts_line(facts) + f"; load average at end {loadavg()}",
        "Client peer, device peer, TCP target and load generator in four processes on loopback. One "
        f"session; {args.keys} one-byte round trips to an echo, one every {INTERVAL * 1000:.0f} ms, through one "
        "connection, while another connection of the same session streams to a sink (upload) or from a "
        "source (download). The machine is shared with other engineers' work: figures are noisy.",
        md_table(["peers", "keystroke round trip", "p50 ms", "p75 ms", "p95 ms", "max ms", "bulk MB/s meanwhile"],
                 rows),
        "- bulk upload alone through the same session, before the keystrokes: "
        + ", ".join(f"{v}: {a:.1f} MB/s" for v, a in alone.items()) + f" ({args.mb} MiB)",
    ])
    verdicts = Verdicts("tunnel_interactive", smoke=args.smoke)
    for r in rows:
        if r[0] == VARIANTS[0][0] and r[1] != "idle":
            verdicts.at_most(f"keystroke round trip p95 {r[1]}", float(r[4]), 20, " ms")
    body += "\n\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write:
        print(f"wrote {write_section('tunnel_interactive', body, smoke=args.smoke)}")
    return verdicts.exit_code()


if __name__ == "__main__":
    sys.exit(main())
