"""What every benchmark shares: starting a hub in its own process, admin bootstrap, devices in SQL,
/metrics and /proc readings, machine facts, and rewriting one section of bench/RESULTS.md.

Nothing here is imported by the hub; the benchmarks only drive it from outside, as an operator would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import os
import platform
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# Started as a background job of a non-interactive shell, a process inherits SIGINT ignored, and so would
# every child: then Ctrl-C does nothing and HubProcess.stop()'s SIGINT cannot stop the hub (nor the hub its
# PostgreSQL). Taking SIGINT back here gives this process and its children (SIG_DFL after exec) the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "RESULTS.md"
OUT_DIR = BENCH_DIR / "out"  # gitignored: logs, smoke-size results
PY = sys.executable


# -- small utilities --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fleethub_cmd() -> list[str]:
    """The installed ``fleethub`` console script next to this interpreter (its pid is Python's)."""
    script = Path(PY).parent / "fleethub"
    return [str(script)] if script.exists() else [PY, "-m", "hub.cli"]


def http_get(url: str, timeout: float = 5.0, headers: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_json(method: str, url: str, body: dict | None = None, headers: dict | None = None,
              timeout: float = 30.0) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    h = {"Content-Type": "application/json", **(headers or {})} if data else dict(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw.decode(errors="replace")}


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, what: str = "server") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before answering {url}")
        try:
            if http_get(url, timeout=1.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer {url} within {timeout}s")


# -- /proc ------------------------------------------------------------------------------------------
def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and its direct children: a PostgreSQL postmaster and its backends."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(entry) == root or int(stat.rsplit(")", 1)[1].split()[1]) == root:
                total += cpu_seconds(int(entry))
        except (OSError, ValueError, IndexError):
            continue  # a backend that ended meanwhile
    return total


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _cpu_times() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def machine_busy(seconds: float = 1.0) -> float:
    """Percent of all cores busy over ``seconds`` (anything running: other sessions' work too)."""
    b0, t0 = _cpu_times()
    time.sleep(seconds)
    b1, t1 = _cpu_times()
    return 100.0 * (b1 - b0) / max(1, t1 - t0)


def wait_quiet(max_wait: float, threshold: float = 25.0) -> float:
    """Wait (at most ``max_wait`` s) until the machine is under ``threshold`` % busy for 3 s in a row;
    returns the last reading, which the results record: this machine may be shared."""
    deadline = time.monotonic() + max_wait
    quiet = 0
    busy = machine_busy()
    while time.monotonic() < deadline:
        busy = machine_busy()
        quiet = quiet + 1 if busy < threshold else 0
        if quiet >= 3:
            break
    return busy


# -- machine facts and RESULTS.md -------------------------------------------------------------------
def python_speed(rounds: int = 3) -> float:
    """CPU milliseconds of a fixed piece of Python work shaped like a tunnel's per-packet work (a
    1,400-byte buffer made and sliced, a dict written and read), the best of ``rounds``.

    The shared host these benches run on has changed speed by about two times between a morning and
    an evening, with no load, steal time or clock change visible inside the machine (tunnel peers:
    56 against 104-151 ms of CPU per MiB). This figure, taken at each run's start, says which kind of
    machine a run's MB/s and milliseconds came from: compare it between runs. A loop of additions on
    local variables does not show it (it ran faster while the tunnel ran slower, 2026-11-29); this
    mix moved with the tunnel's CPU per MiB."""
    best = float("inf")
    for _ in range(rounds):
        t0, kept, table = time.process_time(), [], {}
        for i in range(100_000):
            kept.append(bytes(1400)[:700])
            if len(kept) > 1000:
                kept.clear()
            table[i * 7919 % 100_003] = i
            table.get(i)
        best = min(best, time.process_time() - t0)
    return best * 1000


def machine_facts(quiet_wait: float = 0.0) -> dict[str, str]:
    """Machine facts for the results; with ``quiet_wait`` > 0 first waits (bounded) for a quiet machine."""
    busy = wait_quiet(quiet_wait) if quiet_wait > 0 else machine_busy()
    info: dict[str, str] = {}  # the first CPU's lines of /proc/cpuinfo
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    # a VM's model name may say only "AMD EPYC": the clock it reports (the host's) and the cache size are
    # what tell one host class from another between runs
    parts = [info.get("model name", "cpu ?")] if info else []
    if "cpu MHz" in info:
        parts.append(f"{info['cpu MHz'].split('.')[0]} MHz")
    if "cache size" in info:
        parts.append(f"{info['cache size']} cache")
    cpu = ", ".join(parts)
    try:
        mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kib = 0
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "date": subprocess.run(["date", "-u", "+%Y-%m-%d %H:%M:%S UTC"], capture_output=True,
                               text=True).stdout.strip(),
        "nproc": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(),
        "cpu": cpu,
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "python": platform.python_version(),
        "kernel": platform.release(),
        "nofile": f"{soft}/{hard}",
        "loadavg_at_start": loadavg(),
        "busy_at_start": f"{busy:.0f}%",
        "python_speed": f"{python_speed():.0f} ms",
    }


