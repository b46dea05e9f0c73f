"""What authentication, authorisation, the rate limit and the audit row cost a cheap GET, with wrk.

    python bench/auth_overhead.py [--smoke] [--threads 1] [--connections 32] [--duration 10] [--rounds 2]
                                  [--py-spy]

Two hub processes on one database, the same code, the same requests, the same PAT headers:

- **full**: ``fleethub serve`` (bench/_common.py HubProcess) — every request authenticates its PAT
  (the AuthCache: a digest and a dict lookup when warm), takes the rate limit (the bench organisation
  is enterprise with ``--rate-limit 2000000000``, so the limiter counts but never refuses), checks the
  relation in the view (``authorize``) and appends an audit row to the write-behind;
- **open**: this script started again as ``--serve-open``: ``hub.services.open_services`` on the full
  hub's PostgreSQL (``serving=False``, as ``fleethub admin`` opens it: no device marked offline, no
  rollout resumed) and ``hub.app.create_app``, served by hypercorn's trio worker with the hub's
  settings (``hub.server.hypercorn_config``), where the app's ``_before`` hook (which calls
  ``middleware.authenticate``: credentials, rate limit, organisation) and ``_after`` hook (which calls
  ``middleware.audit``) are replaced by hooks that only set what the views read — ``g.principal``
  (the bench PAT's user) and ``g.org`` = ``OrgContext(org, "admin")``, for which ``authorize`` returns
  at once — and keep the rest of what the originals do (X-Request-ID, the request counter).

The route is ``GET /v1/devices/{id}`` (PAT + organisation + relation check + the cached device read:
``storage.rowcache.RowCache``, 2 s ttl). wrk runs with the same settings against both processes,
alternating (full, open, then open, full: ABBA, so a drift of the machine cancels), ``--rounds`` times,
each run after a quiet machine (``wait_quiet``) and a 2 s warm-up.
The ratio is full/open requests per second (aim ≥ 0.8).

``GET /v1/me`` is not measured: it is a ``@no_org`` route, whose requests the hub counts against the
PAT itself at the standard tier's 1,000 requests/hour whatever the caller's organisation
(hub/auth/middleware.py ``authenticate``: ``in_org`` is false for no-org views, so ``limit_for(None,
None)``), so the full hub answers 429 after the first 1,000 requests of a run and there is no
switch to lift it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import fmean

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (OUT_DIR, PY, REPO, HubProcess, _cpu_times, PySpy, Verdicts, command_line,  # noqa: E402
                     cpu_seconds, facts_line, free_port, http_get, http_json, loadavg, log, machine_facts,
                     md_table, wait_http, wait_quiet, write_section)

AIM = 0.8
# frames of the work the open process leaves out (py-spy "function (file:line)" frames)
AUTH_FILES = ("hub/auth/middleware.py", "hub/auth/schemes.py", "hub/auth/routes.py", "hub/declared.py",
              "hub/auth/ratelimit.py", "hub/auth/cache.py", "hub/auth/pat.py", "hub/auth/authz.py",
              "storage/behind.py", "storage/audit.py")


# -- the open process: the hub's app without authentication, rate limit and audit -------------------
def serve_open(args: argparse.Namespace) -> None:
    import logging
    import uuid

    import trio
    from hypercorn.trio import serve
    from quart import g, request

    from hub.app import create_app
    from hub.auth.principals import OrgContext, Principal
    from hub.ids import fast_uuid4
    from hub.server import hypercorn_config
    from hub.services import open_services
    from hub.settings import Settings

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env(data_dir=Path(args.data_dir), database_url=args.dsn, port=args.port,
                                 host="127.0.0.1", log_level="WARNING")
    principal = Principal(kind="user", id=args.pat_id, user_id=uuid.UUID(args.user_id), via="pat")
    org = OrgContext(uuid.UUID(args.org_id), "admin")

    async def main() -> None:
        # SIGINT/SIGTERM cancel everything in order (as `fleethub serve` does): a KeyboardInterrupt would
        # land in whichever request task runs at that moment and can leave the process hanging
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                async def watch() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(watch)
                await serve_app()
                nursery.cancel_scope.cancel()

    async def serve_app() -> None:
        async with open_services(settings, serving=False) as services:
            app = create_app(services)
            before = [f.__name__ for f in app.before_request_funcs[None]]
            after = [f.__name__ for f in app.after_request_funcs[None]]
            if before != ["_before"] or after != ["_after"]:
                # hub/app.py changed its hooks: what this process leaves out would no longer be known
                raise SystemExit(f"unexpected request hooks: before {before}, after {after}")

            async def _before_open() -> None:  # _before without middleware.authenticate
                g.request_id = request.headers.get("X-Request-ID") or str(fast_uuid4())
                g.principal = principal
                g.org = org

            async def _after_open(response):  # _after without rate-limit headers and middleware.audit
                response.headers["X-Request-ID"] = getattr(g, "request_id", None) or str(fast_uuid4())
                services.metrics.observe_request(request.method, response.status_code)
                return response

            app.before_request_funcs[None] = [_before_open]
            app.after_request_funcs[None] = [_after_open]
            await serve(app, hypercorn_config("127.0.0.1", args.port))

    try:
        trio.run(main)
    except KeyboardInterrupt:
        pass


def start_open(hub: HubProcess, user_id: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    logf = (OUT_DIR / f"auth-open-{os.getpid()}.log").open("wb")
    proc = subprocess.Popen([PY, str(Path(__file__).resolve()), "--serve-open", "--port", str(port),
                             "--dsn", hub.dsn(), "--data-dir", str(hub.data_dir), "--org-id", hub.org_id,
                             "--user-id", user_id, "--pat-id", hub.pat_id],
                            stdout=logf, stderr=subprocess.STDOUT, cwd=str(REPO), env=hub.env)
    logf.close()
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", 60, proc, "the open hub process")
    return proc, url


def stop_proc(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(2)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- load ---------------------------------------------------------------------------------------------
def load_once(url: str, headers: dict, args, duration: float, use_wrk: bool) -> dict:
    from http_ratio import run_python_load, run_wrk  # the same wrk invocation and parsing

    if use_wrk:
        r = run_wrk(url, headers, args.threads, args.connections, duration)
        r.pop("raw", None)
        return r
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return run_python_load(f"{u.scheme}://{u.netloc}", u.path, headers, args.connections, duration)


def auth_share(raw: Path) -> dict:
    """Share of the full hub's samples with a frame of the auth/rate-limit/audit code on the stack."""
    total = hit = 0
    per_file: dict[str, int] = {}
    try:
        lines = raw.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        try:
            n = int(count)
        except ValueError:
            continue
        total += n
        files = {f for f in AUTH_FILES if f in stack}
        if files:
            hit += n
        for f in files:
            per_file[f] = per_file.get(f, 0) + n
    if not total:
        return {}
    return {"samples": total, "any": round(100 * hit / total, 1),
            "per_file": {f: round(100 * n / total, 1) for f, n in sorted(per_file.items(), key=lambda kv: -kv[1])}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny size, < 30 s; results go to bench/out/")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--python-load", action="store_true", help="use bench/_httpload.py even if wrk exists")
    p.add_argument("--py-spy", action="store_true", help="record the full hub with py-spy in its first round")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="wait up to this long for the machine to be < 25%% busy before measuring")
    p.add_argument("--round-quiet-wait", type=float, default=30.0,
                   help="and up to this long before each measured wrk run")
    p.add_argument("--no-write", action="store_true")
    # internal: the open process
    p.add_argument("--serve-open", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dsn", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", help=argparse.SUPPRESS)
    p.add_argument("--org-id", help=argparse.SUPPRESS)
    p.add_argument("--user-id", help=argparse.SUPPRESS)
    p.add_argument("--pat-id", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_open:
        serve_open(args)
        return 0
    if args.smoke:
        args.duration, args.rounds = 2.0, 1
    routes = ["device"]
    use_wrk = shutil.which("wrk") is not None and not args.python_load
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    tool = (f"wrk -t{args.threads} -c{args.connections} -d{args.duration:g}s --latency" if use_wrk else
            f"Python load generator (bench/_httpload.py; wrk not installed), {args.connections} connections, "
            f"{args.duration:g} s")
    log(f"auth_overhead with {tool}")

    hub = HubProcess.start(heartbeat_interval=30.0, name="auth-hub")
    open_proc = None
    from delivery import code_version

    results: dict = {"tool": tool, "routes": {}, "code": code_version()}
    try:
        hub.bootstrap()
        results["rate_limit"] = hub.extra.get("rate_limit")
        status, created = http_json("POST", hub.base_url + "/v1/devices", {"name": "bench-device"}, hub.headers)
        if status != 201:
            raise RuntimeError(f"POST /v1/devices answered {status}: {created}")
        status, me = http_json("GET", hub.base_url + "/v1/me", headers=hub.headers)  # the PAT's user id
        if status != 200 or not me["data"].get("userId"):
            raise RuntimeError(f"GET /v1/me answered {status}: {me}")
        open_proc, open_url = start_open(hub, me["data"]["userId"])
        paths = {"device": f"/v1/devices/{created['data']['id']}"}
        targets = {"full": (hub.base_url, hub.pid), "open": (open_url, open_proc.pid)}
        for route in routes:
            path = paths[route]
            sizes = {}
            for name, (base, _) in targets.items():
                st, body = http_get(base + path, headers=hub.headers)
                if st != 200:
                    raise RuntimeError(f"{name} GET {path} answered {st}: {body[:300]!r}")
                sizes[name] = len(body)
            res = results["routes"][route] = {"path": path, "bytes": sizes, "full": [], "open": []}
            log(f"{route}: GET {path} answer sizes {sizes}")
            for rnd in range(args.rounds):
                order = list(targets.items()) if rnd % 2 == 0 else list(targets.items())[::-1]  # ABBA: drift cancels
                for name, (base, pid) in order:
                    quiet = wait_quiet(args.round_quiet_wait) if not args.smoke else None
                    load_once(base + path, hub.headers, args, min(2.0, args.duration), use_wrk)  # warm-up
                    spy = (PySpy(hub.pid, OUT_DIR / f"auth_overhead-{route}-full.pyspy.txt")
                           if args.py_spy and name == "full" and rnd == 0 else None)
                    cpu0, t0, m0 = cpu_seconds(pid), time.monotonic(), _cpu_times()
                    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    r = load_once(base + path, hub.headers, args, args.duration, use_wrk)
                    wall, m1 = time.monotonic() - t0, _cpu_times()
                    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    r["server_cpu_percent"] = round(100 * (cpu_seconds(pid) - cpu0) / wall, 1)
                    # the load generator's own CPU, and everything else on the machine meanwhile (another
                    # session's work shows up here): cores busy × 100 − server − load generator
                    r["loadgen_cpu_percent"] = round(100 * (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime
                                                            - ru0.ru_stime) / wall, 1)
                    machine = 100 * (m1[0] - m0[0]) / max(1, m1[1] - m0[1]) * (os.cpu_count() or 1)
                    r["others_cpu_percent"] = round(max(0.0, machine - r["server_cpu_percent"]
                                                        - r["loadgen_cpu_percent"]), 1)
                    r["busy_before"] = None if quiet is None else round(quiet)
                    if spy:
                        spy.stop()
                        res["py_spy"] = spy.summary()
                        res["py_spy_auth"] = auth_share(spy.out)
                    res[name].append(r)
                    log(f"{route} round {rnd + 1} {name}: {json.dumps(r)}")
            full = fmean(r["rps"] for r in res["full"])
            opened = fmean(r["rps"] for r in res["open"])
            res["mean"] = {"full": full, "open": opened}
            res["ratio"] = round(full / opened, 3) if opened else 0.0
            log(f"{route}: full {full:,.0f} req/s, open {opened:,.0f} req/s, ratio {res['ratio']}")
    finally:
        stop_proc(open_proc)
        hub.stop()

    (OUT_DIR / f"auth_overhead{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(results, indent=1))
    verdicts = Verdicts("auth_overhead", smoke=args.smoke)
    for route, res in results["routes"].items():
        verdicts.at_least(f"full/open req/s ({route})", res.get("ratio"), AIM)
    body = render(results, facts, args) + "\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('auth_overhead', body, smoke=args.smoke)}")
    bad = any(r["non2xx"] or r["socket_errors"] or not r["rps"]
              for res in results["routes"].values() for r in res["full"] + res["open"])
    return verdicts.exit_code(broken=bad)


def render(r: dict, facts: dict, args) -> str:
    label = {"device": "GET /v1/devices/{id}"}
    out = ["## Authentication, authorisation, rate limit and audit overhead (bench/auth_overhead.py)", "",
           f"`{command_line()}`", "", f"{facts_line(facts)}; load average at end {loadavg()}; code at {r.get('code')}",
           "",
           *([f"The bench organisation is lifted out of the hub's request rate limit: {r['rate_limit']} "
              "(the limiter still counts every request).", ""] if r.get("rate_limit") else []),
           "**full** is `fleethub serve`: PAT authentication (AuthCache), rate limit, organisation context, the "
           "relation check in the view and the audit row appended to the write-behind. **open** is a second hub "
           "process of the same code on the same PostgreSQL whose `_before`/`_after` request hooks are replaced by "
           "ones that only set `g.principal` and `g.org` (admin) and keep X-Request-ID and the request counter — "
           "no `middleware.authenticate`, no rate limit, no `middleware.audit`. Same PAT headers sent to both. "
           f"Load: {r['tool']}, alternating full/open then open/full (ABBA), each run after a quiet machine and a 2 s warm-up.", ""]
    rows = []
    for route, res in r["routes"].items():
        for name in ("full", "open"):
            for i, x in enumerate(res[name]):
                rows.append([label[route], name, i + 1, f"{x['rps']:,.0f}", f"{x['requests']:,}", x["non2xx"],
                             x["socket_errors"], x["p50"], x["p90"], x["p99"], x["server_cpu_percent"],
                             x.get("loadgen_cpu_percent"), x.get("others_cpu_percent"),
                             "—" if x.get("busy_before") is None else f"{x['busy_before']}%"])
    out += [md_table(["route", "process", "round", "req/s", "requests", "non-2xx", "socket errors", "p50 ms",
                      "p90 ms", "p99 ms", "server CPU %", "wrk CPU %", "everything else CPU %",
                      "machine busy before"], rows), "",
            "CPU % is of one core; \"everything else\" is the machine's busy time over the run (all cores) minus "
            "the server and wrk: the other hub process, PostgreSQL, and any other work on this shared machine.", ""]
    for route, res in r["routes"].items():
        verdict = "meets" if res["ratio"] >= AIM else "misses"
        out.append(f"- {label[route]} ({res['bytes']['full']} B answer from full, {res['bytes']['open']} B from open): "
                   f"full {res['mean']['full']:,.0f} req/s, open {res['mean']['open']:,.0f} req/s — "
                   f"**ratio full/open {res['ratio']:.2f}** ({verdict} the aim ≥ {AIM})")
    out += ["", "`GET /v1/me` is not measured: it is a no-organisation route, and the hub limits those per PAT at "
            "the standard tier's 1,000 requests/hour whatever the caller's organisation "
            "(hub/auth/middleware.py `authenticate`), so the full hub answers 429 after 1,000 requests."]
    for route, res in r["routes"].items():
        if res.get("py_spy"):
            a = res.get("py_spy_auth") or {}
            out += ["", f"py-spy of the full hub, {label[route]}, first round ({a.get('samples', 0)} samples): "
                    f"{a.get('any', 0)}% of samples have a frame of the auth / rate-limit / audit code on the stack "
                    f"({', '.join(f'{f} {v}%' for f, v in (a.get('per_file') or {}).items())}). Self time:", ""]
            out += [f"- {pct}% {frame}" for frame, pct in res["py_spy"]["self"][:10]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
