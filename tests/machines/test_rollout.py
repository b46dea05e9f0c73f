"""The rollout machine, no IO: batches, canary, thresholds, windows, memory-test deferral, pause,
resume and cancel — with exact instants."""

from __future__ import annotations

import datetime as dt

import pytest

from actors.machines import rollout as rm

T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.timezone.utc)
ONLINE = rm.DeviceView(online=True)


def machine(n: int, *, batch_size: int | None = 10, force: bool = False, open_at: dt.datetime | None = None,
            **kw) -> rm.RolloutMachine:
    ids = [f"d{i:03}" for i in range(n)]
    batches = rm.plan_batches(ids, batch_size=batch_size, force=force)
    steps = [rm.DeviceStep(d, "f1", b, rm.Step.PENDING) for b, batch in enumerate(batches) for d in batch]

    def window_open(fleet, at):
        return open_at is None or at >= open_at

    def next_window(fleet, at):
        return open_at if open_at is not None and at < open_at else None

    m = rm.RolloutMachine(steps=steps, force=force, window_open=window_open, next_window=next_window, **kw)
    m.handle(rm.Start(), T0)
    return m


def views(m, **override) -> dict[str, rm.DeviceView]:
    return {d: override.get(d, ONLINE) for d in m.steps}


def applied(m, ids, result="applied"):
    return results(m, ok=ids) if result == "applied" else results(m, bad=ids)


def results(m, ok=(), bad=(), **extra):
    """Every device online; ``ok`` applied the version, ``bad`` rejected it."""
    out = views(m)
    for d in ok:
        out[d] = rm.DeviceView(online=True, result="applied")
    for d in bad:
        out[d] = rm.DeviceView(online=True, result="rejected", error="health check failed")
    out.update(extra)
    return out


def updates(effects) -> list[str]:
    return [e.device_id for e in effects if isinstance(e, rm.Update)]


def test_plan_batches_canary_then_batch_size():
    ids = [str(i) for i in range(45)]
    batches = rm.plan_batches(ids, batch_size=10, force=False)
    assert [len(b) for b in batches] == [3, 10, 10, 10, 10, 2]  # canary 5% of 45 = 3
    assert sum(batches, []) == ids
    assert rm.plan_batches(ids, batch_size=10, force=True) == [ids]
    assert rm.plan_batches(["a"], batch_size=10, force=False) == [["a"]]
    assert rm.plan_batches([], batch_size=10, force=False) == []
    assert [len(b) for b in rm.plan_batches(ids[:4], batch_size=2, force=False)] == [1, 2, 1]


def test_canary_first_then_batches_each_after_the_previous_settled():
    m = machine(25, batch_size=10)  # batches: canary 2, then 10, 10, 3
    effects = m.handle(rm.Tick(views(m)), T0)
    assert updates(effects) == ["d000", "d001"]
    assert m.steps["d000"].step is rm.Step.UPDATING and m.steps["d002"].step is rm.Step.PENDING
    # the device started applying: verifying
    effects = m.handle(rm.Tick({**views(m), "d000": rm.DeviceView(online=True, applying=True)}), T0)
    assert m.steps["d000"].step is rm.Step.VERIFYING and updates(effects) == []
    effects = m.handle(rm.Tick(applied(m, ["d000", "d001"])), T0 + dt.timedelta(seconds=5))
    assert m.current_batch == 1 and updates(effects) == [f"d{i:03}" for i in range(2, 12)]
    assert m.steps["d000"].step is rm.Step.SUCCEEDED
    assert m.steps["d000"].updated_at == T0 + dt.timedelta(seconds=5)
    saved = [e for e in effects if isinstance(e, rm.SaveSteps)][0]
    assert {s.device_id for s in saved.steps} >= {"d000", "d001", "d002"}
    m.handle(rm.Tick(applied(m, [f"d{i:03}" for i in range(12)])), T0)
    m.handle(rm.Tick(applied(m, [f"d{i:03}" for i in range(22)])), T0)
    effects = m.handle(rm.Tick(applied(m, list(m.steps))), T0)
    assert m.state is rm.RolloutState.COMPLETED
    assert m.counts()["succeeded"] == 25
    assert any(isinstance(e, rm.SaveRollout) and e.state is rm.RolloutState.COMPLETED for e in effects)


def test_canary_failure_pauses_and_resume_accepts_it():
    m = machine(25, batch_size=10)
    m.handle(rm.Tick(views(m)), T0)
    effects = m.handle(rm.Tick(results(m, ok=["d000"], bad=["d001"])), T0)
    assert m.state is rm.RolloutState.PAUSED and m.reason == "the canary batch failed"
    assert m.steps["d001"].step is rm.Step.FAILED and m.steps["d001"].error == "health check failed"
    assert updates(effects) == [] and m.current_batch == 0
    # paused: nothing starts
    assert updates(m.handle(rm.Tick(views(m)), T0)) == []
    m.handle(rm.Resume(), T0)
    effects = m.handle(rm.Tick(views(m)), T0)
    assert m.state is rm.RolloutState.RUNNING and m.current_batch == 1 and len(updates(effects)) == 10


