"""The hub's memory-test machine, plan rules, MemoryFault and diagnosis: pure, no IO, exact instants."""

from __future__ import annotations

import copy
import datetime as dt

import pytest

from actors.machines import memory_fault as mf
from actors.machines import memtest as mm
from actors.machines.memtest import (
    TRANSITIONS,
    Busy,
    Cancel,
    Finished,
    MemtestMachine,
    NotRunning,
    Observed,
    Progress,
    Publish,
    Reset,
    RunState,
    SendCancel,
    SendStart,
    Start,
    StartAccepted,
    StartRefused,
    StoreResult,
    TooSoon,
    Unsupported,
    operation,
    progress,
)
from actors.machines.memtest_plan import PlanInvalid, plan_for

UTC = dt.UTC
T0 = dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
BOTH = {"online": True, "offline": True}
ONLINE_ONLY = {"online": True, "offline": False, "offlineReason": mm.TEST_BOOT_UNSUPPORTED}
LIVE = plan_for({})
FULL = plan_for({"impact": "stopped"})


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


# -- plans --------------------------------------------------------------------------------------------
def test_each_mode_gets_its_defaults():
    assert plan_for({}) == {"mode": "live", "impact": "running", "placement": "online", "quick": False,
                            "passes": 1, "kernelPasses": 4, "bitFade": False, "holdOnFailure": False,
                            "timeBudgetSeconds": 7200}
    assert plan_for({"quick": True})["mode"] == "live_quick"
    assert plan_for({"quick": True})["passes"] == 1 and plan_for({"quick": True})["bitFade"] is False
    full = plan_for({"impact": "stopped"})
    assert (full["mode"], full["passes"], full["bitFade"]) == ("full_online", 2, True)
    boot = plan_for({"impact": "stopped", "placement": "offline"})
    assert (boot["mode"], boot["passes"], boot["kernelPasses"], boot["bitFade"], boot["holdOnFailure"]) == (
        "test_boot", 2, 4, True, False)
    assert "maxBytes" not in boot


def test_given_fields_override_defaults_and_null_means_omitted():
    plan = plan_for({"impact": "stopped", "placement": "offline", "passes": 20, "kernelPasses": 17,
                     "bitFade": False, "holdOnFailure": True, "timeBudgetSeconds": 60, "maxBytes": 1 << 30})
    assert (plan["passes"], plan["kernelPasses"], plan["bitFade"], plan["holdOnFailure"],
            plan["timeBudgetSeconds"], plan["maxBytes"]) == (20, 17, False, True, 60, 1 << 30)
    assert plan_for({"bitFade": True})["bitFade"] is True  # Live may enable idle decay
    assert plan_for({"passes": None, "maxBytes": None}) == LIVE


@pytest.mark.parametrize("request_, field", [
    ({"impact": "running", "placement": "offline"}, "placement"),
    ({"placement": "offline"}, "placement"),  # impact defaults to running
    ({"passes": 0}, "passes"), ({"passes": 21}, "passes"), ({"passes": 1.5}, "passes"), ({"passes": "2"}, "passes"),
    ({"passes": True}, "passes"),
    ({"impact": "stopped", "placement": "offline", "kernelPasses": 18}, "kernelPasses"),
    ({"impact": "stopped", "placement": "offline", "kernelPasses": 0}, "kernelPasses"),
    ({"timeBudgetSeconds": 59}, "timeBudgetSeconds"), ({"timeBudgetSeconds": 43201}, "timeBudgetSeconds"),
    ({"maxBytes": 0}, "maxBytes"), ({"maxBytes": -1}, "maxBytes"),
    ({"impact": "sideways"}, "impact"), ({"placement": "moon"}, "placement"),
    ({"quick": "yes"}, "quick"), ({"bitFade": 1}, "bitFade"),
    ({"impact": "stopped", "quick": True}, "quick"),
    ({"kernelPasses": 4}, "kernelPasses"), ({"impact": "stopped", "holdOnFailure": True}, "holdOnFailure"),
    ({"quick": True, "passes": 2}, "passes"), ({"quick": True, "bitFade": True}, "bitFade"),
    ({"mode": "live"}, "mode"), ({"extra": 1}, "extra"),
])
def test_invalid_requests_name_the_field(request_, field):
    with pytest.raises(PlanInvalid) as info:
        plan_for(request_)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


