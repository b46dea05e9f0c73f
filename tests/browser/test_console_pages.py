"""The console's other pages in Chromium against a real hub (issue 18): fleets and their update
window, configurations (versions, diff, write-only secret files), access (a PAT's secret shown
once), the audit log's filters, billing and the assistant's streamed answer; names where an id was
(issue 37 item 8): the audit log's actors, the relations' objects and subjects, a configuration's
version and fleets."""

from __future__ import annotations

import datetime as dt
import uuid
from zoneinfo import ZoneInfo

from playwright.sync_api import expect

from hub.auth.pat import digest, new_pat
from tests.browser.conftest import sign_in


def test_fleet_window_editor_shows_the_next_opening_in_zone_and_local_time(browser, console, screenshots):
    context = browser.new_context(base_url=console.base_url, viewport={"width": 1280, "height": 900},
                                  timezone_id="America/New_York", locale="en-US")
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    try:
        r = console.call("POST", "/v1/fleets", json={"name": f"window-{uuid.uuid4().hex[:6]}"})
        fleet = r.json()["data"]
        sign_in(page, console)
        page.goto("/console/fleets")
        page.locator(f"#fleets tr[data-id='{fleet['id']}'] button").click()
        form = page.locator("#window-form")
        form.wait_for()
        form.locator("input[name=enabled]").check()
        form.locator("input[name=timezone]").fill("Asia/Tokyo")
        # one minute a day: closed now unless this runs at 03:00 in Tokyo
        form.locator("input[name=start_time]").fill("03:00")
        form.locator("input[name=end_time]").fill("03:01")
        form.locator("button[type=submit]").click()
        page.locator("#window-form .notice.ok").wait_for()
        check = console.call("GET", f"/v1/fleets/{fleet['id']}/update-window/check").json()["data"]
        if check["allowed"]:
            page.locator("#window-check", has_text="allowed now").wait_for()
        else:
            at = dt.datetime.fromisoformat(check["next_window_at"].replace("Z", "+00:00"))
            page.locator("#next-in-zone").wait_for()
            assert "3:00 AM" in page.text_content("#next-in-zone")
            local = at.astimezone(ZoneInfo("America/New_York")).strftime("%-I:%M %p")
            assert local in page.text_content("#next-local")
            assert "America/New_York" in page.text_content("#window-check")
        page.screenshot(path=screenshots / "console-fleets.png", full_page=True)
        # the fleet itself: tags, architecture, description and the registry proxy saved through PATCH
        assert not saved_fleet(console, fleet)["registry_proxy"]
        page.fill("#fleet-form input[name=tags]", "lab, arm")
        page.fill("#fleet-form input[name=architecture]", "aarch64")
        page.fill("#fleet-form textarea[name=description]", "Assembly line 3 <robots>")
        page.check("#fleet-form input[name=registry_proxy]")
        page.select_option("#fleet-form select[name=registry_proxy_mode]", "always")
        page.click("#fleet-form button[type=submit]")
        page.locator("#fleet-form .notice.ok").wait_for()
        saved = saved_fleet(console, fleet)
        assert saved["tags"] == ["lab", "arm"] and saved["architecture"] == "aarch64"
        assert saved["description"] == "Assembly line 3 <robots>" and saved["registry_proxy"] is True
        assert saved["registry_proxy_mode"] == "always"
        page.locator(f"#fleets tr[data-id='{fleet['id']}']", has_text="aarch64").wait_for()
    finally:
        context.close()
    assert not errors, errors


def saved_fleet(console, fleet: dict) -> dict:
    return console.call("GET", f"/v1/fleets/{fleet['id']}").json()["data"]


