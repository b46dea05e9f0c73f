"""Spec, Endpoints → Memory test; Errors → Memory test errors; Resources → Memory test (the start
request, the status and result members, the error entries, the enumerations); States and transitions
→ Memory test run; Limits → the memory-test rows. Each test has its own device with a real agent
(a simulated fault where the row needs failing memory), so the one-test-per-device and 5-second
rules of one test do not reach another. Rows that need a device misbehaving on purpose or an hour
of clock are pointed to in README.md."""

from __future__ import annotations

import uuid

from tests.conformance.helpers import error_code, wait_until
from tests.conformance.spec import (
    MEMTEST_ERROR_FIELDS,
    MEMTEST_ERRORS_KEPT,
    MEMTEST_PHASES,
    MEMTEST_RESULT_MEMBERS,
    MEMTEST_RUN_MEMBERS,
    MEMTEST_STATUS_MEMBERS,
    MEMTEST_VERDICTS,
)

# Live with the idle-decay check: it waits 5 minutes, so the run is still going when we look.
LONG_LIVE = {"bitFade": True}


def mt(device_id: str, suffix: str = "") -> str:
    return f"/v1/devices/{device_id}/memory-test{suffix}"


def _result(spec, device_id: str, run_id: str, timeout: float = 30) -> dict:
    """The stored result of ``run_id`` once the hub has it."""
    found: dict[str, dict] = {}

    def stored() -> bool:
        r = spec.call("GET", mt(device_id, "/results"))
        assert r.status_code == 200, r.text
        found.update({x["runId"]: x for x in r.json()["data"]["results"]})
        return run_id in found

    wait_until(spec, stored, timeout=timeout, interval=0.2)
    return found[run_id]


def _status(spec, device_id: str) -> dict:
    r = spec.call("GET", mt(device_id))
    assert r.status_code == 200, r.text
    return r.json()["data"]


def _phase_is(spec, device_id: str, phase: str, timeout: float = 20) -> None:
    wait_until(spec, lambda: (_status(spec, device_id)["status"] or {}).get("phase") == phase, timeout=timeout,
               interval=0.1)


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


# -- Resources → Memory test: members and enumerations of real runs ------------------------------------
def test_result_members_outcome_pass_verdict_ok_phase_done(spec):
    dev = spec.linked_device()
    run_id = spec.call("POST", mt(dev), json={"quick": True}).json()["data"]["runId"]
    res = _result(spec, dev, run_id)
    assert (res["outcome"], res["verdict"]) == ("pass", "ok")  # pass: no confirmed errors; ok: no errors
    assert set(MEMTEST_RESULT_MEMBERS) - {"kernel", "interrupted"} <= set(res), \
        set(MEMTEST_RESULT_MEMBERS) - set(res)
    assert "kernel" not in res or res["kernel"] is None  # test boot only
    assert "interrupted" not in res  # only for interrupted runs
    assert res["source"] == "stored" and res["errors"] == [] and res["errorCount"] == 0
    assert res["plan"]["mode"] == "live_quick" and res["testedBytes"] > 0
    data = _status(spec, dev)
    assert set(MEMTEST_STATUS_MEMBERS) - {"healthReportedAt"} <= set(data)  # healthReportedAt: stored only
    assert data["status"]["phase"] == "done" and data["status"]["runId"] == run_id
    assert set(MEMTEST_RUN_MEMBERS) <= set(data["status"]), set(MEMTEST_RUN_MEMBERS) - set(data["status"])
    assert [h["runId"] for h in data["history"]] == [run_id] and data["history"][0]["source"] in ("live", "stored")
    health = data["health"]
    assert {"capabilities", "hardwareCorruptedBytes", "edac", "retiredPages", "fault", "faultReason",
            "kernelErrors", "lastResult"} <= set(health)
    assert {"online", "offline", "offlineReason"} <= set(health["capabilities"])
    assert health["lastResult"]["runId"] == run_id


def test_outcome_fail_error_entries_and_limit_errors_kept_per_result_256(spec):
    dev = spec.linked_device("faulty", fault="data_line")  # one data bit stuck in every word
    run_id = spec.call("POST", mt(dev), json={"quick": True}).json()["data"]["runId"]
    res = _result(spec, dev, run_id)
    assert (res["outcome"], res["verdict"]) == ("fail", "data_line")
    assert res["errorCount"] > MEMTEST_ERRORS_KEPT and len(res["errors"]) == MEMTEST_ERRORS_KEPT
    for entry in res["errors"]:
        assert set(MEMTEST_ERROR_FIELDS) <= set(entry), entry
        assert int(entry["mask"], 16) == int(entry["expected"], 16) ^ int(entry["actual"], 16) != 0
        assert entry["physAddr"] >= 0 and entry["pass"] >= 1 and isinstance(entry["confirmed"], bool)