# -- the machine --------------------------------------------------------------------------------------
def status(run_id: str, phase: str = "testing", plan=LIVE, **kw) -> dict:
    return {"runId": run_id, "plan": plan, "phase": phase, "pass": 1, "passes": plan["passes"],
            "pattern": "walking_ones", "coverageBytes": 50, "totalBytes": 100, "rateBps": 1e9,
            "errors": 0, "confirmedErrors": 0, "tempMilliC": 45000, **kw}


def result(run_id: str, outcome: str = "pass", verdict: str = "ok", plan=LIVE, **kw) -> dict:
    return {"runId": run_id, "plan": plan, "outcome": outcome, "verdict": verdict, "errorCount": 0,
            "testedBytes": 100, "coverageBytes": 100, "totalBytes": 100, "startedAt": "2026-01-05T12:00:00.000Z",
            **kw}


def running(plan=LIVE, run_id="r1", accepted_at: float = 0) -> MemtestMachine:
    m = MemtestMachine()
    assert m.handle(Start(run_id, plan, BOTH), at(accepted_at)) == [SendStart(run_id, plan)]
    m.handle(StartAccepted(status(run_id, "preparing", plan)), at(accepted_at))
    assert m.state is RunState.RUNNING
    return m


def test_start_sends_and_acceptance_records_the_run():
    m = MemtestMachine()
    effects = m.handle(Start("r1", FULL, BOTH), T0)
    assert effects == [SendStart("r1", FULL)] and m.state is RunState.STARTING
    assert m.workload_held, "a full online start in flight already holds the workload"
    effects = m.handle(StartAccepted({"runId": "r1", "phase": "stopping_workload"}), at(1))
    assert m.state is RunState.RUNNING and m.last_accepted_at == at(1)
    assert m.status == {"runId": "r1", "plan": FULL, "phase": "stopping_workload"}
    # The shell stores an accepted run before the caller hears 202; the machine only publishes it.
    assert [type(e) for e in effects] == [Publish] and effects[0].payload["phase"] == "stopping_workload"


def test_second_start_is_busy_with_the_running_status():
    m = running()
    m.handle(Progress(status("r1", pattern="checkerboard")), at(1))
    before = copy.deepcopy(vars(m))
    with pytest.raises(Busy) as info:
        m.handle(Start("r2", LIVE, BOTH), at(60))
    assert info.value.status["runId"] == "r1" and info.value.status["pattern"] == "checkerboard"
    assert vars(m) == before, "a refusal changes nothing"


def test_start_while_one_is_in_flight_is_busy():
    m = MemtestMachine()
    m.handle(Start("r1", LIVE, BOTH), T0)
    with pytest.raises(Busy) as info:
        m.handle(Start("r2", LIVE, BOTH), T0)
    assert info.value.status == {"runId": "r1", "plan": LIVE, "phase": "preparing"}


def test_a_start_within_five_seconds_of_an_accepted_one_is_too_soon():
    m = running(accepted_at=0)
    m.handle(Finished(result("r1")), at(2))
    assert m.state is RunState.IDLE
    with pytest.raises(TooSoon) as info:
        m.handle(Start("r2", LIVE, BOTH), at(3.5))
    assert info.value.retry_after == pytest.approx(1.5)
    with pytest.raises(TooSoon):
        m.handle(Start("r2", LIVE, BOTH), at(4.999))
    assert m.handle(Start("r2", LIVE, BOTH), at(5)) == [SendStart("r2", LIVE)]


def test_a_refused_start_does_not_count_for_the_rate():
    m = MemtestMachine()
    m.handle(Start("r1", LIVE, BOTH), T0)
    assert m.handle(StartRefused(None), at(0.1)) == [] and m.state is RunState.IDLE and m.status is None
    assert m.handle(Start("r2", LIVE, BOTH), at(0.2)) == [SendStart("r2", LIVE)]


def test_device_busy_refusal_adopts_the_devices_running_test():
    m = MemtestMachine()
    m.handle(Start("r2", LIVE, BOTH), T0)
    m.handle(StartRefused(status("other")), at(1))
    assert m.state is RunState.RUNNING and m.status["runId"] == "other"


