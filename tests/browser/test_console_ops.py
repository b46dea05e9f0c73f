"""The operator's pages of issue 37 (items 6, 7, 8, 12) in Chromium against a real hub: a rollout
waiting for its fleet's window says so and until when, in the viewer's time, apart from in progress;
Pause, Resume and Cancel are enabled only where they apply and Cancel asks first; the rollout is named
by its configuration and fleets; the Fleets list shows each window; billing shows used quantities in
the unit they count; a memory test's bar is the share of the planned work, with the time left."""

from __future__ import annotations

import datetime as dt
import re
import time
import uuid
from zoneinfo import ZoneInfo

from actors.machines.memtest import operation
from tests.browser.conftest import sign_in

TOKYO_MINUTE = {"enabled": True, "timezone": "Asia/Tokyo", "start_time": "03:00", "end_time": "03:01",
                "days_of_week": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]}


def local_page(browser, console, zone: str = "America/New_York"):
    context = browser.new_context(base_url=console.base_url, viewport={"width": 1280, "height": 900},
                                  timezone_id=zone, locale="en-US")
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    return context, page, errors


def closed_tokyo_minute(console, fleet_id: str) -> str:
    """A one-minute window at 03:00 Tokyo, closed now (unless this runs in that minute: then 04:00)."""
    window = dict(TOKYO_MINUTE)
    if dt.datetime.now(ZoneInfo("Asia/Tokyo")).strftime("%H") == "03":
        window.update(start_time="04:00", end_time="04:01")
    r = console.call("PUT", f"/v1/fleets/{fleet_id}/update-window", json=window)
    assert r.status_code == 200, r.text
    check = r.json()["data"]["check"]
    assert not check["allowed"]
    return check["next_window_at"]


def buttons(page) -> dict[str, bool]:
    return {verb: page.is_enabled(f"#rollout-{verb}") for verb in ("pause", "resume", "cancel")}


def test_a_rollout_waiting_for_its_window_and_its_controls(browser, console, screenshots):
    context, page, errors = local_page(browser, console)
    try:
        next_at = closed_tokyo_minute(console, console.fleet_id)
        r = console.call("POST", "/v1/rollouts", json={"fleet_ids": [console.fleet_id],
                                                       "configuration_id": console.config_id, "batch_size": 1})
        assert r.status_code == 201, r.text
        rid = r.json()["data"]["id"]
        wait_for_sync(lambda: console.call("GET", f"/v1/rollouts/{rid}").json()["data"]["counts"][
            "QUEUED_MAINTENANCE"] == 1)
        local = dt.datetime.fromisoformat(next_at).astimezone(ZoneInfo("America/New_York"))
        shown = local.strftime("%-I:%M %p")

        sign_in(page, console)
        page.goto("/console/rollouts")
        row = page.locator(f"#rollouts tr[data-id='{rid}']")
        row.wait_for()
        assert "app v1 → line-1" in row.text_content()  # names, not identifiers
        assert "1 device waiting for update window until" in row.text_content() and shown in row.text_content()
        page.screenshot(path=screenshots / "console-rollouts.png", full_page=True)

        page.goto(f"/console/rollouts/{rid}")
        page.locator("#rollout-state", has_text="running").wait_for()
        assert page.text_content("h1") == "Rollout of app v1"
        assert "fleets line-1" in page.text_content("#rollout-summary")
        assert "success threshold 90 % · failure threshold 10 %" in page.text_content("#rollout-summary")
        waiting = page.text_content("#rollout-waiting")
        assert "1 device waiting for update window until" in waiting and shown in waiting
        assert "EST" in waiting or "EDT" in waiting  # the viewer's zone, not UTC
        canary = page.locator("#batches tr").first
        assert canary.locator("td.waiting").text_content() == "1"  # apart from in progress
        assert canary.locator("td.in-progress").text_content() == "0"
        assert page.locator("#rollout-devices td", has_text="waiting for update window until").count() == 1
        assert buttons(page) == {"pause": True, "resume": False, "cancel": True}
        page.screenshot(path=screenshots / "console-rollout.png", full_page=True)

        page.click("#rollout-pause")
        page.locator("#rollout-state", has_text="paused").wait_for()
        assert buttons(page) == {"pause": False, "resume": True, "cancel": True}

        # Cancel asks first; saying no leaves the rollout as it was
        page.click("#rollout-cancel")
        dialog = page.locator("dialog.confirm")
        dialog.wait_for()
        assert "cannot be resumed" in dialog.text_content()
        dialog.locator("button[value=cancel]").click()
        dialog.wait_for(state="detached")
        assert console.call("GET", f"/v1/rollouts/{rid}").json()["data"]["state"] == "paused"
        page.click("#rollout-cancel")
        page.locator("dialog.confirm button[value=ok]").click()
        page.locator("#rollout-state", has_text="cancelled").wait_for()
        assert buttons(page) == {"pause": False, "resume": False, "cancel": False}
    finally:
        console.call("DELETE", f"/v1/fleets/{console.fleet_id}/update-window")
        context.close()
    assert not errors, errors


