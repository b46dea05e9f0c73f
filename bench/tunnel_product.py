"""Tunnels on the product path, as an operator runs them (issue 35 item 1): the aims are judged here.

    python bench/tunnel_product.py [--smoke] [--mb 128] [--rounds 2] [--starts 5] [--keys 200] [--no-write]

Separate processes, nothing in-process: a hub (``fleethub serve``, embedded PostgreSQL), a real
``fleethub agent --ssh --tunnel-target ssh=127.0.0.1:PORT``, a real sshd on a loopback port (its own
host key and authorized key, tests/e2e/sshtools.Sshd), and OpenSSH's ssh and scp with
``ProxyCommand=fleethub tunnel --stdio --device %n --target ssh``. In the same run, beside it:

- direct: the same ssh/scp straight to the sshd (the floor);
- peer bench: bench/tunnel_scp.py's bare peers (client and device peer processes, no hub, no agent,
  no CLI), the bench issue 21 was closed on, with the same file.

Reported:

- scp of ``--mb`` MiB up and down (random bytes, SHA-256 checked) in MB/s, ``--rounds`` rounds
  alternating product path, peer bench and direct;
- ``ssh host true`` from invocation to exit, ``--starts`` times, split into phases with the CLI's
  timing line (FLEETHUB_TUNNEL_TIMING=1, webrtc/marks.py): CLI start (ssh starts the ProxyCommand, the
  interpreter and the imports up to the command), imports (the tunnel's own), offer (aiortc's
  certificate and ICE host candidates), token, session (the hub asks the agent, the agent answers),
  ICE, DTLS, SCTP (the control channel open), ssh (handshake, auth, ``true``, exit); direct ssh beside;
  then ``ssh host true`` again in a connection already open (ControlMaster, as ControlPersist and
  Ansible keep one): no ProxyCommand runs, what a script of many short commands sees after its first;
- keystroke round trips (one byte through ``cat`` on the device, every 20 ms) in one ssh connection,
  idle and while scp copies run back to back, in the same connection (ssh's ControlMaster: one
  tunnel session, one byte stream) or in their own (a tunnel session each, the same agent);
- CPU per MiB in the CLI (its own rusage from the timing line, less an ``ssh true``'s) and in the
  agent (/proc), separately, and in the peer bench's two peers.

The machine is shared: the load average is printed; MB/s and milliseconds are noisy, CPU per MiB less.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (OUT_DIR, HubProcess, Verdicts, command_line, cpu_seconds, facts_line, fleethub_cmd,  # noqa: E402
                     http_json, loadavg, log, machine_facts, md_table, percentile, tunnel_device, write_section)
from tunnel import Proc  # noqa: E402
from tunnel_scp import connect, start_sshd  # noqa: E402

from webrtc.marks import parse as parse_marks  # noqa: E402

MIB = 1 << 20
INTERVAL = 0.02  # seconds between keystrokes
# the CLI's marks in order, each phase ending at its mark (webrtc/marks.py, webrtc/client.py)
PHASES = [("CLI start", "parsed"), ("tunnel imports", "imported"), ("peer set-up (aiortc, aioice)", "lookup"),
          ("offer (cert, ICE gather)", "offer"),
          ("token", "token"), ("session (hub and agent)", "session"), ("ICE", "ice"), ("DTLS", "dtls"),
          ("SCTP (control open)", "sctp")]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(MIB):
            h.update(block)
    return h.hexdigest()


class World:
    """The hub, the sshd and the agent, as processes; ssh and scp through the ProxyCommand."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hub = HubProcess.start(name="tunnel-product-hub", env={"FLEETHUB_TUNNELS": "on"})
        self.agent: subprocess.Popen | None = None
        self.agent_b: subprocess.Popen | None = None
        self.sshd = None
        try:
            self.hub.bootstrap()
            self.device_id, _token, env = tunnel_device(self.hub, "product-dev")
            self.sshd = start_sshd(tmp / "sshd")
            self.agent_log = OUT_DIR / "tunnel-product-agent.log"
            with self.agent_log.open("wb") as err:
                self.agent = subprocess.Popen(
                    [*fleethub_cmd(), "agent", "--hub", self.hub.base_url, "--data-dir", str(tmp / "device"), "--ssh",
                     "--tunnel-target", f"ssh=127.0.0.1:{self.sshd.port}"], stdout=err, stderr=err, env=env,
                    stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while True:
                status, body = http_json("GET", f"{self.hub.base_url}/v1/devices/{self.device_id}",
                                         headers=self.hub.headers)
                if status == 200 and body["data"].get("online"):
                    break
                if time.monotonic() > deadline or self.agent.poll() is not None:
                    raise RuntimeError(f"the agent did not come online; see {self.agent_log}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        self.env = {**os.environ, "FLEETHUB_ICE_ADDRESSES": "127.0.0.1", "FLEETHUB_HUB_URL": self.hub.base_url,
                    "FLEETHUB_PAT_ID": self.hub.pat_id, "FLEETHUB_PAT_SECRET": self.hub.pat_secret,
                    "FLEETHUB_ORG_ID": self.hub.org_id, "FLEETHUB_TUNNEL_TIMING": "1"}

    def second_device(self) -> str:
        """Another device and its agent (ssh to the same sshd): its id, for ``host(True, device=...)``."""
        device_id, _token, env = tunnel_device(self.hub, "product-dev-b")
        log_path = OUT_DIR / "tunnel-product-agent-b.log"
        with log_path.open("wb") as err:
            self.agent_b = subprocess.Popen(
                [*fleethub_cmd(), "agent", "--hub", self.hub.base_url, "--data-dir", str(self.tmp / "device-b"),
                 "--ssh", "--tunnel-target", f"ssh=127.0.0.1:{self.sshd.port}"], stdout=err, stderr=err, env=env,
                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            status, body = http_json("GET", f"{self.hub.base_url}/v1/devices/{device_id}", headers=self.hub.headers)
            if status == 200 and body["data"].get("online"):
                return device_id
            if time.monotonic() > deadline or self.agent_b.poll() is not None:
                raise RuntimeError(f"the second agent did not come online; see {log_path}")
            time.sleep(0.2)

    def options(self, *, tunnel: bool, scp: bool = False) -> list[str]:
        opts = [*self.sshd.ssh_options(), "-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no"]
        if tunnel:
            proxy = " ".join([*fleethub_cmd(), "tunnel", "--stdio", "--device", "%n", "--target", "ssh"])
            return [*opts, "-o", f"ProxyCommand={proxy}"]
        return [*opts, "-P" if scp else "-p", str(self.sshd.port)]

    def host(self, tunnel: bool, device: str | None = None) -> str:
        return f"{self.sshd.user}@{(device or self.device_id) if tunnel else '127.0.0.1'}"

    def ssh_true(self, tunnel: bool) -> tuple[float, dict[str, float] | None, float]:
        """``ssh host true``: (seconds to exit, the CLI's marks relative to the start, its exit after ssh's)."""
        err_path = self.tmp / "ssh-true.err"
        with err_path.open("wb") as err:
            t0 = time.time()
            subprocess.run(["ssh", *self.options(tunnel=tunnel), self.host(tunnel), "true"], stdout=subprocess.DEVNULL,
                           stderr=err, stdin=subprocess.DEVNULL, env=self.env, check=True, timeout=120)
            took = time.time() - t0
        if not tunnel:
            return took, None, 0.0
        marks = wait_marks(err_path)
        return took, {k: v - t0 for k, v in marks.items() if k != "cpu"} | {"cpu": marks["cpu"]}, marks["closed"] - t0 - took

    def scp(self, tunnel: bool, source: str, dest: str, *, extra: list[str] | None = None,
            device: str | None = None, name: str = "scp") -> tuple[float, float]:
        """(seconds, the CLI's CPU seconds or 0 direct)."""
        def at(p: str) -> str:
            return f"{self.host(tunnel, device)}:{p[1:]}" if p.startswith(":") else p

        err_path = self.tmp / f"{name}.err"
        with err_path.open("wb") as err:
            t0 = time.perf_counter()
            subprocess.run(["scp", "-q", *self.options(tunnel=tunnel, scp=True), *(extra or []), at(source), at(dest)],
                           stderr=err, stdin=subprocess.DEVNULL, env=self.env, check=True, timeout=900)
            took = time.perf_counter() - t0
        # in a ControlMaster's connection (``extra``) no CLI of its own runs
        return took, (wait_marks(err_path)["cpu"] if tunnel and not extra else 0.0)

    def stop(self) -> None:
        for agent in (self.agent, self.agent_b):
            if agent is not None and agent.poll() is None:
                agent.terminate()
                try:
                    agent.wait(20)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()
        if self.sshd is not None:
            self.sshd.stop()
        self.hub.stop()


def wait_marks(path: Path, timeout: float = 20.0) -> dict[str, float]:
    """The CLI's timing line, which it prints after ssh has gone (it closes the session first)."""
    deadline = time.monotonic() + timeout
    while True:
        marks = parse_marks(path.read_text(errors="replace"))
        if marks is not None and "closed" in marks:
            return marks
        if time.monotonic() > deadline:
            raise RuntimeError(f"no timing line from the CLI in {path}: {path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


class Master:
    """One ssh connection (ControlMaster) through the tunnel or direct; later ssh/scp ride in it."""

    def __init__(self, world: World, tunnel: bool) -> None:
        self.world, self.tunnel = world, tunnel
        self.path = world.tmp / f"ctl-{'t' if tunnel else 'd'}"
        self.err = (world.tmp / "master.err").open("wb")
        self.proc = subprocess.Popen(["ssh", *world.options(tunnel=tunnel), "-M", "-S", str(self.path), "-N",
                                      world.host(tunnel)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self.err, env=world.env)
        deadline = time.monotonic() + 60
        while not self.path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the ssh master did not start: {(world.tmp / 'master.err').read_text()}")
            time.sleep(0.05)

    def opts(self) -> list[str]:
        return ["-o", f"ControlPath={self.path}", "-o", "ControlMaster=no"]

    def keystrokes(self, count: int) -> list[float]:
        """Round trips of one byte through ``cat`` on the device, ``INTERVAL`` apart, in ms."""
        cat = subprocess.Popen(["ssh", *self.world.options(tunnel=self.tunnel), *self.opts(),
                                self.world.host(self.tunnel), "cat"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.world.env, bufsize=0)
        try:
            cat.stdin.write(b"w")  # the first byte opens the channel's path end to end
            if cat.stdout.read(1) != b"w":
                raise RuntimeError("cat did not echo")
            rtts = []
            for _ in range(count):
                t0 = time.perf_counter()
                cat.stdin.write(b"k")
                if cat.stdout.read(1) != b"k":
                    raise RuntimeError("cat did not echo")
                rtts.append((time.perf_counter() - t0) * 1000)
                time.sleep(INTERVAL)
            return rtts
        finally:
            cat.stdin.close()
            cat.wait(30)

    def stop(self) -> None:
        subprocess.run(["ssh", "-S", str(self.path), "-O", "exit", "x"], capture_output=True, timeout=30)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def under_bulk(master: Master, world: World, source: str, dest: str, keys: int, *, same: bool) -> list[float]:
    """Keystrokes through ``master`` while scp copies run one after another, in the same ssh connection
    (``same``: ssh multiplexes both over one tunnel session) or in their own (a session each)."""
    stop = threading.Event()
    failure: list[BaseException] = []

    def copy() -> None:
        try:
            while not stop.is_set():
                world.scp(master.tunnel, source, dest, extra=master.opts() if same else None)
        except BaseException as exc:  # noqa: BLE001 — reported by the caller
            failure.append(exc)
            stop.set()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    time.sleep(1.0)  # the copy under way (a new session's set-up done)
    try:
        rtts = master.keystrokes(keys)
    finally:
        stop.set()
        thread.join(900)
    if failure:
        raise failure[0]
    return rtts


def several(world: World, src: Path, tmp: Path, mb: int, keys: int) -> dict[str, list[float]]:
    """Item 4: two scp up to the first device and one to a second device at once (a tunnel session
    each), and keystrokes in a third session to the first device meanwhile. MB/s of each copy while all
    three ran is not observable from outside; each copy's own MB/s (size / its time) is, with all three
    started together and of the same size."""
    world.hub.admin("tunnel-entitle", world.hub.org_id, "--max-sessions-per-device", "4")
    other = world.second_device()
    master = Master(world, True)
    results: dict[str, float] = {}
    failure: list[BaseException] = []

    def copy(label: str, device: str | None) -> None:
        try:
            seconds, _ = world.scp(True, str(src), f":{tmp / f'fair-{label}.bin'}", device=device, name=label)
            results[label] = mb * MIB / seconds / 1e6
        except BaseException as exc:  # noqa: BLE001 — reported below
            failure.append(exc)

    try:
        threads = [threading.Thread(target=copy, args=(label, device), daemon=True)
                   for label, device in (("A1", None), ("A2", None), ("B", other))]
        for t in threads:
            t.start()
        time.sleep(1.5)  # the three sessions open and copying
        rtts = []
        while any(t.is_alive() for t in threads) and len(rtts) < 20 * keys:
            rtts += master.keystrokes(20)
        for t in threads:
            t.join(900)
    finally:
        master.stop()
    if failure:
        raise failure[0]
    return {"rates": [results["A1"], results["A2"], results["B"]], "keys": rtts}


def cli_pid(scp: subprocess.Popen, timeout: float = 30.0) -> int:
    """The ``fleethub tunnel --stdio`` process an scp started (its ssh's ProxyCommand)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"tunnel" in cmdline and b"--stdio" in cmdline:
                return int(entry.name)
        time.sleep(0.05)
    raise RuntimeError("no fleethub tunnel --stdio process appeared")


def profile(world: World, src: Path, remote: Path, back: Path) -> int:
    """py-spy on the CLI and the agent during one scp each way; the hottest frames of each."""
    from _common import PySpy

    for way, source, dest in (("up", str(src), f":{remote}"), ("down", f":{remote}", str(back))):
        def at(p: str) -> str:
            return f"{world.host(True)}:{p[1:]}" if p.startswith(":") else p

        scp = subprocess.Popen(["scp", "-q", *world.options(tunnel=True, scp=True), at(source), at(dest)],
                               stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=world.env)
        spies = {"cli": PySpy(cli_pid(scp), OUT_DIR / f"tunnel-product-cli-{way}.txt"),
                 "agent": PySpy(world.agent.pid, OUT_DIR / f"tunnel-product-agent-{way}.txt")}
        scp.wait(900)
        for name, spy in spies.items():
            spy.stop()
            summary = spy.summary(25)
            print(f"== {name}, scp {way}: {summary.get('samples')}")
            for kind in ("self", "inclusive"):
                print(f"-- {kind}")
                for frame, share in summary[kind]:
                    print(f"{share:5.1f}%  {frame}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--mb", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--starts", type=int, default=5)
    p.add_argument("--keys", type=int, default=200)
    p.add_argument("--no-peer-bench", action="store_true")
    p.add_argument("--also-cap", type=int, default=None, metavar="BPS",
                   help="each round also copies through the product path with the organisation's bandwidth_bps "
                        "set to BPS (fleethub admin tunnel-entitle --bandwidth-bps), e.g. 12500000, the former "
                        "default; back to the deployment default after")
    p.add_argument("--profile", action="store_true",
                   help="only py-spy the CLI and the agent during one scp each way (bench/out/tunnel-product-*.txt)")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--quiet-wait", type=float, default=60.0)
    args = p.parse_args()
    if args.smoke:  # CI: well inside run_all.py's 90 s, the peer bench and direct keystrokes left out
        args.mb, args.rounds, args.starts, args.keys, args.no_peer_bench = 4, 1, 1, 20, True
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    load_start = loadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-tunnel-product-"))
    src, remote, back = tmp / "src.bin", tmp / "remote.bin", tmp / "back.bin"
    with src.open("wb") as f:
        for _ in range(args.mb):
            f.write(os.urandom(MIB))
    want = sha256(src)
    fig: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        fig.setdefault(key, []).append(value)

    world = World(tmp)
    peers: tuple[Proc, Proc] | None = None
    try:
        if args.profile:
            return profile(world, src, remote, back)
        # -- ssh host true: the first answer --------------------------------------------------------
        world.ssh_true(True)  # warm the disk cache and the agent's first aiortc import
        phases: list[dict[str, float]] = []
        setup_cpu: list[float] = []
        for i in range(args.starts):
            took, marks, after = world.ssh_true(True)
            add("true tunnel", took)
            add("true direct", world.ssh_true(False)[0])
            add("cli after ssh", after)
            phases.append(marks | {"exit": took})
            setup_cpu.append(marks["cpu"])
            log(f"ssh true {i + 1}: tunnel {took * 1000:.0f} ms, direct {fig['true direct'][-1] * 1000:.0f} ms; "
                + ", ".join(f"{k} {v * 1000:.0f}" for k, v in marks.items() if k != "cpu"))

        # -- ssh host true riding an open connection (ControlMaster/ControlPersist: what Ansible does) --
        for tunnel in (True, False):
            master = Master(world, tunnel)
            try:
                for _ in range(args.starts):
                    t0 = time.time()
                    subprocess.run(["ssh", *world.options(tunnel=tunnel), *master.opts(), world.host(tunnel), "true"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                   env=world.env, check=True, timeout=120)
                    add(f"true reused {'tunnel' if tunnel else 'direct'}", time.time() - t0)
            finally:
                master.stop()
        log(f"ssh true in an open connection: tunnel {median(fig['true reused tunnel']) * 1000:.0f} ms, "
            f"direct {median(fig['true reused direct']) * 1000:.0f} ms (medians)")

        # -- scp each way, alternating product, peer bench and direct -------------------------------
        if not args.no_peer_bench:
            device = Proc("device", str(world.sshd.port), name="product-peer-device")
            client = Proc("client", name="product-peer-client")
            peers = (client, device)
            peer_port = connect(client, device)
        for r in range(args.rounds):
            for way, source, dest in (("up", str(src), f":{remote}"), ("down", f":{remote}", str(back))):
                copy = remote if way == "up" else back
                agent_cpu = cpu_seconds(world.agent.pid)
                seconds, cli_cpu = world.scp(True, source, dest)
                add(f"agent cpu {way}", (cpu_seconds(world.agent.pid) - agent_cpu) / args.mb * 1000)
                add(f"cli cpu {way}", (cli_cpu - median(setup_cpu)) / args.mb * 1000)
                add(f"tunnel {way}", args.mb * MIB / seconds / 1e6)
                if sha256(copy) != want:
                    raise RuntimeError(f"scp {way} through the product path: the copy's SHA-256 differs")
                back.unlink(missing_ok=True)
                if args.also_cap:
                    world.hub.admin("tunnel-entitle", world.hub.org_id, "--bandwidth-bps", str(args.also_cap))
                    try:
                        seconds, _ = world.scp(True, source, dest)
                    finally:
                        world.hub.admin("tunnel-entitle", world.hub.org_id, "--default", "bandwidth_bps")
                    add(f"capped {way}", args.mb * MIB / seconds / 1e6)
                    if sha256(copy) != want:
                        raise RuntimeError(f"scp {way} through the capped product path: the copy's SHA-256 differs")
                    back.unlink(missing_ok=True)
                if peers is not None:
                    before = {q: cpu_seconds(q.proc.pid) for q in peers}
                    sshd = world.sshd
                    t0 = time.perf_counter()
                    at = (lambda q: f"{sshd.user}@127.0.0.1{q}" if q.startswith(":") else q)
                    subprocess.run(["scp", "-q", *sshd.ssh_options(), "-o", "UserKnownHostsFile=/dev/null",
                                    "-o", "StrictHostKeyChecking=no", "-P", str(peer_port), at(source), at(dest)],
                                   check=True, timeout=900, stdin=subprocess.DEVNULL)
                    add(f"peer {way}", args.mb * MIB / (time.perf_counter() - t0) / 1e6)
                    add(f"peer client cpu {way}", (cpu_seconds(peers[0].proc.pid) - before[peers[0]]) / args.mb * 1000)
                    add(f"peer device cpu {way}", (cpu_seconds(peers[1].proc.pid) - before[peers[1]]) / args.mb * 1000)
                    if sha256(copy) != want:
                        raise RuntimeError(f"scp {way} through the peer bench: the copy's SHA-256 differs")
                    back.unlink(missing_ok=True)
                seconds, _ = world.scp(False, source, dest)
                add(f"direct {way}", args.mb * MIB / seconds / 1e6)
                if sha256(copy) != want:
                    raise RuntimeError(f"direct scp {way}: the copy's SHA-256 differs")
                back.unlink(missing_ok=True)
            log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in fig.items()
                                              if k.split()[0] in ("tunnel", "capped", "peer", "direct", "agent", "cli")))
        if peers is not None:
            for q in peers:
                q.stop()
            peers = None

        # -- several sessions at once (item 4) -------------------------------------------------------
        fair = several(world, src, tmp, args.mb, args.keys)
        fig["fair rates"], fig["fair keys"] = fair["rates"], fair["keys"]
        log("several sessions: " + ", ".join(f"{r:.1f}" for r in fair["rates"])
            + f" MB/s; keystrokes p95 {percentile(sorted(fair['keys']), 95):.1f} ms ({len(fair['keys'])})")

        # -- keystrokes in one ssh connection, idle and under an scp in the same connection ---------
        for tunnel in (True,) if args.smoke else (True, False):
            name = "tunnel" if tunnel else "direct"
            master = Master(world, tunnel)
            try:
                fig[f"keys idle {name}"] = master.keystrokes(args.keys)
                for way, source, dest in (("down", f":{remote}", str(back)), ("up", str(src), f":{remote}")):
                    for same in (False,) if args.smoke else (True, False):
                        fig[f"keys {way}{'' if same else '-own'} {name}"] = under_bulk(
                            master, world, source, dest, args.keys, same=same)
                        back.unlink(missing_ok=True)
            finally:
                master.stop()
            log(f"keystrokes {name}: " + ", ".join(
                f"{k.split()[1]} p95 {percentile(sorted(fig[k]), 95):.1f} ms ({len(fig[k])})"
                for k in fig if k.startswith("keys ") and k.endswith(name)))
    finally:
        if peers is not None:
            for q in peers:
                q.stop()
        world.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def m(key: str) -> float:
        return median(fig[key]) if fig.get(key) else float("nan")

    def p95(key: str) -> float:
        return percentile(sorted(fig[key]), 95) if fig.get(key) else float("nan")

    scp_rows = []
    for way in ("up", "down"):
        scp_rows.append([f"scp {args.mb} MiB {way}", f"{m(f'tunnel {way}'):.1f}",
                         " / ".join(f"{v:.1f}" for v in fig[f"tunnel {way}"]),
                         f"{m(f'capped {way}'):.1f}" if f"capped {way}" in fig else "—",
                         f"{m(f'peer {way}'):.1f}" if f"peer {way}" in fig else "—", f"{m(f'direct {way}'):.1f}",
                         f"{m(f'cli cpu {way}'):.0f}", f"{m(f'agent cpu {way}'):.0f}",
                         f"{m(f'peer client cpu {way}'):.0f} / {m(f'peer device cpu {way}'):.0f}"
                         if f"peer {way}" in fig else "—"])
    phase_rows = []
    previous = "start"
    for label, key in PHASES:
        cut = [ph[key] - (ph[previous] if previous != "start" else 0.0) for ph in phases if key in ph]
        phase_rows.append([label, f"{median(cut) * 1000:.0f}" if cut else "—"])
        previous = key
    ssh_cut = [ph["exit"] - ph["ready"] for ph in phases if "ready" in ph]
    phase_rows.append(["ssh (handshake, auth, `true`, exit)", f"{median(ssh_cut) * 1000:.0f}"])
    phase_rows.append(["**total, invocation to exit**", f"**{m('true tunnel') * 1000:.0f}**"])
    phase_rows.append(["direct ssh to the same sshd (the floor)", f"{m('true direct') * 1000:.0f}"])
    phase_rows.append(["(the CLI's exit after ssh's: closing the session; nobody waits for it)",
                       f"{m('cli after ssh') * 1000:.0f}"])
    phase_rows.append(["`ssh host true` in a connection already open (ControlMaster/ControlPersist): tunnel; direct",
                       f"{m('true reused tunnel') * 1000:.0f}; {m('true reused direct') * 1000:.0f}"])
    key_rows = [[what, *(f"{p95(f'keys {k} {n}'):.1f} ({m(f'keys {k} {n}'):.1f}; {len(fig.get(f'keys {k} {n}', []))})"
                         for n in ("tunnel", "direct"))]
                for what, k in (("idle", "idle"), ("under scp down in the same ssh connection", "down"),
                                ("under scp up in the same ssh connection", "up"),
                                ("under scp down in another ssh connection (its own session)", "down-own"),
                                ("under scp up in another ssh connection (its own session)", "up-own"))]
    body = "\n\n".join([
        "## Tunnels on the product path (bench/tunnel_product.py)", f"`{command_line()}`",
        facts_line(facts) + f"; load average at start {load_start}, at end {loadavg()}",
        "Separate processes as an operator runs them: `fleethub serve` (embedded PostgreSQL), `fleethub agent "
        "--ssh --tunnel-target ssh=127.0.0.1:PORT`, a real sshd, ssh/scp with `ProxyCommand=fleethub tunnel "
        "--stdio --device %n --target ssh`; beside it in the same run, direct ssh/scp to the sshd and the peer "
        "bench (bench/tunnel_scp.py's bare peers, no hub, agent or CLI). ICE on 127.0.0.1. "
        f"scp: {args.mb} MiB of random bytes, SHA-256 checked, {args.rounds} round(s) alternating.",
        md_table(["copy", "product path MB/s (median)", "per round",
                  f"product path, bandwidth_bps {args.also_cap or '—'} MB/s", "peer bench MB/s", "direct MB/s",
                  "CLI CPU ms/MiB", "agent CPU ms/MiB", "peer bench client / device CPU ms/MiB"], scp_rows),
        "The product path runs with the organisation's default entitlement (hub/tunnels/limits.py: "
        "bandwidth_bps, each direction, per session); the capped column sets it with `fleethub admin "
        "tunnel-entitle ORG --bandwidth-bps N` for that copy. CLI CPU per MiB is the ProxyCommand's own CPU "
        "over the copy less an `ssh true`'s (its start-up).",
        f"`ssh host true`, median of {args.starts} (after one warm-up), phases from the CLI's timing line "
        "(FLEETHUB_TUNNEL_TIMING=1):",
        md_table(["phase", "ms (median)"], phase_rows),
        f"Keystrokes: one byte through `cat` on the device every {INTERVAL * 1000:.0f} ms, in one ssh connection "
        "(ControlMaster), while scp copies of the file run back to back, either in the same ssh connection (ssh "
        "multiplexes both channels over one byte stream: one tunnel session) or each in its own ssh connection "
        "(its own tunnel session, the same device and agent):",
        md_table(["keystroke round trip", "product path p95 ms (median; n)", "direct p95 ms (median; n)"], key_rows),
    ])
    rates = fig["fair rates"]
    jain = sum(rates) ** 2 / (len(rates) * sum(r * r for r in rates))
    body += "\n\n" + "\n\n".join([
        f"Several sessions at once: two scp of {args.mb} MiB up to one device and one to a second device (a "
        "second agent), started together, each its own ssh and tunnel session (the organisation's "
        "max_sessions_per_device set to 4: the default, 2, refuses a third session to one device with 429 "
        "device_busy); meanwhile keystrokes in a third session to the first device.",
        md_table(["copy", "MB/s"], [["device A, first", f"{rates[0]:.1f}"], ["device A, second", f"{rates[1]:.1f}"],
                                    ["device B", f"{rates[2]:.1f}"],
                                    ["Jain's fairness index (1 = equal shares)", f"{jain:.2f}"],
                                    ["keystroke p95 ms in a third session to A (median; n)",
                                     f"{p95('fair keys'):.1f} ({m('fair keys'):.1f}; {len(fig['fair keys'])})"]]),
    ])
    verdicts = Verdicts("tunnel_product", smoke=args.smoke)
    for way in ("up", "down"):
        verdicts.at_least(f"scp {way} through the product path (median)", round(m(f"tunnel {way}"), 1), 25, " MB/s")
    verdicts.at_most("ssh host true through the ProxyCommand (median)", round(m("true tunnel"), 2), 1.0, " s")
    verdicts.at_most("keystroke p95 in a third session while three scp run (two sessions to its device)",
                     round(p95("fair keys"), 1), 20, " ms")
    verdicts.at_least("fair share of three scp sessions (Jain's index)", round(jain, 2), 0.9)
    for way in ("down", "up"):
        verdicts.at_most(f"keystroke p95 under scp {way} in another session, product path",
                         round(p95(f"keys {way}-own tunnel"), 1), 20, " ms")
    if "peer device cpu up" in fig:
        for way in ("up", "down"):
            verdicts.at_most(f"agent CPU per MiB {way} (target: the peer bench's device peer)",
                             round(m(f"agent cpu {way}")), round(m(f"peer device cpu {way}")), " ms")
    body += "\n\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write:
        print(f"wrote {write_section('tunnel_product', body, smoke=args.smoke)}")
    return verdicts.exit_code()


if __name__ == "__main__":
    sys.exit(main())
