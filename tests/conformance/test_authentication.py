"""Spec, Authentication (and the OAuth token row of the service-account flow)."""

from __future__ import annotations

import datetime as dt

import trio

from tests.conformance.helpers import error_code
from tests.conformance.spec import SCHEMES


def test_pat_headers_x_api_token_id_and_x_api_secret_key(spec):
    assert spec.call("GET", "/v1/devices").status_code == 200
    secret_only = {"X-API-Secret-Key": spec.headers["X-API-Secret-Key"], "X-Organization-ID": spec.org_id}
    assert error_code(spec.call("GET", "/v1/devices", headers=secret_only), 401)  # the two headers together


def test_pat_secret_as_bearer(spec):
    bearer = {"Authorization": f"Bearer {spec.headers['X-API-Secret-Key']}", "X-Organization-ID": spec.org_id}
    assert spec.call("GET", "/v1/devices", headers=bearer).status_code == 200


def test_pat_deleting_a_token_revokes_it_immediately(spec):
    headers = spec.new_user("admin")
    assert spec.call("GET", "/v1/devices", headers=headers).status_code == 200
    r = spec.call("DELETE", f"/v1/pats/{headers['X-API-Token-ID']}", headers=headers)
    assert r.status_code == 200, r.text
    assert error_code(spec.call("GET", "/v1/devices", headers=headers), 401)


def test_pat_optional_expiry(spec):
    """A token with an expiry works until then, and is refused from then on."""
    creator = spec.new_user("admin")
    personal = {k: v for k, v in creator.items() if k != "X-Organization-ID"}
    clock = spec.hub.services.clock
    now = clock.now()
    expiry = now + dt.timedelta(seconds=1.5)
    r = spec.call("POST", "/v1/pats", headers=personal, json={"expires_at": expiry.isoformat()})
    assert r.status_code == 201, r.text
    pat = r.json()["data"]
    assert pat["expires_at"]
    headers = {"X-API-Token-ID": pat["id"], "X-API-Secret-Key": pat["secret"], "X-Organization-ID": spec.org_id}
    assert spec.call("GET", "/v1/devices", headers=headers).status_code == 200
    spec.run(trio.sleep, max(0.0, (expiry - clock.now()).total_seconds()) + 0.1)  # past the expiry
    assert error_code(spec.call("GET", "/v1/devices", headers=headers), 401)
    r = spec.call("POST", "/v1/pats", headers=personal, json={"expires_at": (now - dt.timedelta(seconds=1)).isoformat()})
    assert error_code(r, 400)  # an expiry must be in the future
    r = spec.call("POST", "/v1/pats", headers=personal, json={})
    assert r.status_code == 201 and r.json()["data"]["expires_at"] is None  # optional


def test_post_oauth_token_client_credentials(spec):
    bearer = spec.service_bearer("viewer")
    assert spec.call("GET", "/v1/devices", headers=bearer).status_code == 200
    r = spec.http.post(spec.base_url + "/v1/oauth/token", json={"grant_type": "client_credentials"})
    assert r.status_code == 400  # the form content type is required
    r = spec.http.post(spec.base_url + "/v1/oauth/token", data={"grant_type": "password"})
    assert r.status_code in (400, 401) and "error" in r.json()


def test_security_scheme_names(spec):
    doc = spec.call("GET", "/v1/openapi.json", headers={}).json()
    assert set(SCHEMES) <= set(doc["components"]["securitySchemes"])
    assert doc["info"]["version"] == "1.0"  # Versioning: the API definition version


def test_organisation_scoped_endpoints_require_x_organization_id(spec):
    no_org = {k: v for k, v in spec.headers.items() if k != "X-Organization-ID"}
    for path in ("/v1/devices", "/v1/fleets", "/v1/configurations", "/v1/audit-events", "/v1/billing/features"):
        assert error_code(spec.call("GET", path, headers=no_org), 400) == "missing_organization", path


def test_assistant_endpoints_accept_dashboard_sessions_only(spec):
    assert error_code(spec.call("GET", "/v1/assistant/usage"), 403)
    assert error_code(spec.call("GET", "/v1/assistant/usage", headers=spec.service_bearer()), 403)