def wait_for_sync(predicate, timeout: float = 20.0) -> None:
    """Poll the hub from the test's thread (the hub runs in its own), bounded in time."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_fleets_list_shows_each_window(browser, console, screenshots):
    context, page, errors = local_page(browser, console)
    try:
        windowed = console.call("POST", "/v1/fleets", json={"name": f"night-{uuid.uuid4().hex[:6]}"}).json()["data"]
        weekdays = {**TOKYO_MINUTE, "start_time": "22:00", "end_time": "04:00",
                    "days_of_week": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]}
        assert console.call("PUT", f"/v1/fleets/{windowed['id']}/update-window", json=weekdays).status_code == 200
        open_all = console.call("POST", "/v1/fleets", json={"name": f"any-{uuid.uuid4().hex[:6]}"}).json()["data"]
        sign_in(page, console)
        page.goto("/console/fleets")
        cell = page.locator(f"#fleets tr[data-id='{windowed['id']}'] td.window")
        cell.wait_for()
        assert cell.text_content() == "Mon–Fri 22:00–04:00 (Asia/Tokyo)"
        assert page.text_content(f"#fleets tr[data-id='{open_all['id']}'] td.window") == "always"
        page.screenshot(path=screenshots / "console-fleets.png", full_page=True)
    finally:
        context.close()
    assert not errors, errors


def test_billing_shows_each_quantity_in_the_unit_it_counts(page, console, screenshots):
    from hub.billing import state

    hub = console.hub
    org = uuid.UUID(console.org_id)

    async def with_usage() -> None:
        s = hub.services
        await s.stores.billing.put_profile(org, s.clock.now(), plan="standard")
        s.meter.add(org, "tunnel_bytes", 5_034_686, day=s.clock.now().date())
        await state.changed(s, org)

    async def without_profile() -> None:
        s = hub.services
        await s.db.execute("DELETE FROM billing_profiles WHERE org_id = $1", org)
        await state.changed(s, org)

    console.run(with_usage)
    try:
        sign_in(page, console)
        page.goto("/console/billing")
        row = page.locator("#usage-table tr[data-product=tunnel_bytes]")
        row.wait_for()
        assert row.locator("td.used").text_content() == "4.8 MiB"  # bytes, not "5034686 GB"
        assert row.locator("td.billed").text_content() == "0.005 GB"
        audit = page.locator("#usage-table tr[data-product=feature_audit_log]")
        assert audit.locator("td.used").text_content() == "1 day"  # the organisation is new today
        billed = audit.locator("td.billed").text_content()
        assert billed.startswith("0.0") and billed.endswith(" months")
        assert len(billed) <= len("0.0333 months")  # no float noise
        page.screenshot(path=screenshots / "console-billing.png", full_page=True)
    finally:
        console.run(without_profile)


def test_a_read_answered_503_is_asked_again_and_the_page_draws(page, console):
    """The hub answers 503 while its database is unreachable for a moment ("try again shortly"): the
    console asks a GET again (hub/console/static/api.js) instead of leaving the page half-drawn. Here the
    first two reads of the fleets list are answered 503 in the browser's network layer."""
    refused: list[str] = []

    def twice_unavailable(route) -> None:
        if route.request.method == "GET" and len(refused) < 2:
            refused.append(route.request.url)
            route.fulfill(status=503, content_type="application/json",
                          body='{"error": "database_unavailable", "message": "try again shortly"}')
        else:
            route.continue_()

    sign_in(page, console)
    page.route(re.compile(r"/v1/fleets(\?|$)"), twice_unavailable)
    page.goto("/console/fleets")
    page.locator(f"#fleets tr[data-id='{console.fleet_id}']").wait_for()
    assert len(refused) == 2


def test_a_memory_test_bar_is_the_planned_work_with_the_time_left(page, console, screenshots):
    device_id = console.devices["lab-memory"]
    mib = 1 << 20
    # what the device reports three sweeps into a 64 MiB test: every byte touched, 10 s of work left
    status = {"runId": "demo-run", "phase": "testing", "pass": 1, "passes": 1, "pattern": "moving_inversions",
              "testedBytes": 192 * mib, "coverageBytes": 64 * mib, "totalBytes": 64 * mib, "rateBps": 64 * mib,
              "etaSeconds": 10, "errors": 0, "confirmedErrors": 0, "tempMilliC": 48000}

    async def publish() -> None:
        actor = console.hub.services.registry.lookup(("device", uuid.UUID(device_id)))
        actor.publish("device.operation", operation(status))

    sign_in(page, console)
    page.goto(f"/console/devices/{device_id}")
    page.locator("#live", has_text="live").wait_for()
    console.run(publish)
    bar = page.locator("#memtest-bar")
    bar.wait_for()
    assert float(bar.get_attribute("value") or bar.evaluate("b => b.value")) == 0.2308
    text = page.text_content("#memtest-progress")
    assert "Progress23.1 %" in text and "Time left10 s" in text
    assert "Memory covered100 % of 64.0 MiB" in text and "Verified so far192.0 MiB" in text

    # a real run: the result names the memory tested apart from the bytes verified over its sweeps
    page.click("#memtest-run")
    page.locator("#memtest-progress", has_text="pass").wait_for(timeout=60_000)
    result = page.locator("#memtest-results details").first
    result.locator("summary", has_text="pass").wait_for(timeout=30_000)
    facts = result.text_content()
    assert "Memory tested" in facts and "Verified" in facts and "(every pattern and pass)" in facts
    assert float(page.locator("#memtest-bar").evaluate("b => b.value")) == 1.0
    page.screenshot(path=screenshots / "console-device.png", full_page=True)

