"""An operator's first day in the console (issue 37 items 15, 9 and 8), in Chromium against a real hub
and real agents: an empty list says how to add a device; adding one shows its token once inside the
command to run, and an agent started with that token links; rename, tag, move and delete; the device
page's facts with units and names instead of ids; inviting a member, who accepts and joins."""

from __future__ import annotations

import re
import uuid

import trio
from playwright.sync_api import expect

from tests.browser.conftest import PASSWORD, sign_in
from tests.hubtools import start_agent


def _new_context(browser, console):
    context = browser.new_context(base_url=console.base_url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    return context, page, errors


def _person(console, *, org: bool) -> str:
    """A person who signs in with PASSWORD: admin of a new, empty organisation, or of none."""
    from hub.auth.passwords import hash_password

    async def make() -> str:
        s = console.hub.services
        email = f"person-{uuid.uuid4().hex[:6]}@test.local"
        digest = await trio.to_thread.run_sync(hash_password, PASSWORD)
        user = await s.stores.orgs.create_user(email, s.clock.now(), password_hash=digest)
        if org:
            new = await s.stores.orgs.create_org(f"Empty {email[:13]}", s.clock.now())
            await s.stores.orgs.add_member(new["id"], user["id"], "admin", s.clock.now())
        return email

    return console.run(make)


def _sign_in_as(page, email: str) -> None:
    page.goto("/console/signin")
    page.fill("#email", email)
    page.fill("#password", PASSWORD)
    page.click("#signin button[type=submit]")
    page.wait_for_url("**/console/devices")


def test_an_empty_device_list_says_how_to_add_one(browser, console, screenshots):
    context, page, errors = _new_context(browser, console)
    try:
        _sign_in_as(page, _person(console, org=True))
        hint = page.locator("#devices-empty")
        hint.wait_for()
        assert "No devices yet" in hint.text_content()
        command = hint.locator("code.command").text_content()
        assert command == f"fleethub agent --hub {console.base_url} --token <device token> --data-dir /var/lib/fleethub"
        page.screenshot(path=screenshots / "console-devices-empty.png")
        hint.locator("button", has_text="Add device").click()
        expect(page.locator("#add-device-form input[name=name]")).to_be_focused()
        # a filter that matches nothing is not an empty organisation
        page.goto("/console/devices?search=nothing-like-this")
        page.locator("#devices td", has_text="No devices match.").wait_for()
        assert page.locator("#devices-empty").count() == 0
    finally:
        context.close()
    assert not errors, errors


def test_adding_a_device_shows_its_token_once_in_the_command_and_an_agent_links_with_it(page, console, screenshots):
    sign_in(page, console)
    page.goto("/console/devices")
    page.click("#add-device-open")
    page.fill("#add-device-form input[name=name]", "kiosk-17")
    page.select_option("#add-device-form select[name=fleet_id]", label="line-1")
    page.fill("#add-device-form input[name=tags]", "eu, kiosk")
    page.click("#add-device-form button[type=submit]")
    shown = page.locator("#device-token code.command")
    shown.wait_for()
    command = shown.text_content()
    match = re.fullmatch(rf"fleethub agent --hub {re.escape(console.base_url)} --token (dev_\S+) "
                         r"--data-dir /var/lib/fleethub", command)
    assert match, command
    token = match.group(1)
    assert page.locator("#copy-command").is_visible()
    page.locator("#devices a.device-name", has_text="kiosk-17").wait_for()  # the list reloaded behind it
    page.screenshot(path=screenshots / "console-device-added.png")
    created = next(d for d in console.call("GET", "/v1/devices?search=kiosk-17").json()["data"])
    assert created["tags"] == ["eu", "kiosk"] and created["fleet_id"] == console.fleet_id

    # the token in the command is the device's: an agent started with it links
    running = console.run(start_agent, console.extra["nursery"], console.base_url, token,
                          console.extra["root"] / "kiosk-17")
    assert running.agent.device_id == created["id"]

    # shown once: Done takes it off the page, and nothing brings it back
    page.click("#add-device-done")
    assert token not in page.content()
    page.reload()
    page.locator("#devices a.device-name", has_text="kiosk-17").wait_for()
    assert token not in page.content()
    page.goto(f"/console/devices/{created['id']}")
    page.locator("#device-name", has_text="kiosk-17").wait_for()
    assert token not in page.content()
    console.run(running.kill)


def test_rename_tag_move_and_delete_a_device(page, console):
    r = console.call("POST", "/v1/devices", json={"name": "to-edit"})
    dev = r.json()["data"]
    sign_in(page, console)
    page.goto(f"/console/devices/{dev['id']}")
    page.locator("#device-name", has_text="to-edit").wait_for()
    assert page.input_value("#device-edit select[name=fleet_id]") == ""
    page.fill("#device-edit input[name=name]", "edited <b>name</b>")
    page.fill("#device-edit input[name=tags]", "lab, arm , ")
    page.select_option("#device-edit select[name=fleet_id]", label="line-1")
    page.click("#device-edit button[type=submit]")
    page.locator("#edit-status .notice.ok").wait_for()
    saved = console.call("GET", f"/v1/devices/{dev['id']}").json()["data"]
    assert saved["name"] == "edited <b>name</b>" and saved["tags"] == ["lab", "arm"]
    assert saved["fleet_id"] == console.fleet_id
    assert page.text_content("#device-name") == "edited <b>name</b>"
    # the fleet by its name, not its id
    facts = page.text_content("#facts")
    assert "line-1" in facts and console.fleet_id not in facts
    # moved out of the fleet again
    page.select_option("#device-edit select[name=fleet_id]", value="")
    page.click("#device-edit button[type=submit]")
    page.locator("#facts dd", has_text="none").wait_for()  # painted from the PATCH's answer
    assert console.call("GET", f"/v1/devices/{dev['id']}").json()["data"]["fleet_id"] is None

    page.click("#device-delete")
    page.click("dialog.confirm button.danger")
    page.wait_for_url("**/console/devices**")
    page.locator("#devices-status", has_text="is deleted").wait_for()
    assert console.call("GET", f"/v1/devices/{dev['id']}").status_code == 404


def test_the_device_page_shows_facts_with_units_and_names_not_ids(page, console, screenshots):
    dev_id = console.devices["line-1-a"]
    r = console.call("PUT", f"/v1/devices/{dev_id}/configuration", json={"configId": console.config_id})
    assert r.status_code in (200, 202), r.text
    sign_in(page, console)
    page.goto(f"/console/devices/{dev_id}")
    facts = page.locator("#facts")
    facts.locator("dd", has_text="%").first.wait_for()
    text = facts.text_content()
    device = console.call("GET", f"/v1/devices/{dev_id}").json()["data"]
    assert device["agent_version"] and device["agent_version"] in text
    for label in ("Agent version", "Uptime", "CPU", "Memory", "Disk", "Facts as of"):
        assert label in text, label
    assert re.search(r"Memory\d+\.\d % of [\d.]+ [KMGT]iB", text), text
    assert re.search(r"Uptime(\d+ d \d+ h|\d+ h \d+ min|\d+ min)", text), text
    for address in device["system"]["ip_addresses"]:
        page.locator("#ip-addresses li", has_text=address).wait_for()
    config = page.locator("#configuration")
    config.locator("dd a", has_text="app").wait_for()
    assert config.locator("dd a").first.text_content() == "app"
    config.locator("dd", has_text="v1").first.wait_for()
    assert console.config_id not in config.text_content() and console.fleet_id not in text
    page.screenshot(path=screenshots / "console-device-facts.png", full_page=True)
    # the list names the configuration too, beside its status
    page.goto("/console/devices?search=line-1-a")
    cell = page.locator(f"#devices tr[data-id='{dev_id}'] td.config")
    cell.locator(".config-name", has_text="app").wait_for()
    assert console.config_id not in cell.text_content()


def test_inviting_a_member_says_what_they_do_next_and_they_join(browser, page, console, screenshots):
    invitee = _person(console, org=False)
    sign_in(page, console)
    page.goto("/console/access")
    page.fill("#invite input[name=email]", invitee)
    page.select_option("#invite select[name=role]", "admin")
    page.click("#invite button[type=submit]")
    result = page.locator("#invite-result .notice.ok")
    result.wait_for()
    said = result.text_content()
    assert f"{invitee} is invited as admin" in said and "sign in" in said and "accept" in said
    assert f"{console.base_url}/console/" in said
    page.locator("#invitations td", has_text=invitee).wait_for()
    page.screenshot(path=screenshots / "console-access.png", full_page=True)

    # the invitee, who belongs to no organisation, sees the invitation first and joins with Accept
    context, other, errors = _new_context(browser, console)
    try:
        _sign_in_as(other, invitee)
        other.locator("#my-invitations li", has_text="Test Org").wait_for()
        other.click("#my-invitations button")
        other.wait_for_url("**/console/devices")
        other.locator("#devices a.device-name").first.wait_for()
    finally:
        context.close()
    assert not errors, errors
    page.reload()
    page.locator("#members td", has_text=invitee).wait_for()
    assert page.locator("#invitations td", has_text=invitee).count() == 0


def test_the_device_page_shows_a_container_image_arriving(page, console):
    """Issue 36 item 2: the device's pull progress (container.pull_progress, then container.pulled), as
    its agent sends them, shown on the device page while they come."""
    dev_id = console.devices["line-1-b"]
    sign_in(page, console)
    page.goto(f"/console/devices/{dev_id}")
    page.locator("#facts").wait_for()
    page.wait_for_timeout(500)  # the page's event stream is open

    async def tell(kind: str, payload: dict) -> None:
        actor = console.hub.services.registry.lookup(("device", uuid.UUID(dev_id)))
        actor.publish(f"device.event.{kind}", payload)

    image = "127.0.0.1:5000/shop/web@sha256:" + "a" * 64
    console.run(tell, "container.pull_progress", {"container": "web", "image": image, "bytes": 12 << 20,
                                                  "seconds": 3.0, "rateBps": 4 << 20})
    expect(page.locator("#pulls li")).to_have_text("Pulling web: 12.0 MiB so far, 4.0 MiB/s")
    console.run(tell, "container.pulled", {"container": "web", "image": image, "bytes": 24 << 20,
                                           "seconds": 6.2, "via": "proxy"})
    expect(page.locator("#pulls li")).to_have_text("Pulled web: 24.0 MiB in 6 s (from the proxy)")