def test_configuration_versions_diff_and_a_write_only_secret_file(page, console):
    name = f"cfg-{uuid.uuid4().hex[:6]}"
    r = console.call("POST", "/v1/configurations", json={"name": name, "spec": {"workload": {"command": ["a"]}}})
    cid = r.json()["data"]["id"]
    r = console.call("POST", f"/v1/configurations/{cid}/versions", json={"spec": {"workload": {"command": ["b"]}}})
    assert r.status_code == 201, r.text
    sign_in(page, console)
    page.goto("/console/configurations")
    page.locator("#configurations button", has_text=name).click()
    page.locator("#version-diff .dadd").first.wait_for()
    expect(page.locator("#config-facts")).to_have_text("Current version v2 · no fleet uses it")
    fleet = f"uses-{name}"
    assert console.call("POST", "/v1/fleets", json={"name": fleet, "config_id": cid}).status_code == 201
    page.locator("#configurations button", has_text=name).click()
    expect(page.locator("#config-facts")).to_have_text(f"Current version v2 · fleets: {fleet}")
    assert '"b"' in page.locator("#version-diff .dadd").first.text_content()
    assert '"a"' in page.locator("#version-diff .ddel").first.text_content()
    secret = f"only-once-{uuid.uuid4().hex}"
    page.fill("#config-secret-upload input[name=path]", "/etc/app/cfg.key")
    page.set_input_files("#config-secret-upload input[type=file]",
                         files=[{"name": "cfg.key", "mimeType": "text/plain", "buffer": secret.encode()}])
    page.click("#config-secret-upload button[type=submit]")
    page.locator("#config-secret-files", has_text="/etc/app/cfg.key").wait_for()
    assert secret not in page.content()


def test_a_secret_file_s_deliveries_page_past_the_first_hundred(page, console):
    """250 devices on one configuration file, three failed: the page lists them failed first, 100 at a
    time, all 250 with "More", and the failed ones alone when filtered."""
    import hashlib
    import secrets as _secrets

    name = f"fleetwide-{uuid.uuid4().hex[:6]}"
    cid = console.call("POST", "/v1/configurations", json={"name": name, "spec": {}}).json()["data"]["id"]
    r = console.call("POST", f"/v1/configurations/{cid}/secret-files",
                     json={"path": "/etc/app/wide.key", "content_base64": "c2VjcmV0"})
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    ids = [uuid.uuid4() for _ in range(250)]

    async def deliveries() -> None:
        s, now = console.hub.services, dt.datetime.now(dt.timezone.utc)
        await s.db.run(lambda conn: conn.copy_records_to_table(
            "devices", columns=["id", "org_id", "name", "tags", "token_hash", "created_at", "updated_at"],
            records=[(d, uuid.UUID(console.org_id), f"{name}-{i:03}", [],
                      hashlib.sha256(_secrets.token_bytes(16)).digest(), now, now) for i, d in enumerate(ids)]))
        await s.db.execute(
            "INSERT INTO secret_file_deliveries (file_id, device_id, status, error, sha256, updated_at) "
            "SELECT $1, d, CASE WHEN n <= 3 THEN 'failed' ELSE 'pending' END, "
            "       CASE WHEN n <= 3 THEN 'disk full' END, 'x', $3 "
            "FROM unnest($2::uuid[]) WITH ORDINALITY AS t(d, n)", uuid.UUID(fid), ids, now)

    async def cleanup() -> None:
        await console.hub.services.db.execute("DELETE FROM devices WHERE id = ANY($1::uuid[])", ids)

    console.run(deliveries)
    try:
        path = f"/console/api/configurations/{cid}/secret-files"
        assert console.call("GET", f"{path}/{uuid.uuid4()}/devices").status_code == 404
        assert console.call("GET", f"{path}/{fid}/devices", params={"status": "lost"}).status_code == 400
        sign_in(page, console)
        page.goto("/console/configurations")
        page.locator("#configurations button", has_text=name).click()
        box = page.locator(f"#config-secret-files details.per-device[data-file='{fid}']")
        box.locator("summary").click()
        box.locator("li").nth(99).wait_for()
        assert box.locator("li").count() == 100 and "100 of 250" in box.text_content()
        assert [box.locator("li").nth(i).locator(".badge").text_content() for i in range(4)] == \
            ["failed", "failed", "failed", "pending"]
        assert "disk full" in box.locator("li").first.text_content()
        for shown in (200, 250):
            box.locator("button", has_text="More").click()
            box.locator("li").nth(shown - 1).wait_for()
        assert box.locator("li").count() == 250 and box.locator("button", has_text="More").is_hidden()
        box.locator("select[name=status]").select_option("failed")
        expect(box.locator("li")).to_have_count(3)  # not wait_for_function: the CSP has no unsafe-eval
        assert "3 of 3" in box.text_content()
    finally:
        console.run(cleanup)


