"""hub/mcp/follow.py: events read into progress steps (pure, no hub)."""

from __future__ import annotations

from hub.mcp import follow


def op(run_id: str, **payload) -> dict:
    return {"kind": "device.operation", "payload": {"kind": "memory_test", "runId": run_id, **payload}}


def test_a_memory_test_event_of_another_run_or_kind_is_not_a_step():
    assert follow.memory_test_step(op("r2", phase="testing", progress=0.5), "r1") is None
    assert follow.memory_test_step({"kind": "device.state", "payload": {"state": "online"}}, "r1") is None


def test_unfinished_work_stays_below_one_and_its_end_is_one():
    step = follow.memory_test_step(op("r1", phase="testing", progress=1.0, passes=2, **{"pass": 2}), "r1")
    assert step is not None and not step.ended and step.progress == follow.UNFINISHED_AT_MOST
    assert "pass 2/2" in step.message
    end = follow.memory_test_step(op("r1", phase="done", progress=None, outcome="pass"), "r1")
    assert end is not None and end.ended and end.progress == 1.0 and "outcome pass" in end.message
    assert follow.memory_test_step(op("r1", phase="preparing"), "r1").progress is None


def test_a_run_in_the_status_history_has_ended():
    status = {"data": {"status": {"runId": "r2", "phase": "testing"}, "history": [{"runId": "r1", "phase": "done"}]}}
    assert follow.memory_test_status_step(status, "r1").ended
    assert follow.memory_test_status_step(status, "r2") is None


def test_a_rollout_is_as_far_as_its_devices_and_ends_on_a_final_or_paused_state():
    counts = {"pending": 2, "updating": 1, "succeeded": 1, "failed": 0, "ineligible": 0}
    step = follow.rollout_step({"kind": "rollout.progress", "payload": {"counts": counts}}, "running")
    assert step.progress == 0.25 and not step.ended and step.message == "rollout running: 1/4 devices done"
    for state in ("completed", "paused"):
        done = follow.rollout_step({"kind": "rollout.state", "payload": {"state": state, "counts": counts}}, "running")
        assert done.ended and done.progress == 1.0
    assert follow.rollout_step({"kind": "device.state", "payload": {}}, "running") is None