def test_unsupported_modes_are_refused_with_the_boards_reason():
    boot = plan_for({"impact": "stopped", "placement": "offline"})
    with pytest.raises(Unsupported) as info:
        MemtestMachine().handle(Start("r1", boot, ONLINE_ONLY), T0)
    assert str(info.value) == "test boot is not supported by this board's bootloader yet"
    with pytest.raises(Unsupported) as info:
        MemtestMachine().handle(Start("r1", boot, {"online": True, "offline": False}), T0)
    assert str(info.value) == mm.TEST_BOOT_UNSUPPORTED
    with pytest.raises(Unsupported) as info:
        MemtestMachine().handle(Start("r1", LIVE, {"online": False, "offline": False}), T0)
    assert str(info.value) == mm.NO_MEMORY_TEST
    assert MemtestMachine().handle(Start("r1", boot, BOTH), T0) == [SendStart("r1", boot)]


def test_cancel_forwards_and_names_a_wrong_run():
    m = running()
    assert m.handle(Cancel(None), at(1)) == [SendCancel(None)]
    assert m.handle(Cancel("r1"), at(1)) == [SendCancel("r1")]
    with pytest.raises(NotRunning):
        m.handle(Cancel("r9"), at(1))
    # The hub knows of nothing running: the device decides (it may run a test the hub missed).
    assert MemtestMachine().handle(Cancel(None), T0) == [SendCancel(None)]
    starting = MemtestMachine()
    starting.handle(Start("r1", LIVE, BOTH), T0)
    with pytest.raises(Busy):
        starting.handle(Cancel(None), T0)


def test_progress_is_published_as_an_operation_of_kind_memory_test():
    m = running()
    effects = m.handle(Progress(status("r1", phase="testing", pattern="bit_flip", errors=3, confirmedErrors=1)), at(2))
    assert effects == [Publish({"kind": "memory_test", "runId": "r1", "phase": "testing", "pass": 1, "passes": 1,
                                "pattern": "bit_flip", "coverage": 0.5, "coverageBytes": 50, "totalBytes": 100,
                                "progress": None, "testedBytes": None,
                                "rate": 1e9, "etaSeconds": None, "errors": 3, "confirmedErrors": 1,
                                "temperature": 45.0})]


def test_result_ends_the_run_stores_it_and_keeps_the_last_status():
    m = running(FULL)
    assert m.workload_held
    effects = m.handle(Finished(result("r1", "fail", "weak_cells", FULL, errorCount=7)), at(30))
    assert effects[0] == StoreResult(result("r1", "fail", "weak_cells", FULL, errorCount=7))
    assert m.state is RunState.IDLE and not m.workload_held and m.running is None
    assert m.status["phase"] == "failed" and m.status["errors"] == 7
    published = next(e for e in effects if isinstance(e, Publish)).payload
    assert (published["outcome"], published["verdict"], published["phase"]) == ("fail", "weak_cells", "failed")
    # the device sends it again (at its next link, until acknowledged): stored again, nothing else
    again = m.handle(Finished(result("r1", "fail", "weak_cells", FULL, errorCount=7)), at(31))
    assert again == [StoreResult(result("r1", "fail", "weak_cells", FULL, errorCount=7))]


def test_an_older_result_resent_later_is_stored_but_does_not_replace_the_last_run():
    m = running(run_id="new")
    m.handle(Finished(result("new", startedAt="2026-01-05T13:00:00.000Z")), at(10))
    effects = m.handle(Finished(result("old", "interrupted", startedAt="2026-01-05T11:00:00.000Z")), at(11))
    assert effects == [StoreResult(result("old", "interrupted", startedAt="2026-01-05T11:00:00.000Z"))]
    assert m.status["runId"] == "new"


def test_hello_and_status_reads_correct_the_hubs_view():
    m = MemtestMachine()
    m.handle(Observed(status("boot1", "kernel_sweep", FULL)), T0)  # a test boot's maintenance, say
    assert m.state is RunState.RUNNING and m.workload_held
    m.handle(Observed(None), at(5))  # the device reconnected without a running test
    assert m.state is RunState.IDLE and not m.workload_held