def test_access_shows_a_new_token_secret_once(page, console):
    sign_in(page, console)
    page.goto("/console/access")
    page.fill("#pat-create input[name=description]", "console test")
    page.click("#pat-create button[type=submit]")
    secret = page.locator("#pat-created code.secret").text_content()
    token_id = page.locator("#pat-created strong").text_content().split()[1].rstrip(":")
    r = console.http.get(console.base_url + "/v1/me", headers={"X-API-Token-ID": token_id, "X-API-Secret-Key": secret})
    assert r.status_code == 200, r.text
    page.locator("#pats", has_text="console test").wait_for()
    page.reload()
    page.locator("#pats", has_text="console test").wait_for()
    assert secret not in page.content()
    page.locator("#members", has_text=console.email).wait_for()


def test_access_names_the_relations_objects_and_subjects(page, console):
    member = console.new_user("member")
    me = console.call("GET", "/v1/me", headers=member).json()["data"]["userId"]
    email = console.run(console.hub.services.db.fetchval, "SELECT email FROM users WHERE id = $1::uuid", me)
    r = console.call("POST", "/v1/relations", json={"object_type": "fleet", "object_id": console.fleet_id,
                                                    "relation": "viewer", "subject_type": "user", "subject_id": me})
    assert r.status_code in (200, 201), r.text
    sign_in(page, console)
    page.goto("/console/access")
    row = page.locator("#relations tr", has_text=email)
    expect(row.locator(".object-name")).to_have_text("line-1")
    assert row.locator(".object-name").get_attribute("title") == console.fleet_id
    assert row.locator(".subject-name").get_attribute("title") == me
    assert me not in row.text_content()


def test_audit_log_names_its_actors(page, console):
    async def user() -> tuple[str, str, dict]:
        s = console.hub.services
        u = await s.stores.orgs.create_user(f"auditor-{uuid.uuid4().hex[:6]}@test.local", s.clock.now())
        await s.stores.orgs.add_member(uuid.UUID(console.org_id), u["id"], "member", s.clock.now())
        pat_id, secret = new_pat()
        await s.stores.tokens.create_pat(pat_id, u["id"], digest(secret), s.clock.now(), description="nightly <b>job</b>")
        return u["email"], str(u["id"]), {"X-API-Token-ID": pat_id, "X-API-Secret-Key": secret,
                                          "X-Organization-ID": console.org_id}

    email, user_id, headers = console.run(user)
    path = f"/v1/fleets/{uuid.uuid4()}"
    assert console.call("GET", path, headers=headers).status_code == 404
    sign_in(page, console)
    page.goto(f"/console/audit?pathPrefix={path}")
    actor = page.locator("#audit tbody td.actor")
    expect(actor).to_have_text(f'{email}, token "nightly <b>job</b>"')  # the description as text, not HTML
    assert user_id in actor.get_attribute("title")


def test_audit_log_filters_by_path_prefix(page, console):
    assert console.call("POST", "/v1/fleets", json={"name": f"audited-{uuid.uuid4().hex[:6]}"}).status_code == 201
    sign_in(page, console)
    page.goto("/console/audit")
    page.fill("#audit-filters input[name=pathPrefix]", "/v1/fleets")
    page.select_option("#audit-filters select[name=method]", "POST")
    def shown() -> tuple[list[str], set[str]]:
        return (page.locator("#audit tbody td code").all_text_contents(),
                set(page.locator("#audit tbody td:nth-child(4)").all_text_contents()))

    # The audit log is written behind, in batches, and the unfiltered first page is on screen until
    # the filtered answer replaces it: apply until the table shows the filtered answer.
    for _ in range(40):
        page.click("#audit-filters button[type=submit]")
        page.wait_for_timeout(250)
        paths, methods = shown()
        if paths and all(p.startswith("/v1/fleets") for p in paths) and methods == {"POST"}:
            break
    paths, methods = shown()
    assert paths and all(p.startswith("/v1/fleets") for p in paths), paths
    assert methods == {"POST"}, methods
    assert "pathPrefix=%2Fv1%2Ffleets" in page.url


