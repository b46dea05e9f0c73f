"""A webhook receiver down during a real rollout, then back: every event delivered, in order per subject.

    python bench/events_rollout.py [--smoke] [--devices 1000] [--down 600] [--batch-size 100]

``fleethub serve`` in its own process (FLEETHUB_WEBHOOKS_ALLOW_PRIVATE=1: the receiver is on
loopback) with ``--devices`` devices in one fleet, all connected over real WebSockets from one
load-generator process of ``device_client.agent.Agent`` s (bench/delivery.py ``start_fleet``, as
bench/rollout.py sets them up). One webhook endpoint for ``io.fleethub.rollout.*`` and
``io.fleethub.device.*`` on a local receiver (tests/api/webhook_receiver.py, in a thread of this
process) that answers 503 from before ``POST /v1/rollouts`` (a configuration with ``spec: {}``,
batches of ``--batch-size``) until ``--down`` seconds later or the rollout's end, whichever comes
last, then 200.

Counted against the log itself (the hub's ``events`` table, read in SQL): every event of those types
after the endpoint's starting cursor and up to the last one written when the receiver came back.
Reported: how many of them the receiver took (a 200) after it came back, how many are missing, whether
each subject's (a device's, the rollout's) events arrived in sequence order, and the catch-up time
(from the receiver's return to the last of them taken), bounded by ``--catch-up``. The hub retries
on its own schedule (5 s doubling to 1 h, hub/webhooks/schedule.py): after a long outage, most of
the catch-up is the wait for the next retry.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import OUT_DIR, Verdicts, command_line, facts_line, loadavg, log, machine_facts, md_table, \
    write_section  # noqa: E402
from delivery import expect, start_fleet  # noqa: E402
from rollout import TERMINAL, list_state  # noqa: E402

TYPES = ["io.fleethub.rollout.*", "io.fleethub.device.*"]
SCAN_WAIT = 2.5  # the deliverer scans for endpoints every 2 s (hub/webhooks/worker.py)


class ReceiverThread:
    """The test receiver on 127.0.0.1 in a trio run of its own thread: 503 while ``up`` is false.
    ``taken`` holds (monotonic time, subject, sequence, id) of each request answered 200, in order."""

    def __init__(self, limit_s: float) -> None:
        self.up = False
        self.refused = 0
        self.taken: list[tuple[float, str, int, str]] = []
        self.url = ""
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(limit_s,), name="receiver", daemon=True)

    def _answer(self, request) -> int:
        if not self.up:
            self.refused += 1
            return 503
        e = json.loads(request.body)
        self.taken.append((time.monotonic(), e["subject"], int(e["sequence"]), e["id"]))
        return 200

    def _run(self, limit_s: float) -> None:
        import trio

        from tests.api.webhook_receiver import Receiver

        async def main() -> None:
            receiver = Receiver(answer=self._answer)
            with trio.move_on_after(limit_s):
                async with trio.open_nursery() as nursery:
                    await nursery.start(receiver.serve)
                    self.url = receiver.url
                    self._ready.set()
                    while not self._stop.is_set():
                        await trio.sleep(0.1)
                    nursery.cancel_scope.cancel()

        trio.run(main)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the receiver did not start")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def logged(fleet, after: int, upto: int) -> list:
    """The events of the endpoint's types in the hub's log, cursor ``after`` < org_seq <= ``upto``."""
    return fleet.pg.fetch("SELECT id, subject, org_seq FROM events WHERE org_id = $1 AND org_seq > $2 "
                          "AND org_seq <= $3 AND (type LIKE 'rollout.%' OR type LIKE 'device.%') ORDER BY org_seq",
                          uuid.UUID(fleet.hub.org_id), after, upto)


def last_seq(fleet) -> int:
    rows = fleet.pg.fetch("SELECT last FROM event_counters WHERE org_id = $1", uuid.UUID(fleet.hub.org_id))
    return rows[0]["last"] if rows else 0


def run(args) -> dict:
    os.environ["FLEETHUB_WEBHOOKS_ALLOW_PRIVATE"] = "1"  # the hub process inherits it: the receiver is on loopback
    bound = args.devices_timeout + args.timeout + args.down + args.catch_up + 120
    receiver = ReceiverThread(bound)
    receiver.start()
    r: dict = {"devices": args.devices, "batch_size": args.batch_size, "down_s": args.down}
    fleet = start_fleet(args.devices, "events-rollout", connect_timeout=args.devices_timeout)
    api = fleet.api
    try:
        r["connect_seconds"] = fleet.connect_seconds
        cfg = expect(*api.call("POST", "/v1/configurations", {"name": f"bench-events-{secrets.token_hex(3)}",
                                                              "spec": {}}), (201,), "POST /v1/configurations")["data"]
        endpoint = expect(*api.call("POST", "/v1/webhooks", {"url": receiver.url, "event_types": TYPES}),
                          (201,), "POST /v1/webhooks")["data"]
        start_cursor = endpoint["cursor"]
        time.sleep(SCAN_WAIT)  # the deliverer takes the endpoint's lease
        t0 = time.monotonic()
        rollout = expect(*api.call("POST", "/v1/rollouts", {"fleet_ids": [fleet.fleet_id], "configuration_id": cfg["id"],
                                                            "batch_size": args.batch_size}),
                         (201,), "POST /v1/rollouts")["data"]
        state = rollout["state"]
        while state not in TERMINAL and time.monotonic() - t0 < args.timeout:
            time.sleep(0.5)
            state = list_state(api, rollout["id"])
        r["rollout_state"], r["rollout_s"] = state, round(time.monotonic() - t0, 1)
        log(f"rollout {rollout['id']} {state} after {r['rollout_s']} s; the receiver stays down until "
            f"{args.down:g} s after the POST")
        time.sleep(max(0.0, t0 + args.down - time.monotonic()))
        upto = last_seq(fleet)
        receiver.up = True
        back = time.monotonic()
        r["down_for_s"] = round(back - t0, 1)
        r["refused_while_down"] = receiver.refused
        expected = logged(fleet, start_cursor, upto)
        want = {str(e["id"]) for e in expected}
        while time.monotonic() - back < args.catch_up and not want <= {t[3] for t in list(receiver.taken)}:
            time.sleep(0.5)
        taken = list(receiver.taken)
        last_needed = max((at for at, _, _, ident in taken if ident in want), default=back)
        r["catch_up_s"] = round(last_needed - back, 1) if want <= {t[3] for t in taken} else None
        # how much of the catch-up was the wait for the hub's next retry (its backoff after the outage)
        r["first_taken_s"] = round(taken[0][0] - back, 1) if taken else None
        per_subject: dict[str, list[int]] = {}
        firsts: set[str] = set()
        for _, subject, seq, ident in taken:
            if ident not in firsts:
                firsts.add(ident)
                per_subject.setdefault(subject, []).append(seq)
        r["events"] = len(want)
        r["by_kind"] = {"rollout": sum(1 for e in expected if e["subject"].startswith("rollouts/")),
                        "device": sum(1 for e in expected if e["subject"].startswith("devices/"))}
        r["subjects"] = len({e["subject"] for e in expected})
        r["delivered"] = len(want & {t[3] for t in taken})
        r["lost"] = len(want) - r["delivered"]
        r["requests_after_return"] = len(taken)
        r["duplicates"] = len(taken) - len({t[3] for t in taken})
        # docs/events.md: a repeat (at least once) may come after later events of its subject; a first
        # arrival never does
        r["in_order_per_subject"] = all(seqs == sorted(seqs) for seqs in per_subject.values())
        log(f"after the receiver's return: {r['delivered']}/{r['events']} taken, catch-up {r['catch_up_s']} s")
    finally:
        fleet.stop()
        receiver.stop()
    return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny size; results go to bench/out/")
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--down", type=float, default=600.0, help="seconds from the POST until the receiver is back")
    p.add_argument("--timeout", type=float, default=300.0, help="bound on the rollout")
    p.add_argument("--devices-timeout", type=float, default=180.0, help="bound on the devices' connecting")
    p.add_argument("--catch-up", type=float, default=1200.0, help="the most seconds waited after the return")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.devices, args.batch_size, args.down, args.timeout, args.catch_up = 20, 5, 8.0, 60.0, 60.0
    facts = machine_facts(0)
    r = run(args)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"events_rollout{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(r, indent=1))
    verdicts = Verdicts("events_rollout", smoke=args.smoke)
    verdicts.at_most("events lost to a receiver outage during a rollout", r["lost"], 0)
    verdicts.at_most("subjects whose events arrived out of order", 0 if r["in_order_per_subject"] else 1, 0)
    rows = [["rollout", f"{r['devices']} devices over WebSockets, batches of {r['batch_size']}",
             f"{r['rollout_state']} in {r['rollout_s']} s (devices connected in {r['connect_seconds']} s)"],
            ["outage", "receiver answering 503 from before the POST, for", f"{r['down_for_s']} s "
             f"({r['refused_while_down']} attempts refused)"],
            ["events", "rollout and device events in the log meanwhile (counted in SQL)",
             f"{r['events']} over {r['subjects']} subjects (rollout {r['by_kind']['rollout']}, "
             f"device {r['by_kind']['device']})"],
            ["delivered", "taken by the receiver after its return", f"{r['delivered']}/{r['events']}, lost {r['lost']}, "
             f"{r['requests_after_return']} requests ({r['duplicates']} repeats)"],
            ["order", "each subject's events in sequence order (first arrivals)", r["in_order_per_subject"]],
            ["catch-up", "from the return to the last of them taken (of which the wait for the hub's next retry, "
             "to the first taken)", f"{r['catch_up_s']} s ({r['first_taken_s']} s)"]]
    body = "\n".join(["## A webhook receiver down during a real rollout (bench/events_rollout.py)", "",
                      f"`{command_line()}`", "", f"{facts_line(facts)}; load average at end {loadavg()}", "",
                      "`fleethub serve` in its own process; the devices are Agents of one load-generator process; "
                      "the receiver is a thread of the bench's process.", "",
                      md_table(["part", "what", "measured"], rows), "", verdicts.markdown(), ""])
    print(body)
    if not args.no_write or args.smoke:
        log(f"wrote {write_section('events_rollout', body, smoke=args.smoke)}")
    return verdicts.exit_code(broken=r["rollout_state"] != "completed" or r["catch_up_s"] is None)


if __name__ == "__main__":
    sys.exit(main())