def test_terminal_progress_ends_the_run():
    m = running()
    m.handle(Progress(status("r1", phase="cancelled")), at(3))
    assert m.state is RunState.IDLE and m.status["phase"] == "cancelled"


def test_reset_forgets_a_start_whose_answer_was_lost():
    m = MemtestMachine()
    m.handle(Start("r1", LIVE, BOTH), T0)
    m.handle(Reset(), at(1))
    assert m.state is RunState.IDLE
    r = running()
    r.handle(Reset(), at(1))
    assert r.state is RunState.RUNNING, "a running test is the device's, not lost with the actor"


@pytest.mark.parametrize("state", [RunState.IDLE, RunState.RUNNING])
def test_a_refusal_is_illegal_outside_starting(state):
    m = running() if state is RunState.RUNNING else MemtestMachine()
    before = copy.deepcopy(vars(m))
    assert StartRefused not in TRANSITIONS[state]
    with pytest.raises(mm.IllegalTransition):
        m.handle(StartRefused(None), T0)
    assert vars(m) == before


def test_an_acceptance_after_the_runs_own_result_only_records_the_start_rate():
    m = MemtestMachine()
    m.handle(Start("r1", LIVE, BOTH), T0)
    m.handle(Progress(status("r1", "testing")), at(0.1))
    m.handle(Finished(result("r1")), at(0.2))  # a very short run: its result came first
    assert m.state is RunState.IDLE
    assert m.handle(StartAccepted(status("r1", "preparing")), at(0.3)) == []
    assert m.state is RunState.IDLE and m.status["phase"] == "done" and m.last_accepted_at == at(0.3)
    with pytest.raises(TooSoon):
        m.handle(Start("r2", LIVE, BOTH), at(1))


def test_a_stale_progress_after_the_end_does_not_revive_the_run():
    m = running()
    m.handle(Finished(result("r1")), at(5))
    assert m.handle(Progress(status("r1", "testing")), at(5.1)) == []
    assert m.state is RunState.IDLE and m.status["phase"] == "done"


# -- MemoryFault and diagnosis ----------------------------------------------------------------------------
def test_memory_fault_rules():
    assert mf.memory_fault(retired=32, bad_bytes=1024 * 1024, verdict="weak_cells") is None
    assert "33 pages retired" in mf.memory_fault(retired=33, bad_bytes=0, verdict="ok")["reason"]
    assert "bytes of distinct memory bad" in mf.memory_fault(retired=0, bad_bytes=1024 * 1024 + 1, verdict=None)["reason"]
    for verdict in ("data_line", "address_line"):
        fault = mf.memory_fault(retired=0, bad_bytes=0, verdict=verdict, since="2026-01-05T12:00:00.000Z")
        assert fault["type"] == "MemoryFault" and fault["severity"] == "critical" and fault["verdict"] == verdict
        assert fault["since"] == "2026-01-05T12:00:00.000Z"
    for verdict in ("ok", "weak_cells", "thermal", "unknown"):
        assert mf.memory_fault(retired=0, bad_bytes=0, verdict=verdict) is None


def test_bad_pages_counts_distinct_pages_from_every_source():
    r = {"retired": [0x1000, 0x1000, 0x2004], "pages": [{"physAddr": 0x3000, "confirmed": True},
                                                        {"physAddr": 0x4000, "confirmed": False},
                                                        {"page": 0x7000, "physAddr": None, "confirmed": True}],
         "kernel": {"passes": 4, "badRanges": [{"start": 0x10000, "end": 0x12000}]}}
    assert mf.bad_pages(r) == {0x1000, 0x2000, 0x3000, 0x7000, 0x10000, 0x11000}


def test_diagnosis_reports_fault_as_critical_and_an_interruption_as_a_warning():
    fault = mf.memory_fault(retired=40, bad_bytes=0, verdict="ok", since="2026-01-05T12:00:00.000Z")
    interrupted = {"runId": "r7", "outcome": "interrupted",
                   "interrupted": {"phase": "testing", "pass": 2, "pattern": "moving_inversions"}}
    issues = mf.diagnosis([{"type": "Other"}, fault], interrupted)
    assert [(i["severity"], i["code"]) for i in issues] == [("critical", "MemoryFault"),
                                                            ("warning", "MemoryTestInterrupted")]
    assert "phase testing, pass 2, pattern moving_inversions" in issues[1]["message"]
    assert mf.diagnosis([], result("r8")) == []


