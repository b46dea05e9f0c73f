"""A rejected configuration in the console (issue 37 items 3 and 4): the device page shows what the
health check printed, the device list shows each device's configuration status with the version's
number and filters by it, and a rejected device does not look healthy."""

from __future__ import annotations

import sys
import time

from tests.browser.conftest import sign_in

FAILING_CHECK = {"command": [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
                 "healthCheck": {"command": [sys.executable, "-c", "print('<b>db unreachable</b>'); raise SystemExit(1)"],
                                 "timeoutSeconds": 2, "graceSeconds": 0.2}}


def _rejected(console, dev: str) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        conf = console.call("GET", f"/v1/devices/{dev}").json()["data"]["configuration"]
        if conf["status"] == "rejected":
            return conf
        time.sleep(0.2)
    raise AssertionError(f"the device did not reject the version: {conf}")


def test_a_rejected_device_shows_why_and_the_list_filters_by_configuration_status(page, console, screenshots):
    r = console.call("POST", "/v1/configurations", json={"name": "broken-db", "spec": {"workload": FAILING_CHECK}})
    assert r.status_code == 201, r.text
    dev = console.devices["line-1-a"]
    r = console.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": r.json()["data"]["id"]})
    assert r.status_code == 202, r.text
    assert _rejected(console, dev)["check_output"] == "<b>db unreachable</b>"

    sign_in(page, console)
    page.goto(f"/console/devices/{dev}")
    # the device's words as text, never as markup
    page.locator("#configuration pre.check-output", has_text="<b>db unreachable</b>").wait_for()
    assert page.locator("#configuration pre.check-output b").count() == 0
    page.locator("#device-state .config-status", has_text="rejected v1").wait_for()
    page.screenshot(path=screenshots / "console-device-rejected.png", full_page=True)

    page.goto("/console/devices")
    row = page.locator(f"#devices tr[data-id='{dev}']")
    row.locator("td.config .badge.bad", has_text="rejected v1").wait_for()
    page.select_option("#filters select[name=config_status]", "rejected")
    page.wait_for_url("**config_status=rejected*")
    page.locator("#page-info", has_text="1 devices").wait_for()
    assert page.locator("#devices a.device-name").all_text_contents() == ["line-1-a"]
    page.screenshot(path=screenshots / "console-devices-rejected.png")
