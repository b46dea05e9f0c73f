"""scp through the tunnel's data plane beside direct scp, in one run (issue 21 item 2).

    python bench/tunnel_scp.py [--smoke] [--mb 100] [--rounds 2] [--no-write]

A real sshd (Debian's OpenSSH, started as tests/e2e/sshtools.Sshd starts it: its own host key,
one authorized key, 127.0.0.1 only), the device peer (webrtc/peer.py as the agent runs it, each
channel connected to the sshd) and the client peer (as ``fleethub tunnel`` runs it, listening on
127.0.0.1) in processes of their own (bench/tunnel.py's workers), on loopback. Each round copies
``--mb`` MiB up (scp to the device) and back (scp from it) through the tunnel, and the same straight
to the sshd; the files' SHA-256 must match. Reported: MB/s each way and the CPU each peer spent per
MiB (the peers' processes, from /proc). The hub is not in the data path, so it is not started.
The machine is shared with other engineers' work: MB/s figures are noisy, CPU per MiB much less so.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (Verdicts, command_line, cpu_seconds, facts_line, loadavg, log, machine_facts, md_table,  # noqa: E402
                     write_section)
from tunnel import Proc  # noqa: E402


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def start_sshd(root: Path):
    from tests.e2e.sshtools import Sshd  # the tests' sshd: keys and config in ``root``

    sshd = Sshd(root)
    deadline = time.monotonic() + 10
    while "Server listening" not in sshd.log_path.read_text(errors="replace"):
        if sshd.popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not start: {sshd.log_path.read_text(errors='replace')}")
        time.sleep(0.05)
    return sshd


def connect(client: Proc, device: Proc) -> int:
    """One session (offer and answer over the workers' pipes); the client's listening port."""
    offer = client.request({"cmd": "offer"})["offer"]
    answer = device.request({"cmd": "answer", "offer": offer})["answer"]
    return client.request({"cmd": "connect", "answer": answer})["port"]


def scp(sshd, port: int, source: str, dest: str) -> float:
    def at(p: str) -> str:
        return f"{sshd.user}@127.0.0.1{p}" if p.startswith(":") else p

    t0 = time.perf_counter()
    subprocess.run(["scp", "-q", *sshd.ssh_options(), "-o", "UserKnownHostsFile=/dev/null",
                    "-o", "StrictHostKeyChecking=no", "-P", str(port), at(source), at(dest)],
                   check=True, timeout=900, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--mb", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--quiet-wait", type=float, default=60.0)
    args = p.parse_args()
    if args.smoke:
        args.mb, args.rounds = 4, 1
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    tmp = Path(tempfile.mkdtemp(prefix="bench-scp-"))
    sshd = start_sshd(tmp / "sshd")
    device = Proc("device", str(sshd.port), name="scp-device")
    client = Proc("client", name="scp-client")
    src, remote, back = tmp / "src.bin", tmp / "remote.bin", tmp / "back.bin"
    with src.open("wb") as f:
        for _ in range(args.mb):
            f.write(os.urandom(1 << 20))
    want = sha256(src)
    mib = args.mb
    figures: dict[str, list[float]] = {k: [] for k in (
        "tunnel up", "tunnel down", "direct up", "direct down", "client up", "device up", "client down", "device down")}
    try:
        port = connect(client, device)
        for r in range(args.rounds):
            for way, source, dest in (("up", str(src), f":{remote}"), ("down", f":{remote}", str(back))):
                before = {p: cpu_seconds(p.proc.pid) for p in (client, device)}
                seconds = scp(sshd, port, source, dest)
                figures[f"client {way}"].append((cpu_seconds(client.proc.pid) - before[client]) / mib * 1000)
                figures[f"device {way}"].append((cpu_seconds(device.proc.pid) - before[device]) / mib * 1000)
                figures[f"tunnel {way}"].append(mib * 1024 * 1024 / seconds / 1e6)
                copy = remote if way == "up" else back
                if sha256(copy) != want:
                    raise RuntimeError(f"scp {way} through the tunnel: the copy's SHA-256 differs")
                back.unlink(missing_ok=True)
                seconds = scp(sshd, sshd.port, source, dest)
                figures[f"direct {way}"].append(mib * 1024 * 1024 / seconds / 1e6)
                if sha256(copy) != want:
                    raise RuntimeError(f"direct scp {way}: the copy's SHA-256 differs")
                back.unlink(missing_ok=True)
            log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in figures.items()))
    finally:
        for proc in (client, device):
            proc.stop()
        sshd.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # the copies and sshd's keys

    def m(key: str) -> float:
        return median(figures[key])

    rows = [[f"scp {way} ({'to' if way == 'up' else 'from'} the device)", f"{m(f'tunnel {way}'):.1f}",
             " / ".join(f"{v:.1f}" for v in figures[f"tunnel {way}"]), f"{m(f'direct {way}'):.1f}",
             f"{m(f'client {way}'):.0f}", f"{m(f'device {way}'):.0f}"] for way in ("up", "down")]
    body = "\n\n".join([
        "## scp through the tunnel beside direct scp (bench/tunnel_scp.py)", f"`{command_line()}`",
        facts_line(facts) + f"; load average at end {loadavg()}",
        f"OpenSSH's scp of {args.mb} MiB (random bytes, SHA-256 checked) to and from a real sshd, through the "
        "client peer and the device peer (each a process, loopback, no hub in the data path) and straight "
        f"to the sshd, alternating, {args.rounds} round(s). The machine is shared with other engineers' "
        "work: MB/s figures are noisy; CPU per MiB much less so.",
        md_table(["copy", "tunnel MB/s (median)", "tunnel MB/s per round", "direct MB/s (median)",
                  "client peer CPU ms per MiB", "device peer CPU ms per MiB"], rows),
    ])
    verdicts = Verdicts("tunnel_scp", smoke=args.smoke)
    for way in ("up", "down"):
        verdicts.at_least(f"scp {way} through the tunnel (median)", round(m(f"tunnel {way}"), 1), 15, " MB/s")
    body += "\n\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write:
        print(f"wrote {write_section('tunnel_scp', body, smoke=args.smoke)}")
    return verdicts.exit_code()


if __name__ == "__main__":
    sys.exit(main())
