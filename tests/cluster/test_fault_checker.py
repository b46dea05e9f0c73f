"""The fault suite's checker (tests/cluster/faults/checker.py) on hand-written histories: a clean one
passes, and each invariant is caught when a history breaks it."""

from __future__ import annotations

from tests.cluster.faults.checker import check

R, D1, D2 = "r1", "d1", "d2"
META = {"t": 0.0, "kind": "meta", "offline_bound": 5.0, "grace": 3.0, "expected_failures": []}


def step(t, device, name, rollout=R):
    return {"t": t, "kind": "step", "rollout": rollout, "device": device, "step": name}


def call(t, rid, status, path="/v1/devices", method="GET"):
    return {"t": t, "kind": "call", "request_id": rid, "method": method, "path": path, "status": status, "node": "n1"}


def presence(t, device, link, online, node="n1"):
    return {"t": t, "kind": "presence", "device": device, "link": link, "node": node, "online": online}


def fault(t, name, targets, phase):
    return {"t": t, "kind": "fault", "fault": name, "targets": targets, "phase": phase}


def final(state, reason=None, rollout=R):
    return {"t": 99.0, "kind": "rollout", "rollout": rollout, "state": state, "reason": reason, "counts": {}}


CLEAN = [META, step(1, D1, "updating"), step(2, D1, "succeeded"), step(3, D1, "succeeded"),
         step(1, D2, "pending"), step(4, D2, "updating"), step(5, D2, "succeeded"),
         {"t": 2, "kind": "write", "rollout": R, "writer": "n1", "owner": "n1"},
         {"t": 6, "kind": "write", "rollout": R, "writer": "n2", "owner": "n2"},
         call(1, "q1", 200), {"t": 9, "kind": "audit", "request_id": "q1"}, call(2, "q2", None),
         call(3, "q3", 503),
         presence(1, D1, True, True), presence(2, D1, True, False), presence(6, D1, True, True),
         presence(1, D2, False, False), presence(20, D2, False, False),
         final("completed")]


def invariants(records) -> list[str]:
    return [v.invariant for v in check(records)]


def test_a_clean_history_holds():
    assert check(CLEAN) == []


def test_a_device_that_succeeds_twice_in_one_rollout_is_caught():
    bad = CLEAN + [step(7, D1, "updating"), step(8, D1, "succeeded")]
    assert invariants(bad) == ["succeeded_at_most_once"]
    # the same device succeeding in another rollout is fine
    assert check(CLEAN + [step(7, D1, "updating", "r2"), step(8, D1, "succeeded", "r2"),
                          final("completed", rollout="r2")]) == []


def test_a_write_by_a_node_that_lost_its_lease_is_caught():
    bad = CLEAN + [{"t": 7, "kind": "write", "rollout": R, "writer": "n1", "owner": "n2"}]
    assert invariants(bad) == ["no_write_after_lease_lost"]
    assert invariants(CLEAN + [{"t": 7, "kind": "write", "rollout": R, "writer": "n1", "owner": None}]) == [
        "no_write_after_lease_lost"]


def test_an_acknowledged_call_without_an_audit_row_is_caught():
    violations = check(CLEAN + [call(8, "q9", 201, "/v1/fleets", "POST")])
    assert [v.invariant for v in violations] == ["acknowledged_calls_audited"]
    assert "q9" in violations[0].detail


def test_a_device_offline_while_linked_longer_than_the_bound_is_caught():
    bad = CLEAN + [presence(10, D2, True, False), presence(13, D2, True, False), presence(16, D2, True, False)]
    assert invariants(bad) == ["no_false_offline"]
    # exactly the same while its node was frozen (and for the grace after): excused
    excused = bad + [fault(9, "node-stop", ["n1"], "start"), fault(14, "node-stop", ["n1"], "end")]
    assert check(excused) == []
    # a fault on another node excuses nothing; nor does a NATS outage
    assert invariants(bad + [fault(9, "node-stop", ["n2"], "start"), fault(14, "node-stop", ["n2"], "end"),
                             fault(9, "nats-stop", ["nats"], "start"), fault(14, "nats-stop", ["nats"], "end")]) == [
        "no_false_offline"]


def test_a_rollout_left_running_is_caught():
    assert invariants(CLEAN[:-1] + [final("running")]) == ["rollouts_end"]


def test_a_rollout_paused_for_a_healthy_device_failing_is_caught():
    bad = CLEAN[:-1] + [step(6, D2, "failed"), final("paused", "1 of 2 updated devices failed")]
    assert invariants(bad) == ["rollouts_end", "rollouts_end"]  # a false failure, and a false reason


def test_a_rollout_paused_for_a_true_reason_holds():
    paused = CLEAN[:-1] + [call(5, "p1", 200, f"/v1/rollouts/{R}/pause", "POST"),
                           {"t": 9.5, "kind": "audit", "request_id": "p1"}, final("paused", "paused by the operator")]
    assert check(paused) == []
    expected = [{**META, "expected_failures": [D2]}] + CLEAN[1:-1] + [
        step(6, D2, "failed"), final("paused", "1 of 2 updated devices failed")]
    assert check(expected) == []


def test_what_a_fault_cost_is_read_from_the_history():
    from tests.cluster.faults.figures import fault_costs
    history = [fault(10, "nats-stop", ["nats"], "start"), call(11, "a", 200, "/v1/devices/x/ping", "POST"),
               call(12, "b", 503, "/v1/devices/x/ping", "POST"), call(13, "c", 201, "/v1/fleets", "POST"),
               presence(12, D1, True, False), presence(12, D2, True, False), presence(13, D1, True, False),
               fault(14, "nats-stop", ["nats"], "end"), call(15.5, "d", 200, "/v1/devices/x/ping", "POST"),
               step(16, D1, "succeeded")]
    assert fault_costs(history) == [{
        "fault": "nats-stop", "targets": ["nats"], "seconds": 4, "pings_ok": 1, "pings": 2, "writes_ok": 1,
        "writes": 1, "pings_back_after": 1.5, "next_success_after": 2, "most_offline_while_linked": 2}]
