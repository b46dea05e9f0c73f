"""Revert in the console (issue 37 item 5): the device page's Revert and the fleet editor's Revert
fleet each start a rollout of the version run before, after a confirmation, and link to it; a device
with nothing to go back to says so."""

from __future__ import annotations

import sys
import time

from tests.browser.conftest import sign_in

HEALTHY_2 = {"command": [sys.executable, "-c", "import time\nwhile True: time.sleep(2)"],
             "healthCheck": {"timeoutSeconds": 2, "graceSeconds": 0.2}}


def _until(console, what, predicate, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if predicate(value):
            return value
        time.sleep(0.2)
    raise AssertionError(f"not reached in {timeout} s: {value}")


def _rolled_out(console, body: dict) -> str:
    r = console.call("POST", "/v1/rollouts", json=body)
    assert r.status_code == 201, r.text
    rid = r.json()["data"]["id"]
    _until(console, lambda: console.call("GET", f"/v1/rollouts/{rid}").json()["data"]["state"],
           lambda st: st == "completed")
    return rid


def _runs(console, dev: str) -> str | None:
    return console.call("GET", f"/v1/devices/{dev}").json()["data"]["configuration"]["applied_version_id"]


def test_revert_a_device_then_its_fleet_from_the_console(page, console):
    cid, fid = console.config_id, console.fleet_id
    v1 = console.call("GET", f"/v1/configurations/{cid}").json()["data"]["version"]["id"]
    _rolled_out(console, {"fleet_id": fid, "config_id": cid, "force": True})
    r = console.call("POST", f"/v1/configurations/{cid}/versions", json={"spec": {"workload": HEALTHY_2}})
    v2 = r.json()["data"]["id"]
    _rolled_out(console, {"fleet_id": fid, "config_id": cid, "force": True})
    one, other = console.devices["line-1-a"], console.devices["line-1-b"]
    assert _runs(console, one) == v2

    sign_in(page, console)
    page.goto(f"/console/devices/{one}")
    page.click("#revert")
    dialog = page.locator("dialog.confirm")
    assert "v1" in dialog.text_content()
    dialog.locator("button", has_text="Revert").click()
    page.locator("#action-status .notice.ok a", has_text="rollout").wait_for()
    _until(console, lambda: _runs(console, one), lambda v: v == v1)
    assert _runs(console, other) == v2

    page.goto("/console/fleets")
    page.locator(f"#fleets tr[data-id='{fid}'] button").click()
    page.click("#fleet-revert")
    page.locator("dialog.confirm button", has_text="Revert").click()
    page.locator("#fleet-revert-block .notice.ok", has_text="Reverting to v1").wait_for()
    _until(console, lambda: _runs(console, other), lambda v: v == v1)

    page.goto(f"/console/devices/{console.devices['lab-unplug']}")
    page.click("#revert")
    page.locator("#action-status .notice.error", has_text="no other version").wait_for()