def test_a_failed_test_boot_holding_in_maintenance_holds_the_workload():
    """Phase failed, step holding (issue 15 §1: holding is not a spec phase): rollouts still defer."""
    m = mm.MemtestMachine()
    m.handle(mm.Observed({"runId": "b", "plan": {"impact": "stopped"}, "phase": "failed", "step": "holding"}), T0)
    assert m.state is mm.RunState.IDLE and m.workload_held
    m.handle(mm.Observed({"runId": "b", "plan": {"impact": "stopped"}, "phase": "done", "step": None}), T0)
    assert not m.workload_held


def test_phases_and_verdicts_of_an_older_agent_read_as_the_spec_names_them():
    from device_client.shared.protocol import MEMTEST_PHASES, memtest_phase, memtest_result, memtest_status

    assert memtest_phase("patterns") == ("testing", "patterns")
    assert memtest_phase("idle_decay") == ("testing", "idle_decay")
    assert memtest_phase("holding") == ("failed", "holding")
    assert memtest_phase("confirming", None) == ("confirming", None)
    assert memtest_phase("teleporting")[0] == "interrupted"
    assert all(memtest_phase(p)[0] == p for p in MEMTEST_PHASES)
    assert memtest_status({"phase": "patterns", "pattern": "x"}) == {"phase": "testing", "step": "patterns",
                                                                    "pattern": "x"}
    assert memtest_result({"verdict": None})["verdict"] == "unknown"
    assert memtest_result({"verdict": "thermal"})["verdict"] == "thermal"


def test_a_device_that_says_nothing_runs_ends_the_hubs_running_test_interrupted():
    """After a reboot the hello (or a status read) says nothing runs: the hub's running test ends as
    the spec's interrupted, not as its last progress (which would read testing for ever)."""
    m = running()
    effects = m.handle(Observed(None), at(5))
    assert m.state is RunState.IDLE and m.running is None
    assert m.status["runId"] == "r1" and m.status["phase"] == "interrupted"
    assert mm.SaveStatus(m.status) in effects and any(isinstance(e, Publish) for e in effects)
    # the device's own word on that run wins when it has one
    m = running()
    m.handle(Observed(status("r1", "cancelled")), at(5))
    assert m.state is RunState.IDLE and m.status["phase"] == "cancelled"
    # the result the device sends next still completes the record
    m = running()
    m.handle(Observed(None), at(5))
    m.handle(Finished(result("r1", "interrupted")), at(6))
    assert m.status["phase"] == "interrupted" and m.status["outcome"] == "interrupted"


def test_an_online_test_a_hello_reports_after_a_reboot_is_stale_and_ends_interrupted():
    m = running()
    m.handle(Observed(status("r1", "testing"), rebooted=True), at(5))
    assert m.state is RunState.IDLE and m.status["phase"] == "interrupted"
    # a test boot is what runs after its own reboot
    m = MemtestMachine()
    m.handle(Observed(status("b1", "kernel_sweep", plan_for({"impact": "stopped", "placement": "offline"})),
                      rebooted=True), at(5))
    assert m.state is RunState.RUNNING
    # without a reboot the device's word stands
    m = running()
    m.handle(Observed(status("r1", "testing")), at(5))
    assert m.state is RunState.RUNNING


def test_progress_is_the_share_of_planned_work_while_coverage_fills_in_the_first_sweep():
    # 3 of 13 sweeps of a 100-byte region verified: every byte touched, a quarter of the work done
    st = status("r1", testedBytes=300, coverageBytes=100, rateBps=100, etaSeconds=10)
    assert (progress(st), operation(st)["coverage"]) == (round(300 / 1300, 4), 1.0)
    assert progress(status("r1", phase="done", testedBytes=1300, etaSeconds=0)) == 1.0
    assert progress(status("r1", testedBytes=0, rateBps=0, etaSeconds=None)) is None  # nothing to plan by yet
    assert progress(None) is None