def test_failure_threshold_pauses_a_later_batch_and_in_flight_devices_finish():
    m = machine(25, batch_size=10, failure_threshold=0.1, success_threshold=0.5)
    m.handle(rm.Tick(views(m)), T0)
    m.handle(rm.Tick(applied(m, ["d000", "d001"])), T0)  # batch 1 started: d002..d011
    bad = [f"d{i:03}" for i in range(2, 4)]
    m.handle(rm.Tick(results(m, ok=["d000", "d001"], bad=bad)), T0)
    assert m.state is rm.RolloutState.PAUSED and "failure threshold" in m.reason
    # in-flight devices of the batch still finish while paused
    good = [f"d{i:03}" for i in range(4, 12)]
    m.handle(rm.Tick(results(m, ok=["d000", "d001", *good], bad=bad)), T0)
    assert all(m.steps[d].step is rm.Step.SUCCEEDED for d in good)
    assert m.current_batch == 1 and m.state is rm.RolloutState.PAUSED


def test_batch_below_success_threshold_pauses():
    m = machine(25, batch_size=10, failure_threshold=1.0, success_threshold=0.9)
    m.handle(rm.Tick(views(m)), T0)
    m.handle(rm.Tick(applied(m, ["d000", "d001"])), T0)
    batch1 = [f"d{i:03}" for i in range(2, 12)]
    m.handle(rm.Tick(results(m, ok=["d000", "d001", *batch1[:8]], bad=batch1[8:])), T0)
    assert m.state is rm.RolloutState.PAUSED and m.reason == "batch 1 is below the success threshold"


def test_out_of_window_devices_queue_and_start_when_the_window_opens():
    opens = T0 + dt.timedelta(hours=3)
    m = machine(3, batch_size=10, open_at=opens)
    effects = m.handle(rm.Tick(views(m)), T0)
    assert updates(effects) == [] and m.steps["d000"].step is rm.Step.QUEUED_MAINTENANCE
    assert m.next_deadline(T0) == opens
    assert updates(m.handle(rm.Tick(views(m)), opens - dt.timedelta(seconds=1))) == []
    effects = m.handle(rm.Tick(views(m)), opens)
    assert updates(effects) == ["d000"]  # canary first, then the rest once it succeeds
    m.handle(rm.Tick(applied(m, ["d000"])), opens)
    assert m.steps["d001"].step is rm.Step.UPDATING


def test_force_bypasses_the_window_and_updates_everything_at_once():
    m = machine(30, batch_size=None, force=True, open_at=T0 + dt.timedelta(days=2))
    effects = m.handle(rm.Tick(views(m)), T0)
    assert len(updates(effects)) == 30
    effects = m.handle(rm.Tick(results(m, ok=list(m.steps)[:29], bad=["d029"])), T0)
    assert m.state is rm.RolloutState.FAILED  # settled with one failure; force never pauses


def test_memory_test_defers_without_failing_and_updates_after():
    m = machine(3, batch_size=10)  # canary d000, then d001, d002
    m.handle(rm.Tick(views(m)), T0)
    m.handle(rm.Tick(applied(m, ["d000"])), T0)
    held = rm.DeviceView(online=True, held=True)
    m.handle(rm.Tick(results(m, ok=["d000"], d001=held)), T0)
    assert m.steps["d001"].step is rm.Step.UPDATING  # it had already started; results decide
    m2 = machine(3, batch_size=10)
    effects = m2.handle(rm.Tick({**views(m2), "d000": held}), T0)
    assert m2.steps["d000"].step is rm.Step.DEFERRED_MEMORY_TEST
    # deferred is settled for the batch: the next batch starts at once, and it is not a failure
    assert m2.current_batch == 1 and set(updates(effects)) == {"d001", "d002"}
    assert updates(m2.handle(rm.Tick({**views(m2), "d000": held}), T0)) == []
    assert m2.counts()["failed"] == 0
    m2.handle(rm.Tick(results(m2, ok=["d001", "d002"], d000=held)), T0)
    assert m2.state is rm.RolloutState.RUNNING  # waits for the deferred device
    effects = m2.handle(rm.Tick(applied(m2, ["d001", "d002"])), T0)  # test ended
    assert updates(effects) == ["d000"]
    m2.handle(rm.Tick(applied(m2, list(m2.steps))), T0)
    assert m2.state is rm.RolloutState.COMPLETED


def test_offline_devices_wait_and_illegal_events_change_nothing():
    m = machine(2, batch_size=10)
    effects = m.handle(rm.Tick({"d000": rm.DeviceView(online=False), "d001": ONLINE}), T0)
    assert updates(effects) == [] and m.steps["d000"].step is rm.Step.PENDING
    m.handle(rm.Cancel(), T0)
    assert m.state is rm.RolloutState.CANCELLED
    before = (m.state, m.reason, m.current_batch)
    for event in (rm.Resume(), rm.Pause(), rm.Start(), rm.Cancel()):
        with pytest.raises(rm.IllegalTransition):
            m.handle(event, T0)
        assert (m.state, m.reason, m.current_batch) == before
    assert updates(m.handle(rm.Tick(views(m)), T0)) == []
