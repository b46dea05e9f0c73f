"""Spec, Endpoints → Configurations (and Resources → Configuration; Limits → Configuration list).
One test per row; the row's method and path are in the test's name."""

from __future__ import annotations

import uuid

from tests.conformance.helpers import error_code, new_config

SPEC = {"ports": [{"port": 8080}]}


def test_get_configurations(spec):
    for i in range(11):
        new_config(spec, f"list-{i}")
    r = spec.call("GET", "/v1/configurations")
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) >= {"data", "pagination"} and "pagination" not in body["data"]  # beside data
    assert body["pagination"]["page"] == 1 and body["pagination"]["limit"] == 10 and len(body["data"]) == 10
    r = spec.call("GET", "/v1/configurations", params={"search": "list-1", "limit": 5, "sortBy": "name",
                                                       "sortOrder": "asc", "status": "active"})
    assert r.status_code == 200 and [c["name"] for c in r.json()["data"]][:2] == ["list-1", "list-10"]
    assert error_code(spec.call("GET", "/v1/configurations", params={"page": 0}), 400)
    no_org = {k: v for k, v in spec.headers.items() if k != "X-Organization-ID"}
    assert error_code(spec.call("GET", "/v1/configurations", headers=no_org), 400) == "missing_organization"
    assert error_code(spec.call("GET", "/v1/configurations", headers={}), 401)
    outsider = spec.new_org()
    assert error_code(spec.call("GET", "/v1/configurations", headers={**outsider, "X-Organization-ID": spec.org_id}),
                      403)


def test_post_configurations(spec):
    name = f"create-{uuid.uuid4().hex[:6]}"
    r = spec.call("POST", "/v1/configurations", json={"name": name, "description": "d", "tags": ["t"],
                                                      "spec": {"ports": [{"port": "8081"}]}})
    assert r.status_code == 201, r.text
    data = r.json()["data"]
    assert data["name"] == name and data["version"]["version"] == 1  # the initial version from spec
    assert data["version"]["spec"]["ports"] == [{"port": 8081}]       # numeric string accepted
    cases = [(b"{nope", "malformed_json"), ({"name": "x", "spec": SPEC, "extra": 1}, "unknown_field"),
             ({"spec": SPEC}, "missing_field"), ({"name": "x"}, "missing_field"),
             ({"name": "x", "spec": {"ports": [{"port": 70000}]}}, "invalid_spec"),
             ({"name": "x", "spec": SPEC, "fleetId": str(uuid.uuid4())}, "invalid_reference")]
    for body, code in cases:
        kw = {"content": body, "headers": {**spec.headers, "Content-Type": "application/json"}} \
            if isinstance(body, bytes) else {"json": body}
        assert error_code(spec.call("POST", "/v1/configurations", **kw), 400) == code, body
    assert error_code(spec.call("POST", "/v1/configurations", json={"name": name, "spec": SPEC}), 409) == "name_exists"


def test_get_configurations_summary(spec):
    new_config(spec, f"summary-{uuid.uuid4().hex[:6]}")
    for params in ({}, {"page": "0", "limit": "abc"}, {"page": "x", "limit": "-3"}):
        r = spec.call("GET", "/v1/configurations/summary", params=params)
        assert r.status_code == 200, (params, r.text)
        assert r.json()["pagination"]["page"] == 1 and r.json()["pagination"]["limit"] == 10  # missing or invalid
        assert isinstance(r.json()["data"], list)


def test_get_configuration_by_config_id(spec):
    config = new_config(spec, f"get-{uuid.uuid4().hex[:6]}")
    r = spec.call("GET", f"/v1/configurations/{config['id']}")
    assert r.status_code == 200 and r.json()["data"]["id"] == config["id"]
    assert error_code(spec.call("GET", "/v1/configurations/not-a-uuid"), 400) == "bad_uuid"
    assert error_code(spec.call("GET", f"/v1/configurations/{uuid.uuid4()}"), 404)


def test_put_configuration_by_config_id(spec):
    config = new_config(spec, f"put-{uuid.uuid4().hex[:6]}")
    r = spec.call("PUT", f"/v1/configurations/{config['id']}", json={"description": "new", "tags": ["a"]})
    assert r.status_code == 200 and r.json()["data"]["currentVersion"] == 1  # metadata only
    r = spec.call("PUT", f"/v1/configurations/{config['id']}", json={"spec": {"ports": [{"port": 9000}]}})
    assert r.status_code == 200 and r.json()["data"]["currentVersion"] == 2  # a spec makes a version
    # "409: configuration name exists" holds for a rename too (it was an unhandled 500), and nothing
    # of the refused update is kept
    other = new_config(spec, f"put-other-{uuid.uuid4().hex[:6]}")
    r = spec.call("PUT", f"/v1/configurations/{config['id']}", json={"name": other["name"], "description": "lost"})
    assert error_code(r, 409) == "name_exists" and other["name"] in r.json()["message"]
    kept = spec.call("GET", f"/v1/configurations/{config['id']}").json()["data"]
    assert kept["name"] == config["name"] and kept["description"] == "new"


def test_limit_configuration_list_default_page_1_limit_10(spec):
    for path in ("/v1/configurations", "/v1/configurations/summary", "/v1/devices", "/v1/fleets", "/v1/rollouts"):
        r = spec.call("GET", path)
        assert r.status_code == 200, (path, r.text)
        assert (r.json()["pagination"]["page"], r.json()["pagination"]["limit"]) == (1, 10), path
