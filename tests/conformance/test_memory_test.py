"""Spec, Endpoints → Memory test; Errors → Memory test errors; Resources → Memory test (enumerations
of the start request and the status members); Limits → the memory-test rows. Each test has its own
device with a real agent, so the one-test-per-device and 5-second rules of one test do not reach
another. Rows of outcome, verdict and phase spelling belong to the wire format (tests/api/test_memtests.py
and the agent's tests); see README.md."""

from __future__ import annotations

import uuid

from tests.conformance.helpers import error_code

# Live with the idle-decay check: it waits 5 minutes, so the run is still going when we look.
LONG_LIVE = {"bitFade": True}


def mt(device_id: str, suffix: str = "") -> str:
    return f"/v1/devices/{device_id}/memory-test{suffix}"


def test_post_memory_test_start(spec):
    dev = spec.linked_device()
    r = spec.call("POST", mt(dev), json=LONG_LIVE)
    assert r.status_code == 202, r.text
    data = r.json()["data"]
    assert data["deviceId"] == dev and data["runId"] and isinstance(data["status"], dict)
    spec.call("POST", mt(dev, "/cancel"))


def test_post_memory_test_cancel(spec):
    dev = spec.linked_device()
    run_id = spec.call("POST", mt(dev), json=LONG_LIVE).json()["data"]["runId"]
    r = spec.call("POST", mt(dev, "/cancel"), json={"runId": run_id})
    assert r.status_code == 202, r.text
    data = r.json()["data"]
    assert data["deviceId"] == dev and data["runId"] == run_id and isinstance(data["status"], dict)  # same shape


def test_get_memory_test_status(spec):
    dev = spec.linked_device()
    r = spec.call("GET", mt(dev))
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert data["source"] == "live" and data["supported"] is True
    assert {"status", "health", "history"} <= set(data) and len(data["history"]) <= 10
    r = spec.call("GET", mt(spec.offline_device_id))
    assert r.status_code == 200 and r.json()["data"]["source"] == "stored" and "healthReportedAt" in r.json()["data"]


def test_get_memory_test_results(spec):
    dev = spec.linked_device()
    r = spec.call("GET", mt(dev, "/results"))
    assert r.status_code == 200 and isinstance(r.json()["data"]["results"], list)
    for limit in (1, 100):
        assert spec.call("GET", mt(dev, "/results"), params={"limit": limit}).status_code == 200


def test_error_400_invalid(spec):
    dev = spec.linked_device()
    cases = [{"impact": "running", "placement": "offline"}, {"passes": 0}, {"passes": 21}, {"kernelPasses": 18},
             {"timeBudgetSeconds": 59}, {"timeBudgetSeconds": 43201}, {"impact": "sideways"}]
    for plan in cases:
        r = spec.call("POST", mt(dev), json=plan)
        assert error_code(r, 400) == "invalid", plan
        assert "error" in r.json() and "data" not in r.json()  # the bare body


def test_error_400_bad_uuid_on_every_memory_test_path(spec):
    for method, suffix in (("POST", ""), ("POST", "/cancel"), ("GET", ""), ("GET", "/results")):
        assert error_code(spec.call(method, mt("not-a-uuid", suffix)), 400) == "bad_uuid", (method, suffix)


def test_error_403_operator_required(spec):
    dev = spec.linked_device()
    boot = {"impact": "stopped", "placement": "offline"}
    assert error_code(spec.call("POST", mt(dev), json=boot), 403) == "operator_required"            # API token
    assert error_code(spec.call("POST", mt(dev), json=boot, headers=spec.service_bearer()), 403) \
        == "operator_required"                                                                     # service account
    token = spec.call("POST", "/v1/cli/tunnel/token").json()["data"]["token"]
    cli = {"Authorization": f"Bearer {token}", "X-Organization-ID": spec.org_id}
    assert error_code(spec.call("POST", mt(dev), json=boot, headers=cli), 403) == "operator_required"  # CLI token


def test_error_409_busy_and_limit_concurrent_memory_tests_one_per_device(spec):
    dev = spec.linked_device()
    assert spec.call("POST", mt(dev), json=LONG_LIVE).status_code == 202
    r = spec.call("POST", mt(dev), json={})
    assert error_code(r, 409) == "busy" and isinstance(r.json().get("status"), dict)  # carries the running test
    spec.call("POST", mt(dev, "/cancel"))


def test_error_409_not_running(spec):
    dev = spec.linked_device()
    assert error_code(spec.call("POST", mt(dev, "/cancel")), 409) == "not_running"


def test_error_429_rate_limited_and_limit_start_rate_one_per_5_seconds(spec):
    dev = spec.linked_device()
    assert spec.call("POST", mt(dev), json=LONG_LIVE).status_code == 202
    assert spec.call("POST", mt(dev, "/cancel")).status_code == 202
    r = spec.call("POST", mt(dev), json={})
    assert error_code(r, 429) == "rate_limited" and int(r.headers["Retry-After"]) >= 1


def test_error_503_device_offline(spec):
    assert error_code(spec.call("POST", mt(spec.offline_device_id), json={}), 503) == "device_offline"


def test_limit_memory_test_results_query_limit_1_to_100(spec):
    dev = spec.linked_device()
    for limit in ("0", "101", "x"):
        assert error_code(spec.call("GET", mt(dev, "/results"), params={"limit": limit}), 400) == "invalid"


def test_limit_memory_test_passes_kernel_passes_and_time_budget(spec):
    dev = spec.linked_device()
    r = spec.call("POST", mt(dev), json={**LONG_LIVE, "passes": 20, "timeBudgetSeconds": 60})
    assert r.status_code == 202, r.text
    plan = r.json()["data"]["status"].get("plan") or {}
    assert plan.get("passes") == 20 and plan.get("timeBudgetSeconds") == 60
    spec.call("POST", mt(dev, "/cancel"))


def test_start_defaults_take_the_mode_default(spec):
    dev = spec.linked_device()
    r = spec.call("POST", mt(dev), json=LONG_LIVE)
    plan = r.json()["data"]["status"].get("plan") or {}
    assert (plan.get("passes"), plan.get("timeBudgetSeconds")) == (1, 7200)  # Live: one pass, 7200 s
    spec.call("POST", mt(dev, "/cancel"))


def test_unknown_device_is_404(spec):
    assert error_code(spec.call("GET", mt(str(uuid.uuid4()))), 404)
