"""CPU per request in the app itself: the hub, the framework floor and bare Quart-Trio, in one process.

    python bench/app_cost.py [--smoke] [--requests 2000] [--rounds 8] [--no-write]

bench/http_ratio.py measures what a user sees, requests per second through hypercorn and the network,
and on this shared 2-core machine one target's rate moves by a fifth between two runs a minute apart
with nothing changed. This measures the part the hub can change, with little of that noise: each app
is called as ASGI directly (no server, no socket, no load generator), ``GET /v1/devices/{id}`` one
request after another, and the process's CPU time (all its threads: the hub's storage thread
included) is divided by the requests.

- **hub**: ``hub.app.create_app`` on ``hub.services.open_services`` (``serving=False``, as
  ``fleethub admin`` opens it) over the PostgreSQL of a ``fleethub serve`` started for the run (its
  embedded one): authentication from the AuthCache, the rate limit, the device read (2 s row cache),
  access, the audit row written behind by this process, metrics;
- **floor** and **bare**: bench/_bare_app.py with and without ``--framework``, serving the hub's
  captured answer, as http_ratio.py runs them.

``--rounds`` rounds of ``--requests`` requests per app, each round starting with the next app, after
a warm-up of 200 each. The figures are the medians of the rounds (and the smallest round, the one
least disturbed). Python's garbage collector runs as it comes for all three (the hub's own tuning,
hub/gc_tuning.py, is a ``fleethub serve`` thing and is not applied here).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (OUT_DIR, HubProcess, Verdicts, command_line, facts_line, http_get, http_json,  # noqa: E402
                     loadavg, log, machine_facts, md_table, write_section)

WARM_UP = 200


def _scope(path: str, headers: dict[str, str]) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8080), "extensions": {}}


async def _drive(app, path: str, headers: dict[str, str], n: int) -> tuple[float, list[int], bytes]:
    """``n`` requests one after another; CPU seconds of the process, the statuses, the last body."""
    import trio

    statuses: list[int] = []
    body = [b""]

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
        elif message["type"] == "http.response.body" and message.get("body"):
            body[0] = message["body"]

    def receiver():
        sent = [False]

        async def receive() -> dict:
            if sent[0]:
                await trio.sleep_forever()  # the client never leaves; Quart stops listening when it answers
            sent[0] = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return receive

    cpu0 = time.process_time()
    for _ in range(n):
        await app(_scope(path, headers), receiver(), send)
    return time.process_time() - cpu0, statuses, body[0]


def measure(hub: HubProcess, path: str, rounds: int, requests: int) -> dict:
    import trio

    import _bare_app
    from hub.app import create_app
    from hub.services import open_services
    from hub.settings import Settings

    results: dict = {"hub": [], "floor": [], "bare": []}

    async def main() -> None:
        data_dir = Path(tempfile.mkdtemp(prefix="fleethub-bench-appcost-"))
        settings = Settings.from_env(data_dir=data_dir, database_url=hub.dsn(), host="127.0.0.1", port=0,
                                     log_level="WARNING")
        try:
            await measure_in(settings)
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)

    async def measure_in(settings) -> None:
        async with open_services(settings, serving=False) as services:
            hub_app = create_app(services)
            _, statuses, body = await _drive(hub_app, path, hub.headers, 1)
            if statuses != [200]:
                raise RuntimeError(f"the hub app answered {statuses}: {body[:200]!r}")
            document = json.loads(body)
            results["bytes"] = len(body)
            apps = [("hub", hub_app), ("floor", _bare_app.create_app(document, framework=True)),
                    ("bare", _bare_app.create_app(document))]
            for name, app in apps:
                await _drive(app, path, hub.headers, WARM_UP)
            for rnd in range(rounds):
                for name, app in apps[rnd % 3:] + apps[:rnd % 3]:
                    cpu, statuses, _ = await _drive(app, path, hub.headers, requests)
                    if set(statuses) != {200}:
                        raise RuntimeError(f"{name} answered {sorted(set(statuses))}")
                    results[name].append(round(1e6 * cpu / requests, 1))
                log(f"round {rnd + 1}: " + ", ".join(f"{n} {results[n][-1]:.0f} µs" for n, _ in apps))

    trio.run(main)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--requests", type=int, default=2000, help="requests per app per round")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--quiet-wait", type=float, default=60.0,
                   help="wait up to this long for the machine to be < 25%% busy before measuring")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.requests, args.rounds = 200, 2
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    hub = HubProcess.start(heartbeat_interval=30.0, name="app-cost")
    try:
        hub.bootstrap()
        status, created = http_json("POST", hub.base_url + "/v1/devices", {"name": "bench-device"}, hub.headers)
        if status != 201:
            raise RuntimeError(f"POST /v1/devices answered {status}: {created}")
        path = f"/v1/devices/{created['data']['id']}"
        if http_get(hub.base_url + path, headers=hub.headers)[0] != 200:
            raise RuntimeError(f"GET {path} failed")
        log(f"app_cost: {args.rounds} rounds of {args.requests} requests per app")
        results = measure(hub, path, args.rounds, args.requests)
    finally:
        hub.stop()

    med = {n: median(results[n]) for n in ("hub", "floor", "bare")}
    low = {n: min(results[n]) for n in ("hub", "floor", "bare")}
    results["median_us"], results["min_us"] = med, low
    (OUT_DIR / f"app_cost{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(results, indent=1))
    rows = [[n, f"{med[n]:.0f}", f"{low[n]:.0f}", " / ".join(f"{x:.0f}" for x in results[n])]
            for n in ("hub", "floor", "bare")]
    body = "\n".join([
        "## CPU per request in the app, in one process (bench/app_cost.py)", "", f"`{command_line()}`", "",
        f"{facts_line(facts)}; load average at end {loadavg()}", "",
        f"`GET /v1/devices/{{id}}` called as ASGI, no server or socket, one request after another: {args.rounds} "
        f"rounds of {args.requests:,} requests per app, each round starting with the next app; µs of the process's "
        f"CPU time (all threads) per request. The hub's answer is {results['bytes']} B; floor and bare serve it.", "",
        md_table(["app", "median µs", "least µs", "each round µs"], rows), "",
        f"The hub's own work per request (hub − floor): **{med['hub'] - med['floor']:.0f} µs** (median; "
        f"{low['hub'] - low['floor']:.0f} between the least rounds). The framework set-up's (floor − bare): "
        f"{med['floor'] - med['bare']:.0f} µs. What hypercorn, h11 and the socket add per request is the same "
        f"for all three and is not in these figures (bench/http_ratio.py has them all).", ""])
    verdicts = Verdicts("app_cost", smoke=args.smoke)  # informative: the aim is http_ratio.py's
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('app_cost', body, smoke=args.smoke)}")
    return verdicts.exit_code()


if __name__ == "__main__":
    sys.exit(main())
