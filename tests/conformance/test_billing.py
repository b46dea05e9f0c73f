"""Spec, Endpoints → Billing and registry fallback; Resources → Feature entitlements; Limits → Tunnel
usage records limit and Usage range."""

from __future__ import annotations

import uuid

from tests.conformance.helpers import error_code
from tests.conformance.spec import FEATURE_KEYS


def _billing_profile(spec) -> None:
    """The organisation gets a billing profile, as `fleethub admin billing-profile` makes it."""
    from hub.billing import state

    async def make() -> None:
        s = spec.hub.services
        if await s.stores.billing.profile(uuid.UUID(spec.org_id)) is None:
            await s.stores.billing.put_profile(uuid.UUID(spec.org_id), s.clock.now(), plan="pro")
            await state.changed(s, uuid.UUID(spec.org_id))

    spec.run(make)


def test_get_billing_tunnel_usage(spec):
    r = spec.call("GET", "/v1/billing/tunnel/usage", headers=spec.service_bearer("billing_viewer"))
    assert r.status_code == 200 and isinstance(r.json()["data"], dict), r.text
    token = spec.call("POST", "/v1/cli/tunnel/token").json()["data"]["token"]
    r = spec.call("GET", "/v1/billing/tunnel/usage",
                  headers={"Authorization": f"Bearer {token}", "X-Organization-ID": spec.org_id})
    assert r.status_code == 200, r.text  # a tunnel token is a Bearer token too
    assert error_code(spec.call("GET", "/v1/billing/tunnel/usage"), 401) == "bearer_required"  # a PAT is not Bearer


def test_get_billing_tunnel_usage_records_and_limit_1_to_200_default_50(spec):
    bearer = spec.service_bearer("billing_viewer")
    r = spec.call("GET", "/v1/billing/tunnel/usage/records", headers=bearer)
    assert r.status_code == 200 and r.json()["data"]["limit"] == 50, r.text
    assert "next_cursor" in r.json()["data"]
    for limit in ("0", "201"):
        error_code(spec.call("GET", "/v1/billing/tunnel/usage/records", headers=bearer, params={"limit": limit}), 400)
    assert spec.call("GET", "/v1/billing/tunnel/usage/records", headers=bearer,
                     params={"limit": 200}).status_code == 200


def test_get_billing_features(spec):
    r = spec.call("GET", "/v1/billing/features")
    assert r.status_code == 200, r.text
    view = r.json()["data"]
    features = view.get("features", view)
    assert set(FEATURE_KEYS) <= set(features)  # all keys always present
    assert {k for k in FEATURE_KEYS if features[k]["self_serve"]} == {"telemetry"}
    assert error_code(spec.call("GET", "/v1/billing/features", headers={"X-Organization-ID": spec.org_id}), 401)


def test_put_billing_feature(spec):
    headers = spec.new_org()  # without a billing profile: 409
    assert error_code(spec.call("PUT", "/v1/billing/features/telemetry", json={"enabled": True}, headers=headers),
                      409)
    for feature in ("signature_policy", "usb_policy"):  # listed by the path enum, not self-serve
        assert error_code(spec.call("PUT", f"/v1/billing/features/{feature}", json={"enabled": True}), 400)
    error_code(spec.call("PUT", "/v1/billing/features/telemetry", json={"enabled": "yes"}), 400)
    member = spec.new_user("member")
    assert error_code(spec.call("PUT", "/v1/billing/features/telemetry", json={"enabled": True}, headers=member), 403)
    _billing_profile(spec)
    r = spec.call("PUT", "/v1/billing/features/telemetry", json={"enabled": True})
    assert r.status_code == 200, r.text


def test_get_billing_pricing(spec):
    assert error_code(spec.call("GET", "/v1/billing/pricing", headers=spec.new_org()), 404)
    _billing_profile(spec)
    r = spec.call("GET", "/v1/billing/pricing")
    assert r.status_code == 200, r.text


def test_get_billing_registry_fallback(spec):
    r = spec.call("GET", "/v1/billing/registry-fallback")
    assert r.status_code == 200, r.text
    assert error_code(spec.call("GET", "/v1/billing/registry-fallback", params={"start": "nope"}), 400)
    member = spec.new_user("member")  # no billing viewer relation
    assert error_code(spec.call("GET", "/v1/billing/registry-fallback", headers=member), 403)


def test_get_billing_usage_and_limit_usage_range_at_most_400_days(spec):
    assert error_code(spec.call("GET", "/v1/billing/usage", headers=spec.new_org()), 404)
    _billing_profile(spec)
    assert spec.call("GET", "/v1/billing/usage").status_code == 200
    r = spec.call("GET", "/v1/billing/usage", params={"from": "2026-01-01", "to": "2027-02-04"})
    assert r.status_code == 200 and r.json()["data"]["days"] == 400
    error_code(spec.call("GET", "/v1/billing/usage", params={"from": "2026-01-01", "to": "2027-02-05"}), 400)


def test_billing_locked_pricing_and_usage_readable_features_refused_409(spec):
    """Endpoints → Billing: /billing/pricing and /billing/usage are read-only and available while the
    account is billing-locked; changing a feature is refused with the endpoint's 409 (docs/billing.md)."""
    from hub.billing import state

    headers = spec.new_org()
    org_id = uuid.UUID(headers["X-Organization-ID"])

    async def lock() -> None:
        s = spec.hub.services
        await s.stores.billing.put_profile(org_id, s.clock.now(), plan="pro", locked=True)
        await state.changed(s, org_id)

    spec.run(lock)
    for path in ("/v1/billing/pricing", "/v1/billing/usage"):
        r = spec.call("GET", path, headers=headers)
        assert r.status_code == 200, (path, r.text)
    assert spec.call("GET", "/v1/billing/features", headers=headers).status_code == 200
    r = spec.call("PUT", "/v1/billing/features/telemetry", json={"enabled": True}, headers=headers)
    assert error_code(r, 409) == "billing_locked"
