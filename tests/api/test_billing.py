"""Billing endpoints against a real hub: profiles and prices from ``fleethub admin``, the 404/409/403/
400/401/402/503 answers, feature entitlements with their visible effects (telemetry events from real
agents, the audit log gate) and what a billing lock blocks."""

from __future__ import annotations

import uuid

import trio

from hub.billing.devices import telemetry_counts
from tests.api.billing_helpers import admin, bearer
from tests.hubtools import assert_error, start_agent, start_hub, wait_for


def pat_headers(pat, org_id) -> dict:
    return {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1], "X-Organization-ID": org_id}


async def test_without_a_billing_profile(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        assert_error(await hub.call("GET", "/v1/billing/pricing"), 404, "billing_profile_not_found")
        assert_error(await hub.call("GET", "/v1/billing/usage"), 404, "billing_profile_not_found")
        assert_error(await hub.call("GET", "/console/api/usage-daily"), 404, "billing_profile_not_found")
        assert_error(await hub.call("PUT", "/v1/billing/features/telemetry", json={"enabled": True}), 409,
                     "no_billing_profile")
        # the features view is always there, with every key
        r = await hub.call("GET", "/v1/billing/features")
        assert r.status_code == 200, r.text
        assert r.json()["data"] == {
            "telemetry": {"enabled": False, "self_serve": True, "enterprise": False},
            "signature_policy": {"enabled": False, "self_serve": False, "enterprise": False},
            "usb_policy": {"enabled": False, "self_serve": False, "enterprise": False},
            "audit_log": {"enabled": True, "self_serve": False, "enterprise": False}}
        r = await hub.call("GET", "/v1/billing/registry-fallback")
        assert r.status_code == 200 and r.json()["data"]["totals"]["bytes"] == 0


async def test_pricing_shows_the_price_in_effect_now_or_null(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        out = await admin(hub, tmp_path, "billing-profile", hub.org_id, "--plan", "pro")
        assert out["plan"] == "pro" and out["anchor_day"] == 1 and out["locked"] is False
        await admin(hub, tmp_path, "price", "tunnel_minutes", "0.10", "--from", "2020-01-01")
        await admin(hub, tmp_path, "price", "tunnel_minutes", "0.07", "--org", hub.org_id, "--from", "2021-01-01")
        await admin(hub, tmp_path, "price", "tunnel_minutes", "9.99", "--from", "2999-01-01")  # not yet
        await admin(hub, tmp_path, "price", "active_device", "3", "--from", "2020-01-01")
        other = await hub.services.stores.orgs.create_org("Other", hub.services.clock.now())
        await admin(hub, tmp_path, "price", "active_device", "1", "--org", str(other["id"]), "--from", "2020-01-01")
        r = await hub.call("GET", "/v1/billing/pricing")
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert data["currency"] == "USD" and data["plan"] == "pro"
        by = {p["product"]: p for p in data["products"]}
        assert by["tunnel_minutes"]["unit_price"] == 0.07 and by["tunnel_minutes"]["source"] == "override"
        assert by["active_device"]["unit_price"] == 3 and by["active_device"]["source"] == "list"
        assert by["active_device"]["unit"] == "device_month"
        assert by["tunnel_bytes"]["unit_price"] is None and by["tunnel_bytes"]["source"] is None
        assert {"feature_telemetry", "registry_fallback_bytes", "assistant_prompt_tokens"} <= set(by)
        listed = await admin(hub, tmp_path, "prices", "--org", hub.org_id)
        assert {(p["product"], p["unit_price"]) for p in listed["prices"]} == {
            ("tunnel_minutes", "0.10"), ("tunnel_minutes", "0.07"), ("tunnel_minutes", "9.99"), ("active_device", "3")}


async def test_feature_changes_need_billing_admin_and_only_telemetry_is_self_serve(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        await admin(hub, tmp_path, "billing-profile", hub.org_id, "--plan", "pro")
        member = pat_headers(await hub.new_user("member"), hub.org_id)
        assert_error(await hub.call("GET", "/v1/billing/features", headers=member), 403)
        assert_error(await hub.call("GET", "/v1/billing/usage", headers=member), 403)
        user_id = (await hub.call("GET", "/v1/me", headers=member)).json()["data"]["userId"]
        grant = {"object_type": "organization", "object_id": hub.org_id, "relation": "billing_viewer",
                 "subject_type": "user", "subject_id": user_id}
        assert (await hub.call("POST", "/v1/relations", json=grant)).status_code == 201
        assert (await hub.call("GET", "/v1/billing/features", headers=member)).status_code == 200
        assert (await hub.call("GET", "/v1/billing/pricing", headers=member)).status_code == 200
        assert (await hub.call("GET", "/v1/billing/registry-fallback", headers=member)).status_code == 200
        assert_error(await hub.call("PUT", "/v1/billing/features/telemetry", headers=member,
                                    json={"enabled": True}), 403)
        assert (await hub.call("POST", "/v1/relations", json={**grant, "relation": "billing_admin"})).status_code == 201
        r = await hub.call("PUT", "/v1/billing/features/telemetry", headers=member, json={"enabled": True})
        assert r.status_code == 200, r.text
        assert r.json()["data"]["telemetry"]["enabled"] is True
        assert (await hub.call("GET", "/v1/billing/features")).json()["data"]["telemetry"]["enabled"] is True

        for feature in ("signature_policy", "usb_policy", "audit_log"):
            assert_error(await hub.call("PUT", f"/v1/billing/features/{feature}", json={"enabled": True}), 400,
                         "feature_not_self_serve")
        assert_error(await hub.call("PUT", "/v1/billing/features/free_lunch", json={"enabled": True}), 400,
                     "unknown_feature")
        for bad in ({"enabled": "yes"}, {"enabled": 1}, {}, {"enabled": True, "extra": 1}):
            assert_error(await hub.call("PUT", "/v1/billing/features/telemetry", json=bad), 400)
        assert_error(await hub.call("PUT", "/v1/billing/features/telemetry", content=b"not json"), 400)
        # an enterprise account has the enterprise features; operators switch them
        await admin(hub, tmp_path, "billing-profile", hub.org_id, "--enterprise")
        view = (await hub.call("GET", "/v1/billing/features")).json()["data"]
        assert view["signature_policy"] == {"enabled": True, "self_serve": False, "enterprise": True}
        await admin(hub, tmp_path, "feature", hub.org_id, "usb_policy", "--off")
        view = (await hub.call("GET", "/v1/billing/features")).json()["data"]
        assert view["usb_policy"]["enabled"] is False and view["signature_policy"]["enabled"] is True


async def test_telemetry_switch_starts_and_stops_agents_telemetry(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path, heartbeat_interval=0.2)
        s, org = hub.services, uuid.UUID(hub.org_id)
        await admin(hub, tmp_path, "billing-profile", hub.org_id, "--plan", "pro")
        _, token = await hub.provision("t1")
        first = (await start_agent(nursery, hub.base_url, token, tmp_path / "a1")).agent
        first.telemetry.configure(interval=0.05)
        await trio.sleep(0.5)
        assert first.telemetry.enabled is False and first.telemetry.sent == 0
        assert telemetry_counts(s)[org] == 0

        r = await hub.call("PUT", "/v1/billing/features/telemetry", json={"enabled": True})
        assert r.status_code == 200, r.text
        await wait_for(lambda: first.telemetry.enabled and telemetry_counts(s)[org] >= 3)
        # a device linking while telemetry is on is told at link time
        _, token2 = await hub.provision("t2")
        second = (await start_agent(nursery, hub.base_url, token2, tmp_path / "a2")).agent
        second.telemetry.configure(interval=0.05)
        await wait_for(lambda: second.telemetry.enabled and second.telemetry.sent >= 2)

        r = await hub.call("PUT", "/v1/billing/features/telemetry", json={"enabled": False})
        assert r.status_code == 200 and r.json()["data"]["telemetry"]["enabled"] is False
        await wait_for(lambda: not first.telemetry.enabled and not second.telemetry.enabled)
        await trio.sleep(0.3)  # an event already on the wire may still land
        counted, sent = telemetry_counts(s)[org], first.telemetry.sent + second.telemetry.sent
        await trio.sleep(0.5)
        assert telemetry_counts(s)[org] == counted and first.telemetry.sent + second.telemetry.sent == sent
        # the setting survives on the device
        assert '"enabled": false' in (tmp_path / "a1" / "telemetry.json").read_text()


async def test_audit_log_entitlement_gates_the_audit_events_endpoint(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        assert (await hub.call("GET", "/v1/audit-events")).status_code == 200
        await admin(hub, tmp_path, "feature", hub.org_id, "audit_log", "--off")
        assert_error(await hub.call("GET", "/v1/audit-events"), 403, "feature_disabled")
        await admin(hub, tmp_path, "feature", hub.org_id, "audit_log", "--on")
        r = await hub.call("GET", "/v1/audit-events", params={"limit": 1000})
        assert r.status_code == 200
        # calls made while reading was off were still recorded
        statuses = [e["status"] for e in r.json()["data"] if e["path"] == "/v1/audit-events"]
        assert 403 in statuses


async def test_a_billing_lock_keeps_reads_and_blocks_feature_changes(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        await admin(hub, tmp_path, "billing-profile", hub.org_id, "--plan", "pro", "--locked")
        r = await hub.call("GET", "/v1/billing/pricing")
        assert r.status_code == 200 and r.json()["data"]["locked"] is True
        r = await hub.call("GET", "/v1/billing/usage")
        assert r.status_code == 200 and r.json()["data"]["locked"] is True
        assert (await hub.call("GET", "/v1/billing/features")).status_code == 200
        # the spec's statuses for this endpoint: 200, 400, 403, 409 (issue 31 item 14: it was a 402)
        assert_error(await hub.call("PUT", "/v1/billing/features/telemetry", json={"enabled": True}), 409,
                     "billing_locked")
        # nothing else of the API is blocked by a lock (docs/billing.md)
        assert (await hub.call("POST", "/v1/fleets", json={"name": "still-works"})).status_code == 201
        await admin(hub, tmp_path, "billing-profile", hub.org_id, "--unlocked")
        assert (await hub.call("PUT", "/v1/billing/features/telemetry", json={"enabled": True})).status_code == 200
        # the lock and its lifting are the organisation's events (docs/events.md), once each, written by
        # the admin command's own transaction; the plan changed alone would be none
        await admin(hub, tmp_path, "billing-profile", hub.org_id, "--plan", "enterprise")
        r = await hub.call("GET", "/v1/events", params={"type": "io.fleethub.billing.lock"})
        assert r.status_code == 200, r.text
        assert [(e["subject"], e["data"]["locked"]) for e in r.json()["data"]] == [
            (f"organizations/{hub.org_id}", True), (f"organizations/{hub.org_id}", False)]


async def test_usage_range_validation(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        await admin(hub, tmp_path, "billing-profile", hub.org_id, "--plan", "pro", "--anchor-day", "15")
        for params in ({"from": "2026-01-01", "to": "2027-02-05"}, {"from": "2026-11-10", "to": "2026-11-01"},
                       {"from": "nope"}, {"to": "2026-11-01T00:00:00"}, {"window": "1"}):
            assert_error(await hub.call("GET", "/v1/billing/usage", params=params), 400)
        r = await hub.call("GET", "/v1/billing/usage", params={"from": "2026-01-01", "to": "2027-02-04"})
        assert r.status_code == 200 and r.json()["data"]["days"] == 400
        r = await hub.call("GET", "/v1/billing/usage")  # the current period, from the anchor day
        data = r.json()["data"]
        assert data["from"].endswith("-15") and data["end_exclusive"].endswith("-15")
        for params in ({"start": "2026-11-02", "end": "2026-11-02"}, {"start": "x"}, {"end": "2026-11-01T00:00"}):
            assert_error(await hub.call("GET", "/v1/billing/registry-fallback", params=params), 400)


async def test_tunnel_usage_takes_bearer_tokens_only_and_503_when_tunnels_are_off(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        for path in ("/v1/billing/tunnel/usage", "/v1/billing/tunnel/usage/records"):
            body = assert_error(await hub.call("GET", path), 401, "bearer_required")
            assert "Bearer" in body["message"]
            bearer_pat = {"Authorization": f"Bearer {hub.pat[1]}", "X-Organization-ID": hub.org_id}
            assert_error(await hub.call("GET", path, headers=bearer_pat), 401, "bearer_required")
        viewer = await bearer(hub, "billing_viewer")
        r = await hub.call("GET", "/v1/billing/tunnel/usage", headers=viewer)
        assert r.status_code == 200, r.text
        assert r.json()["data"]["sessions"] == 0
        nobody = await bearer(hub, "viewer")
        assert_error(await hub.call("GET", "/v1/billing/tunnel/usage", headers=nobody), 403)
        # a tunnel token is a Bearer token too (docs/billing.md); it still needs the Org header
        r = await hub.call("POST", "/v1/cli/tunnel/token")
        assert r.status_code == 200, r.text
        tunnel = {"Authorization": f"Bearer {r.json()['data']['token']}"}
        for path in ("/v1/billing/tunnel/usage", "/v1/billing/tunnel/usage/records"):
            r = await hub.call("GET", path, headers={**tunnel, "X-Organization-ID": hub.org_id})
            assert r.status_code == 200, r.text
            assert_error(await hub.call("GET", path, headers=tunnel), 400, "missing_organization")
        # elsewhere it is no credential at all
        assert_error(await hub.call("GET", "/v1/billing/features",
                                    headers={**tunnel, "X-Organization-ID": hub.org_id}), 401)
        for params in ({"limit": "0"}, {"limit": "201"}, {"cursor": "!!"}, {"from": "2026-11-02", "to": "2026-11-01"}):
            assert_error(await hub.call("GET", "/v1/billing/tunnel/usage/records", headers=viewer, params=params), 400)

        # FLEETHUB_TUNNELS=off (Settings.tunnels_enabled, owned by the tunnels module): set on this
        # running hub's frozen settings as that variable would have at start.
        object.__setattr__(hub.services.settings, "tunnels_enabled", False)
        for path in ("/v1/billing/tunnel/usage", "/v1/billing/tunnel/usage/records"):
            assert_error(await hub.call("GET", path, headers=viewer), 503, "tunnels_unavailable")