def facts_line(facts: dict[str, str]) -> str:
    return (f"{facts['date']} · nproc {facts['nproc']} ({facts['cpu'] or 'cpu ?'}) · {facts['memory']} · "
            f"Python {facts['python']} · Linux {facts['kernel']} · ulimit -n {facts['nofile']} · "
            f"load average at start {facts['loadavg_at_start']}, CPU busy just before start "
            f"{facts['busy_at_start']} (the machine may be shared), a fixed piece of Python work "
            f"{facts.get('python_speed', '?')} of CPU (compare between runs: the host's speed varies)")


def command_line() -> str:
    rel = Path(sys.argv[0]).resolve()
    try:
        rel = rel.relative_to(REPO)
    except ValueError:
        pass
    return "python " + " ".join(shlex.quote(a) for a in [str(rel), *sys.argv[1:]])


def write_section(name: str, body: str, *, smoke: bool) -> Path:
    """Replace ``<!-- bench:name -->`` … ``<!-- /bench:name -->`` in RESULTS.md (smoke runs write
    bench/out/RESULTS.smoke.md instead, so CI never overwrites the measured figures)."""
    path = OUT_DIR / "RESULTS.smoke.md" if smoke else RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n\nWritten by the scripts in bench/; see bench/README.md.\n"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    return path


