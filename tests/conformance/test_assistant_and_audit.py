"""Spec, Endpoints → Assistant and Audit; Limits → Audit events limit."""

from __future__ import annotations

from tests.conformance.helpers import error_code


def test_post_assistant_chat_completions(spec):
    # signed-in dashboard sessions only: any other credential is refused (403), not looked up
    r = spec.call("POST", "/v1/assistant/chat/completions", json={"messages": []})
    assert error_code(r, 403)


def test_get_assistant_usage(spec):
    assert error_code(spec.call("GET", "/v1/assistant/usage"), 403)


def test_get_audit_events_and_limit_1_to_1000_default_50(spec):
    r = spec.call("GET", "/v1/audit-events")
    assert r.status_code == 200, r.text
    assert (r.json()["pagination"]["page"], r.json()["pagination"]["limit"]) == (1, 50)
    for params in ({"limit": 0}, {"limit": 1001}, {"page": 0}, {"from": "yesterday"}):
        error_code(spec.call("GET", "/v1/audit-events", params=params), 400)
    r = spec.call("GET", "/v1/audit-events", params={"limit": 1000, "method": "GET", "pathPrefix": "/v1/devices"})
    assert r.status_code == 200
    no_org = {k: v for k, v in spec.headers.items() if k != "X-Organization-ID"}
    assert error_code(spec.call("GET", "/v1/audit-events", headers=no_org), 400)


def test_audit_entry_for_every_memory_test_start_and_cancel(spec):
    dev = spec.linked_device("audited")
    path = f"/v1/devices/{dev}/memory-test"
    assert spec.call("POST", path, json={"bitFade": True}).status_code == 202
    assert spec.call("POST", path + "/cancel").status_code == 202
    spec.run(spec.hub.services.audit_log.flush)
    r = spec.call("GET", "/v1/audit-events", params={"pathPrefix": path})
    entries = {e["path"]: e for e in r.json()["data"]}
    assert set(entries) == {path, path + "/cancel"}
    for entry in entries.values():
        assert entry["status"] == 202 and entry["details"]["plan"]["mode"] == "live"  # with the requested plan