def test_outcome_cancelled_keeps_the_results_so_far(spec):
    dev = spec.linked_device()
    run_id = spec.call("POST", mt(dev), json=LONG_LIVE).json()["data"]["runId"]
    _phase_is(spec, dev, "testing")
    assert spec.call("POST", mt(dev, "/cancel")).status_code == 202
    res = _result(spec, dev, run_id)
    assert res["outcome"] == "cancelled" and res["verdict"] in MEMTEST_VERDICTS and res["testedBytes"] > 0
    assert "interrupted" not in res
    assert _status(spec, dev)["status"]["phase"] == "cancelled"


def test_outcome_interrupted_reported_at_the_next_boot(spec):
    dev = spec.linked_device()
    run_id = spec.call("POST", mt(dev), json=LONG_LIVE).json()["data"]["runId"]
    _phase_is(spec, dev, "testing")
    spec.reset_device(dev)  # the device resets during the test
    res = _result(spec, dev, run_id)
    assert res["outcome"] == "interrupted" and res["verdict"] in MEMTEST_VERDICTS
    where = res["interrupted"]  # the phase, pass and pattern last reached
    assert where["phase"] in MEMTEST_PHASES and {"pass", "pattern"} <= set(where), where
    assert _status(spec, dev)["status"]["phase"] in MEMTEST_PHASES
    # not retried, and nothing runs: a new start is not refused as busy (202, or 429 within the
    # 5-second start rate)
    assert spec.call("POST", mt(dev), json={"quick": True}).status_code in (202, 429)


def test_error_422_unsupported(spec):
    no_tester = spec.linked_device("old-firmware", enabled=False)
    assert error_code(spec.call("POST", mt(no_tester), json={}), 422) == "unsupported"
    assert _status(spec, no_tester)["supported"] is False
    board = spec.linked_device("no-test-boot", test_boot=False)  # firmware without a test boot on this board
    browser, headers = spec.signed_in()
    try:
        r = browser.post(mt(board), headers=headers, json={"impact": "stopped", "placement": "offline"})
    finally:
        browser.close()
    assert error_code(r, 422) == "unsupported"


# -- States and transitions → Memory test run: the test boot ---------------------------------------------
TEST_BOOT = {"impact": "stopped", "placement": "offline", "passes": 1, "kernelPasses": 1, "bitFade": False}


def test_test_boot_reboots_sweeps_tests_and_returns_to_service(spec):
    dev = spec.linked_device("boot")
    browser, headers = spec.signed_in()
    try:
        r = browser.post(mt(dev), headers=headers, json=TEST_BOOT)
    finally:
        browser.close()
    assert r.status_code == 202, r.text
    run_id = r.json()["data"]["runId"]
    assert r.json()["data"]["status"]["phase"] == "rebooting"
    res = _result(spec, dev, run_id, timeout=60)
    assert res["outcome"] == "pass" and res["plan"]["mode"] == "test_boot"
    assert res["kernel"]["passes"] == 1 and res["kernel"]["badRanges"] == []  # the kernel sweep ran first

    def back_in_service() -> bool:
        d = spec.call("GET", f"/v1/devices/{dev}").json()["data"]
        return d["state"] == "online" and d["boot_reason"] == "memory_test_done"

    wait_until(spec, back_in_service, timeout=30, interval=0.2)


def test_test_boot_hold_on_failure_held_until_cancel(spec):
    dev = spec.linked_device("held", fault="data_line")
    browser, headers = spec.signed_in()
    try:
        r = browser.post(mt(dev), headers=headers, json={**TEST_BOOT, "holdOnFailure": True})
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["runId"]
        # failed with holdOnFailure: held in maintenance with the workload held
        wait_until(spec, lambda: (_status(spec, dev)["status"] or {}).get("step") == "holding", timeout=60,
                   interval=0.2)
        assert _status(spec, dev)["status"]["phase"] == "failed"
        assert spec.call("GET", f"/v1/devices/{dev}").json()["data"]["state"] == "maintenance"
        r = browser.post(mt(dev, "/cancel"), headers=headers, json={"runId": run_id})
        assert r.status_code == 202, r.text
    finally:
        browser.close()
    res = _result(spec, dev, run_id, timeout=30)
    assert res["outcome"] == "fail" and res["plan"]["holdOnFailure"] is True
    wait_until(spec, lambda: (_status(spec, dev)["status"] or {}).get("step") != "holding", timeout=30,
               interval=0.2)