def test_billing_page_charts_usage_over_time(page, console):
    """With a billing profile, the page charts each product per day: the last 30 days, today's bar
    showing what was metered today (tunnel minutes and bytes put through the hub's own meter)."""
    import uuid

    from hub.billing import state

    hub = console.hub
    org = uuid.UUID(console.org_id)
    today = hub.services.clock.now().date()

    async def with_usage() -> None:
        s = hub.services
        await s.stores.billing.put_profile(org, s.clock.now(), plan="standard")
        s.meter.add(org, "tunnel_minutes", 12, day=today)
        s.meter.add(org, "tunnel_bytes", 3 * 1024 * 1024, day=today)
        await state.changed(s, org)

    async def without_profile() -> None:  # the other tests of this module see the hub as it was
        s = hub.services
        await s.db.execute("DELETE FROM billing_profiles WHERE org_id = $1", org)
        await state.changed(s, org)

    console.run(with_usage)
    try:
        sign_in(page, console)
        page.goto("/console/billing")
        minutes = page.locator('#usage-daily figure[data-product="tunnel_minutes"]')
        minutes.locator("svg.chart").wait_for()
        assert minutes.locator("rect.bar").count() == 30
        assert minutes.locator("rect.bar title").last.text_content() == f"{today.isoformat()}: 12 minutes"
        assert "12 minutes in all" in minutes.locator("figcaption").text_content()
        moved = page.locator('#usage-daily figure[data-product="tunnel_bytes"] rect.bar title').last
        assert moved.text_content() == f"{today.isoformat()}: 3.0 MiB"
        for product in ("active_device", "tunnel_relayed_bytes", "registry_fallback_bytes"):
            assert page.locator(f'#usage-daily figure[data-product="{product}"] svg.chart').count() == 1
    finally:
        console.run(without_profile)


def test_billing_page_renders_its_sections(page, console):
    sign_in(page, console)
    page.goto("/console/billing")
    # each section shows what its API call answered: the chart or table, or the API's own message
    for section, path, shown in (("#usage", "/v1/billing/usage", "svg.chart"),
                                 ("#usage-daily", "/console/api/usage-daily", "svg.chart"),
                                 ("#registry-fallback", "/v1/billing/registry-fallback", "svg.chart"),
                                 ("#pricing", "/v1/billing/pricing", "table")):
        r = console.call("GET", path)
        if r.status_code == 200:
            page.locator(f"{section} {shown}").wait_for()
        else:
            page.locator(section, has_text=r.json()["message"]).wait_for()
    page.locator("#features li", has_text="telemetry").wait_for()
    on = console.call("GET", "/v1/billing/features").json()["data"]["telemetry"]["enabled"]
    assert ("on" if on else "off") in page.locator("#features li", has_text="telemetry").text_content()


def test_assistant_streams_an_answer(page, console, screenshots):
    sign_in(page, console)
    page.goto("/console/assistant")
    page.fill("#chat-form textarea", "How many devices are online?")
    page.click("#chat-form button[type=submit]")
    answer = page.locator("#chat li.assistant")
    answer.wait_for()
    # functions, not expressions: Playwright evaluates an expression again at every poll, which the
    # CSP without 'unsafe-eval' refuses; a function is evaluated once (the first poll may not be the last)
    page.wait_for_function("() => document.querySelector('#chat li.assistant').textContent.length > 0")
    page.wait_for_function("() => !document.querySelector('#chat-form button[type=submit]').disabled")
    assert page.locator("#chat-form .notice.error").count() == 0
    assert answer.text_content().strip()
    page.screenshot(path=screenshots / "console-assistant.png")


def test_webhooks_page_shows_a_new_secret_once_the_health_and_the_delivery_log(page, console):
    sign_in(page, console)
    page.goto("/console/webhooks")
    # a public address (the page checks nothing itself: the API refuses private ones)
    page.fill("#webhook-url", "https://192.0.32.10/fleethub")
    page.fill("#webhook-types", "io.fleethub.device.state, io.fleethub.rollout.*")
    page.click("#webhook-create button[type=submit]")
    secret = page.locator("#webhook-secret").text_content()
    assert secret.startswith("whsec_")
    [endpoint] = [w for w in console.call("GET", "/v1/webhooks").json()["data"] if w["url"].endswith("/fleethub")]
    assert endpoint["eventTypes"] == ["io.fleethub.device.state", "io.fleethub.rollout.*"]
    row = page.locator(f"#webhooks tr[data-id='{endpoint['id']}']")
    row.wait_for()
    row.get_by_role("button", name="Disable").click()
    row.locator(".badge", has_text="disabled").wait_for()
    assert console.call("GET", f"/v1/webhooks/{endpoint['id']}").json()["data"]["enabled"] is False
    row.get_by_role("link").click()
    page.locator("#webhook-deliveries").wait_for()
    page.reload()
    assert secret not in page.content()  # shown once
    page.locator(f"#webhooks tr[data-id='{endpoint['id']}'] button.danger").click()
    page.locator("dialog.confirm button.danger").click()
    page.locator(f"#webhooks tr[data-id='{endpoint['id']}']").wait_for(state="detached")