def md_table(header: list[str], rows: list[list[object]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


# -- aims and verdicts -------------------------------------------------------------------------------
VERDICTS_DIR = OUT_DIR / "verdicts"  # one JSON per script and run kind; run_all.py gathers them


@dataclass
class Aim:
    """One aim of a benchmark and what the run measured: ``met`` is None when nothing was measured
    (the run ended first), which counts as missed."""

    what: str
    op: str  # "<=" or ">="
    target: float
    measured: float | None
    unit: str = ""

    @property
    def met(self) -> bool:
        if self.measured is None:
            return False
        return self.measured <= self.target if self.op == "<=" else self.measured >= self.target

    def row(self) -> list[str]:
        sign = {"<=": "≤", ">=": "≥"}[self.op]
        got = "—" if self.measured is None else f"{self.measured:g}{self.unit}"
        return [self.what, f"{sign} {self.target:g}{self.unit}", got, "met" if self.met else "**missed**"]


class Verdicts:
    """The aims of one benchmark run. A full run exits non-zero when one is missed (so a regression
    fails the run); a smoke run (CI, tiny sizes, where the aims cannot mean anything) only reports them
    and fails only when the run itself is broken (errors, a crash)."""

    def __init__(self, script: str, *, smoke: bool) -> None:
        self.script, self.smoke = script, smoke
        self.aims: list[Aim] = []

    def at_most(self, what: str, measured: float | None, target: float, unit: str = "") -> Aim:
        self.aims.append(Aim(what, "<=", target, measured, unit))
        return self.aims[-1]

    def at_least(self, what: str, measured: float | None, target: float, unit: str = "") -> Aim:
        self.aims.append(Aim(what, ">=", target, measured, unit))
        return self.aims[-1]

    def missed(self) -> list[Aim]:
        return [a for a in self.aims if not a.met]

    def markdown(self) -> str:
        """The aims table for the script's RESULTS.md section."""
        kind = " (smoke run: tiny sizes, the verdicts are informative)" if self.smoke else ""
        return (f"Aims{kind}:\n\n"
                + md_table(["aim", "target", "measured", "verdict"], [a.row() for a in self.aims]))

    def exit_code(self, *, broken: bool = False) -> int:
        """Write the verdicts for run_all.py, print them, and return the script's exit status."""
        VERDICTS_DIR.mkdir(parents=True, exist_ok=True)
        doc = {"script": self.script, "smoke": self.smoke, "broken": broken,
               "aims": [{"what": a.what, "op": a.op, "target": a.target, "measured": a.measured,
                         "unit": a.unit, "met": a.met} for a in self.aims]}
        (VERDICTS_DIR / f"{self.script}{'-smoke' if self.smoke else ''}.json").write_text(json.dumps(doc, indent=1))
        for a in self.aims:
            print(f"aim {self.script}: {' | '.join(a.row())}", flush=True)
        if broken:
            return 1
        return 0 if self.smoke or not self.missed() else 2


# -- the hub in its own process ---------------------------------------------------------------------
@dataclass
class HubProcess:
    """``fleethub serve --data-dir D --port P`` as a child process, with its embedded PostgreSQL."""

    data_dir: Path
    port: int
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    org_id: str = ""
    pat_id: str = ""
    pat_secret: str = ""
    owns_dir: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def headers(self) -> dict[str, str]:
        return {"X-API-Token-ID": self.pat_id, "X-API-Secret-Key": self.pat_secret,
                "X-Organization-ID": self.org_id}

    @classmethod
    def start(cls, *, heartbeat_interval: float = 30.0, env: dict[str, str] | None = None,
              name: str = "hub", startup_timeout: float = 90.0) -> "HubProcess":
        data_dir = Path(tempfile.mkdtemp(prefix=f"fleethub-bench-{name}-"))
        port = free_port()
        full_env = {**os.environ, "FLEETHUB_HEARTBEAT_INTERVAL": str(heartbeat_interval),
                    "FLEETHUB_LOG_LEVEL": os.environ.get("FLEETHUB_LOG_LEVEL", "WARNING"),
                    **(env or {})}
        hub = cls(data_dir=data_dir, port=port, env=full_env)
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        hub.log_path = OUT_DIR / f"{name}-{os.getpid()}.log"
        logf = hub.log_path.open("wb")
        hub.proc = subprocess.Popen(
            [*fleethub_cmd(), "serve", "--data-dir", str(data_dir), "--port", str(port)],
            stdout=logf, stderr=subprocess.STDOUT, env=full_env, cwd=str(REPO))
        logf.close()
        try:
            wait_http(hub.base_url + "/healthz", startup_timeout, hub.proc, "the hub")
        except BaseException:
            hub.stop()
            raise
        return hub

    def admin(self, *args: str) -> dict:
        r = subprocess.run([*fleethub_cmd(), "--log-level", "WARNING", "admin", "--data-dir",
                            str(self.data_dir), *args], capture_output=True, text=True, env=self.env,
                           cwd=str(REPO), timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"fleethub admin {' '.join(args)} failed: {r.stderr[-2000:]}")
        return json.loads(r.stdout)

    def bootstrap(self) -> None:
        """An organisation, an admin user and a PAT through ``fleethub admin``."""
        org = self.admin("create-org", "Bench Org")
        try:
            # the hub's per-organisation rate limit (1,000 requests/hour on the standard tier) would
            # answer a load test with 429s: the bench organisation gets a limit it cannot reach
            self.admin("set-tier", org["id"], "enterprise", "--rate-limit", "2000000000")
            self.extra["rate_limit"] = "enterprise tier, --rate-limit 2000000000 (fleethub admin set-tier)"
        except RuntimeError as exc:
            if "invalid choice" not in str(exc):
                raise
        email = f"bench-{uuid.uuid4().hex[:8]}@bench.local"
        self.admin("create-user", email, "--org", org["id"], "--role", "admin")
        pat = self.admin("create-pat", email, "--description", "benchmarks")
        self.org_id, self.pat_id, self.pat_secret = org["id"], pat["id"], pat["secret"]

    def dsn(self) -> str:
        url = self.env.get("FLEETHUB_DATABASE_URL")
        if url:
            return url
        from storage.embedded import EmbeddedPostgres

        pg = EmbeddedPostgres.running(self.data_dir / "pg")  # its DSN carries the superuser password
        if pg is None:
            raise RuntimeError(f"no embedded PostgreSQL runs in {self.data_dir / 'pg'}")
        return pg.dsn

    def pg_pid(self) -> int | None:
        try:
            return int((self.data_dir / "pg" / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def metrics(self) -> dict[str, float]:
        status, body = http_get(self.base_url + "/metrics", timeout=30)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return parse_metrics(body.decode())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        pg = self.pg_pid()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # the hub stops its PostgreSQL on the way out
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if pg is not None:  # the hub was killed, or died: stop the server it started
            try:
                os.kill(pg, signal.SIGINT)
                for _ in range(100):
                    os.kill(pg, 0)
                    time.sleep(0.1)
            except ProcessLookupError:
                pass
        if self.owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


# The hub's own process figures, from prometheus_client's process collector on /metrics (the hub reads
# its /proc/self for us: no pid to find, and the same numbers an operator's Prometheus would scrape).
def hub_cpu_seconds(metrics: dict[str, float]) -> float:
    return metrics["process_cpu_seconds_total"]


def hub_rss_kib(metrics: dict[str, float]) -> int:
    return int(metrics["process_resident_memory_bytes"] // 1024)


def hub_open_fds(metrics: dict[str, float]) -> int:
    return int(metrics["process_open_fds"])


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


# -- devices straight into the hub's database -------------------------------------------------------
def insert_devices(dsn: str, org_id: str, n: int, *, prefix: str = "bench") -> list[tuple[str, str]]:
    """Provision ``n`` devices in one COPY, as POST /v1/devices would: token ``dev_`` + 32 random bytes
    (urlsafe base64), stored as its SHA-256 digest in devices.token_hash. Returns [(id, token)]."""
    import asyncpg

    now = dt.datetime.now(dt.timezone.utc)
    devices, records = [], []
    org = uuid.UUID(org_id)
    for k in range(n):
        token = "dev_" + secrets.token_urlsafe(32)
        dev_id = uuid.uuid4()
        devices.append((str(dev_id), token))
        records.append((dev_id, org, f"{prefix}-{k}", [], hashlib.sha256(token.encode()).digest(), now, now))

    async def copy() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.copy_records_to_table(
                "devices", records=records,
                columns=["id", "org_id", "name", "tags", "token_hash", "created_at", "updated_at"])
        finally:
            await conn.close()

    asyncio.run(copy())
    return devices


def pg_statements(dsn: str) -> int:
    """Statements PostgreSQL has finished for the hub's database so far: pg_stat_database's committed
    plus rolled-back transactions (each autocommit statement is one; so is a pool's reset query).
    The server publishes these counters within about a second: read them after a pause."""
    import asyncpg

    async def read() -> int:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            return int(await conn.fetchval(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"))
        finally:
            await conn.close()

    return asyncio.run(read())


def storage_crossings(metrics: dict[str, float]) -> int:
    """The hub's trio-to-asyncpg crossings so far (its /metrics histogram's count)."""
    return int(metrics.get("fleethub_storage_crossing_seconds_count", 0))


def wait_until(predicate, timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# -- load-generator processes -----------------------------------------------------------------------
class Worker:
    """One bench/_simworker.py process; ``request(cmd)`` sends one JSON line and reads the answer."""

    def __init__(self, mode: str, *args: str, name: str = "worker") -> None:
        import queue
        import threading

        OUT_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = OUT_DIR / f"{name}-{os.getpid()}.log"
        errf = self.log_path.open("wb")
        self.proc = subprocess.Popen([PY, str(BENCH_DIR / "_simworker.py"), mode, *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf,
                                     text=True, cwd=str(REPO))
        errf.close()
        self._lines: queue.Queue = queue.Queue()

        def pump() -> None:
            for line in self.proc.stdout:
                self._lines.put(line)
            self._lines.put(None)

        threading.Thread(target=pump, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, cmd: dict) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float) -> dict:
        import queue

        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"worker {self.pid} did not answer within {timeout}s") from None
        if line is None:
            raise RuntimeError(f"worker {self.pid} exited ({self.proc.poll()}); see {self.log_path}")
        return json.loads(line)

    def request(self, cmd: dict, timeout: float = 60) -> dict:
        self.send(cmd)
        return self.receive(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()
                self.proc.wait()


def sum_stats(stats: list[dict]) -> dict:
    out: dict = {}
    for s in stats:
        for k, v in s.items():
            if isinstance(v, (int, float)):
                out[k] = out.get(k, 0) + v
    return out


def shm_tempdir(prefix: str) -> Path:
    """Simulated devices' state dirs on tmpfs when there is one: their fsyncs cost nothing there, so the
    load generator's disk is not what is measured."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


# -- py-spy (optional profiling evidence) -----------------------------------------------------------
class PySpy:
    """``py-spy record --format raw`` of a pid until ``stop()``; ``summary()`` lists the hottest frames."""

    def __init__(self, pid: int, out: Path, *, rate: int = 100) -> None:
        self.out = out
        exe = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
        if not Path(exe).exists():
            raise RuntimeError("py-spy is not installed (pip install py-spy)")
        out.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate),
                                      "--nonblocking", "--output", str(out)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def summary(self, top: int = 15) -> dict[str, list[tuple[str, float]]]:
        """Share of samples per frame: ``self`` (leaf) and ``inclusive`` (anywhere on the stack)."""
        leaf: dict[str, int] = {}
        incl: dict[str, int] = {}
        total = 0
        try:
            lines = self.out.read_text().splitlines()
        except OSError:
            return {"self": [], "inclusive": []}
        for line in lines:
            stack, _, count = line.rpartition(" ")
            try:
                n = int(count)
            except ValueError:
                continue
            frames = stack.split(";")
            total += n
            leaf[frames[-1]] = leaf.get(frames[-1], 0) + n
            for f in set(frames):
                incl[f] = incl.get(f, 0) + n
        if not total:
            return {"self": [], "inclusive": []}

        def ranked(d: dict[str, int]) -> list[tuple[str, float]]:
            return [(f, round(100 * n / total, 1)) for f, n in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

        # The hub's own functions (not the framework's), by inclusive share: where our code spends,
        # request middleware and views first. The entry frames (hub/cli.py) and loops that only wait
        # are on every stack and say nothing.
        ours: dict[str, int] = {}
        for line in lines:
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            for f in {re.sub(r":\d+\)$", ")", f) for f in stack.split(";")}:  # by function, not line
                if (re.search(r"\((?:/\S*/)?(?:hub|storage|actors|webrtc|device_client)/", f)
                        and "hub/cli.py" not in f and "bridge.py" not in f):
                    ours[f] = ours.get(f, 0) + int(count)
        return {"self": ranked(leaf), "inclusive": ranked(incl), "ours": ranked(ours), "samples": [("total", total)]}


# -- a browser (Debian's Chromium driven by Playwright), for the console's benchmarks ----------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def browser_missing(name: str) -> str | None:
    """Why ``name`` cannot measure in a browser here (said and exits 0: a smoke run without Chromium),
    or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"{name}: playwright is not installed; nothing measured"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{name}: {CHROMIUM} is missing (make system-deps); nothing measured"
    return None


def tunnel_device(hub: "HubProcess", name: str) -> tuple[str, str, dict[str, str]]:
    """On a bootstrapped hub: entitle its organisation to tunnels and provision a device; its id, its
    token, and the environment its agent process runs with (ICE on loopback, the token, quiet logs)."""
    hub.admin("tunnel-entitle", hub.org_id, "--enabled")
    status, body = http_json("POST", hub.base_url + "/v1/devices", {"name": name}, hub.headers)
    if status != 201:
        raise RuntimeError(f"provisioning a device: {status} {body}")
    dev_id, token = body["data"]["id"], body["data"]["token"]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FLEETHUB_ICE_ADDRESSES": "127.0.0.1", "FLEETHUB_DEVICE_TOKEN": token,
           "FLEETHUB_LOG_LEVEL": "WARNING"}
    return dev_id, token, env
