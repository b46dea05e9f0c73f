"""A Live Quick memory test seen through the hub: wall time and the progress rate the API shows.

    python bench/memtest_live.py [--smoke] [--budget 512M]

``fleethub serve`` and ``fleethub agent --memory-budget SIZE`` run as separate processes; the script
starts a Live Quick test with ``POST /v1/devices/{id}/memory-test`` and polls
``GET /v1/devices/{id}/memory-test`` every 0.5 s until the result is stored. Reported: time from the
POST to the stored result, the rate (``status.rateBps``) the hub showed while the test ran, how many
distinct progress updates the polls saw, and the result's tested bytes. The budget caps the memory the
agent tests (a Live Quick run tests at most a quarter of available memory, capped at 512 MiB).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (OUT_DIR, HubProcess, command_line, facts_line, fleethub_cmd, http_json, log,  # noqa: E402
                     machine_facts, md_table, write_section)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="16 MiB budget")
    p.add_argument("--budget", default="512M")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args()
    budget = "16M" if args.smoke else args.budget
    facts = machine_facts()
    hub = HubProcess.start(name="memtest-live")
    agent = None
    try:
        hub.bootstrap()
        status, dev = http_json("POST", hub.base_url + "/v1/devices", {"name": "memtest-bench"}, hub.headers)
        assert status == 201, dev
        device_id, token = dev["data"]["id"], dev["data"]["token"]
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        agent_log = (OUT_DIR / "memtest-live-agent.log").open("wb")
        agent = subprocess.Popen([*fleethub_cmd(), "agent", "--hub", hub.base_url, "--token", token,
                                  "--data-dir", str(hub.data_dir / "device"), "--memory-budget", budget],
                                 stdout=agent_log, stderr=subprocess.STDOUT, env=hub.env)
        url = f"{hub.base_url}/v1/devices/{device_id}"
        deadline = time.monotonic() + 60
        while http_json("GET", url, None, hub.headers)[1]["data"].get("online") is not True:
            assert time.monotonic() < deadline, "the agent did not connect"
            time.sleep(0.2)
        t0 = time.monotonic()
        status, started = http_json("POST", url + "/memory-test",
                                    {"impact": "running", "placement": "online", "quick": True}, hub.headers)
        assert status == 202, started
        run_id = started["data"]["runId"]
        rates, updates, last = [], 0, None
        result = None
        while time.monotonic() - t0 < args.timeout:
            time.sleep(0.5)
            _, view = http_json("GET", url + "/memory-test", None, hub.headers)
            st = (view.get("data") or {}).get("status") or {}
            key = (st.get("phase"), st.get("pass"), st.get("pattern"), st.get("testedBytes"))
            if st.get("runId") == run_id and key != last:
                updates, last = updates + 1, key
                if st.get("rateBps"):
                    rates.append(st["rateBps"])
            _, res = http_json("GET", url + "/memory-test/results?limit=1", None, hub.headers)
            found = (res.get("data") or {}).get("results") or []
            if found and found[0].get("runId") == run_id and found[0].get("outcome"):
                result = found[0]
                break
        wall = time.monotonic() - t0
        assert result is not None, f"no result within {args.timeout}s"
        rate = statistics.median(rates) if rates else 0
        log(f"Live Quick {budget}: {wall:.1f} s POST → stored result, outcome {result['outcome']}, "
            f"hub-shown rate median {rate / 1e9:.2f} GB/s over {updates} progress updates")
        body = "\n".join([
            "## A Live Quick memory test through the hub (bench/memtest_live.py)", "",
            f"`{command_line()}`", "", facts_line(facts), "",
            md_table(["budget", "POST → stored result", "outcome", "tested bytes (all patterns)",
                      "rate the hub showed (median of polls)", "distinct progress updates seen"],
                     [[budget, f"{wall:.1f} s", result["outcome"], f"{result.get('testedBytes', 0):,}",
                       f"{rate / 1e9:.2f} GB/s", updates]]),
            "", "The hub's rate is the device's own `rateBps` as the status endpoint serves it (polled every 0.5 s)."])
        write_section("memtest_live", body, smoke=args.smoke)
        return 0
    finally:
        if agent is not None:
            agent.kill()
            agent.wait(10)
        hub.stop()


if __name__ == "__main__":
    raise SystemExit(main())
