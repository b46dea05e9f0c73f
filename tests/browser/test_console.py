"""The console in Debian's Chromium against a real hub, PostgreSQL and device agents (issue 18).

One hub per module (conftest.py): tests use different devices, so their order does not matter,
except that the rollout's fleet and the unplugged device are each used by one test only.
"""

from __future__ import annotations

import base64
import time
import uuid
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import HEALTHY, PASSWORD, SMALL_MEMORY, sign_in
from device_client.memtest import MemtestConfig
from tests.hubtools import start_agent

XSS = "<img src=x onerror=alert(1)>"


def _no_reload_marker(page) -> None:
    # set on this document only: a reload or navigation would lose it
    page.evaluate("window.__sameDocument = true")


def _same_document(page) -> bool:
    return page.evaluate("window.__sameDocument === true")


def test_root_sends_a_visitor_to_sign_in_and_the_session_to_devices(page, console, screenshots):
    response = page.goto("/")
    assert page.url.endswith("/console/signin?next=") or "/console/signin" in page.url
    csp = response.headers.get("content-security-policy") or page.request.get("/console/signin").headers[
        "content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    page.screenshot(path=screenshots / "console-signin.png")
    page.fill("#email", console.email)
    page.fill("#password", "wrong password")
    page.click("#signin button[type=submit]")
    page.wait_for_selector("#signin .notice.error")
    assert "wrong email or password" in page.text_content("#signin .notice.error")
    # by keyboard alone: the email field has focus, Tab to the password, Enter submits
    page.goto("/console/signin")
    # (expect, not wait_for_function: a string predicate is evaluated in the page, which the console's
    # CSP without 'unsafe-eval' refuses whenever the first check is not already true)
    expect(page.locator("#email")).to_be_focused()
    page.keyboard.type(console.email)
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/devices")
    page.wait_for_selector("#whoami")
    assert page.text_content("#whoami") == console.email
    assert page.locator("#org-switch option").count() >= 1
    page.wait_for_selector("#devices a.device-name")
    assert "line-1-a" in page.text_content("#devices")
    page.goto("/")
    page.wait_for_url("**/console/devices")
    page.click("#sign-out")
    # the sign-in page, by the sign-out's own navigation alone: a request of the devices page still in
    # flight and refused (401) after the logout no longer starts a second one to ?next= (api.js
    # session.leaving), which raced it and aborted one of the two (net::ERR_ABORTED here, 2026-11-29)
    page.wait_for_url(lambda url: urlsplit(url).path == "/console/signin")
    assert urlsplit(page.url).query == "", page.url
    page.goto("/console/devices")
    page.wait_for_url("**/console/signin?next=*")


def test_device_name_is_text_never_html(page, console):
    dev_id, _ = console.run(console.hub.provision, XSS)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    sign_in(page, console)
    page.goto("/console/devices?search=onerror")
    link = page.locator("#devices a.device-name")
    link.wait_for()
    assert link.text_content() == XSS
    assert page.locator("#devices img").count() == 0
    page.goto(f"/console/devices/{dev_id}")
    page.wait_for_selector("#facts dl")
    assert page.text_content("#device-name") == XSS
    assert page.locator("main img").count() == 0
    assert page.title().startswith("Device")
    assert dialogs == []


def test_a_request_without_the_csrf_token_is_refused(page, console):
    sign_in(page, console)
    dev = console.devices["line-1-a"]
    result = page.evaluate("""async ([org, dev]) => {
        const bare = await fetch(`/v1/devices/${dev}/ping`, {method: 'POST', headers: {'X-Organization-ID': org}});
        const s = await (await fetch('/v1/auth/session')).json();
        const withToken = await fetch(`/v1/devices/${dev}/ping`, {method: 'POST',
            headers: {'X-Organization-ID': org, 'X-CSRF-Token': s.data.csrfToken}});
        return [bare.status, (await bare.json()).error, withToken.status];
    }""", [console.org_id, dev])
    assert result == [403, "csrf_required", 200]
    # the console's own ping sends it
    page.goto(f"/console/devices/{dev}")
    page.click("#ping")
    page.wait_for_selector("#action-status .notice.ok")
    assert "round trip" in page.text_content("#action-status")


def test_a_device_goes_offline_in_the_list_without_a_reload(page, console, screenshots):
    sign_in(page, console)
    page.goto("/console/devices?search=lab-unplug")
    row = page.locator("#devices tr[data-id='%s']" % console.devices["lab-unplug"])
    row.locator("td.state", has_text="online").wait_for()
    page.locator("#live", has_text="live").wait_for()
    _no_reload_marker(page)
    console.run(console.agents["lab-unplug"].kill)
    row.locator("td.state", has_text="offline").wait_for(timeout=15_000)
    assert _same_document(page)
    page.goto("/console/devices")
    page.wait_for_selector("#devices a.device-name")
    page.screenshot(path=screenshots / "console-devices.png")
    page.set_viewport_size({"width": 390, "height": 844})
    # phone width: the page itself never scrolls sideways (wide tables scroll in their own box)
    assert page.evaluate("document.documentElement.scrollWidth") <= 392
    page.screenshot(path=screenshots / "console-devices-phone.png")


def test_filters_are_server_side_and_kept_in_the_address(page, console):
    sign_in(page, console)
    page.goto("/console/devices")
    page.wait_for_selector("#devices a.device-name")
    page.select_option("#filters select[name=fleet_id]", console.fleet_id)
    page.wait_for_url("**fleet_id=*")
    page.locator("#page-info", has_text="3 devices").wait_for()
    names = sorted(page.locator("#devices a.device-name").all_text_contents())
    assert names == ["line-1-a", "line-1-b", "line-1-c"]
    page.fill("#filters input[name=search]", "1-b")
    page.press("#filters input[name=search]", "Enter")
    page.locator("#page-info", has_text="1 devices").wait_for()
    page.reload()
    page.locator("#page-info", has_text="1 devices").wait_for()
    assert page.locator("#devices a.device-name").all_text_contents() == ["line-1-b"]


def test_start_a_rollout_and_watch_its_batches_advance(page, console, screenshots):
    sign_in(page, console)
    page.goto("/console/rollouts")
    page.check(f"#rollout-create input[name=fleet][value='{console.fleet_id}']")
    page.select_option("#rollout-config", console.config_id)
    page.fill("#rollout-batch", "1")
    page.click("#rollout-impact")
    page.wait_for_selector("#impact table")
    assert page.locator("#impact tbody td").nth(1).text_content() == "3"  # eligible
    # forced: the confirmation says it bypasses windows; cancelling it creates nothing
    page.check("#rollout-force")
    page.click("#rollout-start")
    dialog = page.locator("dialog.confirm")
    dialog.wait_for()
    assert "bypasses" in dialog.text_content()
    dialog.locator("button", has_text="Cancel").click()
    assert "/console/rollouts/" not in page.url
    page.uncheck("#rollout-force")
    page.screenshot(path=screenshots / "console-rollouts.png")
    page.click("#rollout-start")
    page.wait_for_url("**/console/rollouts/*-*")
    page.locator("#live", has_text="live").wait_for()
    _no_reload_marker(page)
    page.locator("#batches tr").nth(2).wait_for()
    assert "(canary)" in page.locator("#batches tr").first.text_content()
    page.locator("#rollout-state", has_text="completed").wait_for(timeout=60_000)
    assert page.locator("#batches td.succeeded").all_text_contents() == ["1", "1", "1"]
    assert _same_document(page)  # the stream moved it, not a reload
    page.screenshot(path=screenshots / "console-rollout.png", full_page=True)


def test_live_quick_memory_test_shows_progress_and_result(page, console, screenshots):
    sign_in(page, console)
    page.goto(f"/console/devices/{console.devices['lab-memory']}")
    page.locator("#live", has_text="live").wait_for()
    assert page.is_checked("#memtest-start input[value=quick]")
    page.click("#memtest-run")
    page.wait_for_selector("#memtest-progress .progress")
    # the outcome comes over the device stream; the results table is read again then
    page.locator("#memtest-progress", has_text="pass").wait_for(timeout=60_000)
    try:
        page.locator("#memtest-results details summary", has_text="pass").first.wait_for(timeout=30_000)
    except Exception:
        raise AssertionError(page.text_content("#main")) from None
    assert "verdict ok" in page.locator("#memtest-results details summary").first.text_content()
    assert page.locator("#events li code.kind", has_text="device.operation").count() >= 1
    page.screenshot(path=screenshots / "console-device.png", full_page=True)


def test_secret_file_upload_reaches_the_device_and_is_never_shown(page, console):
    secret = f"s3cret-{time.monotonic_ns()}"
    sign_in(page, console)
    page.goto(f"/console/devices/{console.devices['line-1-c']}")
    page.wait_for_selector("#secret-files")
    page.fill("#secret-upload input[name=path]", "/etc/app/console.key")
    page.fill("#secret-upload textarea[name=content]", secret)
    page.click("#secret-upload button[type=submit]")
    row = page.locator("#secret-files tr[data-path='/etc/app/console.key']")
    row.locator("td.delivery", has_text="on_device").wait_for(timeout=30_000)
    assert secret not in page.content()
    assert page.input_value("#secret-upload textarea[name=content]") == ""


@pytest.mark.parametrize("path", ["/console/devices/not-a-uuid", "/console/nope"])
def test_unknown_console_pages_are_404(console, path):
    r = console.http.get(console.base_url + path)
    assert r.status_code == 404


def _org_streams(console) -> int:
    async def count() -> int:
        return len(console.hub.services.events._topics.get(("org", uuid.UUID(console.org_id)), ()))
    return console.run(count)


def _set_hidden(page, hidden: bool) -> None:
    page.evaluate("""(hidden) => {
        Object.defineProperty(document, 'visibilityState', {value: hidden ? 'hidden' : 'visible', configurable: true});
        document.dispatchEvent(new Event('visibilitychange'));
    }""", hidden)


def test_a_hidden_tab_lets_its_stream_go_and_catches_up_when_shown(page, console):
    # Over HTTP/1.1 a browser holds at most 6 connections to the hub: streams of background tabs
    # would starve the visible one. A hidden tab closes its stream; shown again, it reads its rows.
    name = f"lab-hide-{time.monotonic_ns()}"

    async def linked():
        dev_id, token = await console.hub.provision(name)
        running = await start_agent(console.extra["nursery"], console.base_url, token, console.extra["root"] / name)
        return dev_id, running

    dev_id, running = console.run(linked)
    sign_in(page, console)
    page.goto(f"/console/devices?search={name}")
    row = page.locator(f"#devices tr[data-id='{dev_id}']")
    row.locator("td.state", has_text="online").wait_for()
    page.locator("#live", has_text="live").wait_for()
    before = _org_streams(console)
    _no_reload_marker(page)
    _set_hidden(page, True)
    page.locator("#live", has_text="paused while hidden").wait_for()
    deadline = time.monotonic() + 10
    while _org_streams(console) >= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _org_streams(console) == before - 1
    console.run(running.kill)
    deadline = time.monotonic() + 15
    while console.call("GET", f"/v1/devices/{dev_id}").json()["data"]["online"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "online" in row.locator("td.state").text_content()  # no stream, no change while hidden
    _set_hidden(page, False)
    row.locator("td.state", has_text="offline").wait_for()
    page.locator("#live", has_text="live").wait_for()
    assert _org_streams(console) == before and _same_document(page)


def test_a_dropped_stream_resumes_from_its_last_event_id(page, console):
    # The console's stream client reconnects as EventSource does (issue 33): with the last id it saw
    # as Last-Event-ID, so the hub replays what it missed instead of leaving a gap.
    name = f"lab-resume-{time.monotonic_ns()}"

    async def linked():
        dev_id, token = await console.hub.provision(name)
        running = await start_agent(console.extra["nursery"], console.base_url, token, console.extra["root"] / name)
        return dev_id, running

    dev_id, running = console.run(linked)
    asked: list[dict[str, str]] = []
    page.on("request", lambda req: asked.append(req.headers) if "/console/api/events" in req.url else None)
    sign_in(page, console)
    page.goto(f"/console/devices?search={name}")
    row = page.locator(f"#devices tr[data-id='{dev_id}']")
    row.locator("td.state", has_text="online").wait_for()
    page.locator("#live", has_text="live").wait_for()
    first = len(asked)
    assert first >= 1 and "last-event-id" not in asked[-1]  # a first connection starts from a snapshot
    _no_reload_marker(page)

    async def drop_org_streams() -> None:  # as the hub drops a stream that fell behind
        for sub in list(console.hub.services.events._topics.get(("org", uuid.UUID(console.org_id)), ())):
            sub.dropped = True
            sub.close()
    console.run(drop_org_streams)
    deadline = time.monotonic() + 15
    while len(asked) == first and time.monotonic() < deadline:
        page.wait_for_timeout(50)  # Playwright's events are delivered while it waits, not in a sleep
    assert len(asked) > first, "the console did not reconnect its stream"
    assert asked[first].get("last-event-id", "").isdigit(), asked[first]
    page.locator("#live", has_text="live").wait_for()
    console.run(running.kill)  # what happens after the resume still reaches the page
    row.locator("td.state", has_text="offline").wait_for()
    assert _same_document(page)


def test_bulk_assign_then_reboot_and_the_configuration_file_reaches_each_device(page, console):
    tag = f"bulk{time.monotonic_ns()}"

    async def linked(name: str) -> str:
        dev_id, token = await console.hub.provision(name)
        await start_agent(console.extra["nursery"], console.base_url, token, console.extra["root"] / name)
        return dev_id

    ids = [console.run(linked, f"{tag}-{i}") for i in range(2)]
    r = console.call("POST", "/v1/configurations", json={"name": tag, "spec": {"workload": HEALTHY}})
    config_id = r.json()["data"]["id"]
    r = console.call("POST", f"/v1/configurations/{config_id}/secret-files",
                     json={"path": "/etc/app/bulk.key", "content_base64": base64.b64encode(b"bulk").decode()})
    assert r.status_code == 201, r.text
    sign_in(page, console)
    page.goto(f"/console/devices?search={tag}")
    page.locator("#page-info", has_text="2 devices").wait_for()
    page.check("#devices thead input[type=checkbox]")
    page.select_option("#bulk-config", config_id)
    page.click("#bulk-assign")
    page.locator("#devices-status .notice.ok", has_text="Assign: 2 of 2 done.").wait_for()
    for dev_id in ids:
        assert console.call("GET", f"/v1/devices/{dev_id}").json()["data"]["configuration"]["config_id"] == config_id
    page.goto(f"/console/devices/{ids[0]}")
    row = page.locator("#secret-files tr[data-from='configuration'][data-path='/etc/app/bulk.key']")
    for _ in range(60):  # the configuration (and its file) is applied by the agent: look again until it is
        if "on_device" in (row.locator("td.delivery").text_content(timeout=15_000) or ""):
            break
        page.wait_for_timeout(500)
        page.reload()
    assert "on_device" in row.locator("td.delivery").text_content()
    page.goto(f"/console/devices?search={tag}")
    page.locator("#page-info", has_text="2 devices").wait_for()
    page.check("#devices thead input[type=checkbox]")
    page.click("#bulk-reboot")
    page.locator("dialog.confirm button", has_text="Reboot").click()
    page.locator("#devices-status .notice.ok", has_text="Reboot: 2 of 2 done.").wait_for()


def test_a_faulty_device_shows_its_errors_table_memory_fault_and_diagnosis(page, console, screenshots):
    name = f"lab-faulty-{time.monotonic_ns()}"

    async def linked():
        dev_id, token = await console.hub.provision(name)
        await start_agent(console.extra["nursery"], console.base_url, token, console.extra["root"] / name,
                          memtest=MemtestConfig(budget=1 << 20, chunk_words=1 << 13, fault="data_line"))
        return dev_id

    dev_id = console.run(linked)
    sign_in(page, console)
    page.goto(f"/console/devices/{dev_id}")
    page.locator("#live", has_text="live").wait_for()
    page.click("#memtest-run")  # Live Quick, the default
    summary = page.locator("#memtest-results details summary", has_text="fail").first
    summary.wait_for(timeout=90_000)
    assert "verdict data_line" in summary.text_content()
    errors = page.locator("#memtest-results table.errors tbody tr")
    assert errors.count() >= 1
    assert errors.first.locator("td").first.text_content()  # the physical address
    page.locator("#device-state .badge", has_text="Memory fault").wait_for(timeout=15_000)
    page.locator("#diagnosis li[data-code='MemoryFault']", has_text="critical").wait_for()
    page.locator("#h-mem").scroll_into_view_if_needed()
    page.screenshot(path=screenshots / "console-device-memory-fault.png")  # the viewport: the table is long


def test_a_test_boot_starts_from_the_signed_in_console_after_a_confirmation(page, console):
    name = f"lab-boot-{time.monotonic_ns()}"

    async def linked():
        dev_id, token = await console.hub.provision(name)
        await start_agent(console.extra["nursery"], console.base_url, token, console.extra["root"] / name,
                          memtest=MemtestConfig(budget=SMALL_MEMORY, chunk_words=1 << 13))
        return dev_id

    dev_id = console.run(linked)
    # an API token may not start one (spec: operator_required); the signed-in console may
    r = console.call("POST", f"/v1/devices/{dev_id}/memory-test", json={"impact": "stopped", "placement": "offline"})
    assert r.status_code == 403 and r.json()["error"] == "operator_required", r.text
    sign_in(page, console)
    page.goto(f"/console/devices/{dev_id}")
    page.locator("#live", has_text="live").wait_for()
    boot = page.locator("#memtest-start input[value=boot]")
    boot.wait_for()
    assert boot.is_enabled()
    boot.check()
    page.click("#memtest-run")
    dialog = page.locator("dialog.confirm")
    dialog.wait_for()
    assert "reboots" in dialog.text_content()
    dialog.locator("button", has_text="Reboot and test").click()
    page.locator("#memtest-start ~ div .notice.ok", has_text="Started run").wait_for()
