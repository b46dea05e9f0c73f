"""An operator's first day, as pictures: `make run`'s hub, then every console page, into docs/img/.

    .venv/bin/python -m tests.browser.walkthrough --out docs/img

Runs `fleethub demo` exactly as `make run` does (its own port and a temporary data dir), makes through
the API what a first day makes (a configuration with a secret file, a rollout of it, a second fleet whose
update window is closed with a rollout waiting for it, a memory test), then signs in as the demo admin in
Debian's Chromium and takes one full-page screenshot of each console page. Not a test: the pictures are
for people to look at (issue 37 asks for them). Bounded: every wait has a deadline, the hub is stopped
at the end whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.ports import free_port

WORKLOAD = {"command": ["sleep", "infinity"], "healthCheck": {"timeoutSeconds": 5, "graceSeconds": 0.5}}
EVERY_DAY = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _wait(what: str, predicate, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"walkthrough: {what} did not happen within {timeout:.0f} s")


def _first_day(base: str, demo: dict) -> dict:
    """What an operator makes on a first day, through the API (the console pages then show it)."""
    h = {"X-API-Token-ID": demo["pat"]["id"], "X-API-Secret-Key": demo["pat"]["secret"],
         "X-Organization-ID": demo["org_id"]}
    c = httpx.Client(base_url=base, headers=h, timeout=30)
    config = c.post("/v1/configurations", json={"name": "kiosk-app", "spec": {
        "ports": [{"port": 8080}], "workload": WORKLOAD}}).json()["data"]["id"]
    c.post(f"/v1/configurations/{config}/secret-files", json={
        "path": "/var/lib/fleethub/secrets/api-key", "content_base64": "czNjcmV0"})
    fleet = demo["fleet_id"]
    rollout = c.post("/v1/rollouts", json={"fleet_ids": [fleet], "configuration_id": config,
                                           "batch_size": 1}).json()["data"]["id"]
    _wait("the first rollout's end",
          lambda: c.get(f"/v1/rollouts/{rollout}").json()["data"]["state"] in ("completed", "paused", "failed"))
    closed = c.post("/v1/fleets", json={"name": "night-shift", "tags": ["eu"]}).json()["data"]["id"]
    c.put(f"/v1/fleets/{closed}/update-window", json={"enabled": True, "timezone": "Asia/Tokyo",
                                                      "start_time": "03:00", "end_time": "03:01",
                                                      "days_of_week": ["Sunday"]})
    devices = c.get("/v1/devices").json()["data"]
    c.patch(f"/v1/devices/{devices[-1]['id']}", json={"fleet_id": closed, "tags": ["eu"]})
    waiting = c.post("/v1/rollouts", json={"fleet_ids": [closed], "configuration_id": config}).json()["data"]["id"]
    device = devices[0]["id"]
    c.post(f"/v1/devices/{device}/memory-test", json={"impact": "running", "placement": "online", "quick": True})
    return {"device": device, "rollout": rollout, "waiting": waiting}


def _pictures(base: str, demo: dict, made: dict, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    pages = [("devices", "/console/devices", "#devices"), ("device", f"/console/devices/{made['device']}", "#facts"),
             ("rollouts", "/console/rollouts", "#rollouts"), ("rollout", f"/console/rollouts/{made['rollout']}", None),
             ("rollout-waiting", f"/console/rollouts/{made['waiting']}", None), ("fleets", "/console/fleets", None),
             ("configurations", "/console/configurations", None), ("audit", "/console/audit", None),
             ("access", "/console/access", None), ("billing", "/console/billing", None),
             ("assistant", "/console/assistant", None)]
    taken = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(base_url=base, viewport={"width": 1280, "height": 900}, timezone_id="Europe/Berlin")
        page.set_default_timeout(20_000)
        page.goto("/console/signin")
        page.screenshot(path=out / "console-signin.png", full_page=True)
        taken.append(out / "console-signin.png")
        page.fill("#email", demo["admin"]["email"])
        page.fill("#password", demo["admin"]["password"])
        page.click("#signin button[type=submit]")
        page.wait_for_url("**/console/devices")
        for name, path, ready in pages:
            page.goto(path)
            page.wait_for_selector(ready or "main")
            page.wait_for_timeout(1500)  # the pages keep event streams open: no "network idle"
            if name == "assistant":
                page.fill("#chat-form textarea", "Which devices are online?")
                page.click("#chat-form button[type=submit]")
                page.wait_for_selector("#chat li.assistant:not(:empty)")
                page.wait_for_timeout(1000)
            target = out / f"console-{name}.png"
            page.screenshot(path=target, full_page=True)
            taken.append(target)
        browser.close()
    return taken


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/img"), help="where the pictures go (default docs/img)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fleethub-walk-") as data:
        hub = subprocess.Popen([sys.executable, "-m", "hub.cli", "demo", "--port", str(port), "--data-dir", data,
                                "--devices", "3"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        try:
            base = f"http://127.0.0.1:{port}"
            demo = _wait("the demo's demo.json", lambda: json.loads((Path(data) / "demo.json").read_text()), 120)
            _wait("three devices online", lambda: len(httpx.get(f"{base}/v1/devices?online=true", headers={
                "X-API-Token-ID": demo["pat"]["id"], "X-API-Secret-Key": demo["pat"]["secret"],
                "X-Organization-ID": demo["org_id"]}).json()["data"]) >= 3, 120)
            made = _first_day(base, demo)
            for path in _pictures(base, demo, made, args.out):
                print(path)
        finally:
            hub.terminate()
            try:
                hub.wait(30)
            except subprocess.TimeoutExpired:
                hub.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
