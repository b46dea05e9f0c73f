"""Spec, Errors → Other status codes (the memory-test and tunnel tables are in their modules)."""

from __future__ import annotations

import uuid

from tests.conformance.helpers import error_code, new_config


def test_status_400_missing_organisation_invalid_query_bad_uuid_malformed_body_unknown_field(spec):
    no_org = {k: v for k, v in spec.headers.items() if k != "X-Organization-ID"}
    assert error_code(spec.call("GET", "/v1/devices", headers=no_org), 400) == "missing_organization"
    assert error_code(spec.call("GET", "/v1/devices", params={"limit": "abc"}), 400)
    assert error_code(spec.call("GET", "/v1/devices/not-a-uuid"), 400) == "bad_uuid"
    assert error_code(spec.call("POST", "/v1/fleets", content=b"{", headers={
        **spec.headers, "Content-Type": "application/json"}), 400) == "malformed_json"
    assert error_code(spec.call("POST", "/v1/fleets", json={"name": "x", "nope": 1}), 400) == "unknown_field"


def test_status_401_authentication_required(spec):
    assert error_code(spec.call("GET", "/v1/devices", headers={"X-Organization-ID": spec.org_id}), 401)
    bad = {"X-API-Token-ID": "pat_nope", "X-API-Secret-Key": "nope", "X-Organization-ID": spec.org_id}
    assert error_code(spec.call("GET", "/v1/devices", headers=bad), 401)


def test_status_403_access_denied_or_missing_role(spec):
    member = spec.new_user("member")
    config = new_config(spec)
    assert error_code(spec.call("PUT", f"/v1/configurations/{config['id']}", json={"description": "x"},
                                headers=member), 403)


def test_status_404_configuration_session_or_billing_profile_not_found(spec):
    assert error_code(spec.call("GET", f"/v1/configurations/{uuid.uuid4()}"), 404)
    assert error_code(spec.call("GET", "/v1/billing/pricing", headers=spec.new_org()), 404)  # no billing profile


def test_status_409_configuration_name_exists(spec):
    config = new_config(spec)
    assert error_code(spec.call("POST", "/v1/configurations", json={"name": config["name"], "spec": {}}), 409)


def test_status_404_and_405_unknown_routes_are_json(spec):
    assert error_code(spec.call("GET", "/v1/no-such-route"), 404)
    assert error_code(spec.call("PATCH", "/v1/configurations"), 405)
