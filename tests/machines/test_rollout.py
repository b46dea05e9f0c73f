"""The rollout machine, no IO: batches, canary, thresholds, windows, memory-test deferral, pause,
resume and cancel — with exact instants."""

from __future__ import annotations

import copy
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


def test_devices_released_by_a_cancel_are_pending_again_and_the_rollout_waits_on_none():
    # Storage gave them back the version they run (storage/rollouts.py release): left updating, a
    # cancelled rollout would wait on them forever (their device rows no longer name its version).
    m = machine(25, batch_size=10)
    m.handle(rm.Tick(views(m)), T0)  # the canary d000, d001 updating (say offline: never sent)
    m.handle(rm.Cancel(), T0)
    assert m.has_in_flight()
    later = T0 + dt.timedelta(seconds=1)
    changed = m.released(["d000", "d001", "d005"], later)  # d005 was never started: unchanged
    assert [(s.device_id, s.step, s.updated_at) for s in changed] == [
        ("d000", rm.Step.PENDING, later), ("d001", rm.Step.PENDING, later)]
    assert not m.has_in_flight() and m.state is rm.RolloutState.CANCELLED
    assert m.released(["d000"], later) == []


def test_a_failed_result_counts_against_the_failure_threshold_like_a_rejection():
    # "failed" is the hub's verdict on an apply that went unanswered or came back malformed: it must
    # not leave the device in flight (the rollout would wait forever) but count as a failure.
    m = machine(25, batch_size=10, failure_threshold=0.1, success_threshold=0.5)
    m.handle(rm.Tick(views(m)), T0)
    m.handle(rm.Tick(applied(m, ["d000", "d001"])), T0)  # batch 1 started: d002..d011
    out = results(m, ok=["d000", "d001"])
    out["d002"] = rm.DeviceView(online=True, result="failed", error="the device did not answer config.apply")
    out["d003"] = rm.DeviceView(online=True, result="failed")
    m.handle(rm.Tick(out), T0)
    assert m.steps["d002"].step is rm.Step.FAILED and m.steps["d002"].error == "the device did not answer config.apply"
    assert m.steps["d003"].step is rm.Step.FAILED and m.steps["d003"].error == "the version was not applied"
    assert m.state is rm.RolloutState.PAUSED and m.reason == "2 of 4 updated devices failed, above the failure threshold"


def test_every_result_a_device_view_can_carry_settles_the_device():
    for result, step in (("applied", rm.Step.SUCCEEDED), ("rejected", rm.Step.FAILED), ("failed", rm.Step.FAILED)):
        m = machine(1, failure_threshold=1.0)
        m.handle(rm.Tick(views(m)), T0)
        m.handle(rm.Tick({"d000": rm.DeviceView(online=True, result=result)}), T0)
        assert m.steps["d000"].step is step, result
        assert m.state is (rm.RolloutState.COMPLETED if step is rm.Step.SUCCEEDED else rm.RolloutState.FAILED)


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


# -- the whole table: every legal (state, key) and every illegal (state, event type) ---------------
def fresh(n: int = 2, **kw) -> rm.RolloutMachine:
    """Created, not started (PENDING)."""
    ids = [f"d{i:03}" for i in range(n)]
    steps = [rm.DeviceStep(d, "f1", b, rm.Step.PENDING)
             for b, batch in enumerate(rm.plan_batches(ids, batch_size=kw.get("batch_size", 10), force=False))
             for d in batch]
    return rm.RolloutMachine(steps=steps, force=False, window_open=lambda f, t: True, next_window=lambda f, t: None)


def running_tick(m, **tick):
    """A running machine after its first tick (the canary started), and the event to feed it."""
    m.handle(rm.Tick(views(m)), T0)
    return m, rm.Tick(results(m, **tick))


def paused():
    m = machine(2)
    m.handle(rm.Pause(), T0)
    return m


def completed():
    m, tick = running_tick(machine(1), ok=["d000"])
    m.handle(tick, T0)
    return m


def failed():
    m, tick = running_tick(machine(2, batch_size=None, force=True), ok=["d000"], bad=["d001"])
    m.handle(tick, T0)
    return m


def cancelled():
    m = machine(2)
    m.handle(rm.Cancel(), T0)
    return m


def failures_over_threshold():
    m = machine(25, batch_size=10, failure_threshold=0.1, success_threshold=0.5)
    m.handle(rm.Tick(views(m)), T0)
    m.handle(rm.Tick(applied(m, ["d000", "d001"])), T0)
    return m, rm.Tick(results(m, ok=["d000", "d001"], bad=["d002", "d003"]))


def batch_below_threshold():
    m = machine(25, batch_size=10, failure_threshold=1.0, success_threshold=0.9)
    m.handle(rm.Tick(views(m)), T0)
    m.handle(rm.Tick(applied(m, ["d000", "d001"])), T0)
    batch1 = [f"d{i:03}" for i in range(2, 12)]
    return m, rm.Tick(results(m, ok=["d000", "d001", *batch1[:8]], bad=batch1[8:]))


S = rm.RolloutState
# (state, build -> (machine in that state, event), key, next state, reason after)
TABLE_CASES = [
    (S.PENDING, lambda: (fresh(), rm.Start()), rm.Start, S.RUNNING, None),
    (S.PENDING, lambda: (fresh(), rm.Cancel()), rm.Cancel, S.CANCELLED, "cancelled by an operator"),
    (S.PENDING, lambda: (fresh(), rm.Tick({})), rm.Tick, S.PENDING, None),
    (S.RUNNING, lambda: ((m := machine(25)), rm.Tick(views(m))), rm.Tick, S.RUNNING, None),
    (S.RUNNING, lambda: running_tick(machine(25), ok=["d000"], bad=["d001"]), (rm.Tick, rm.CANARY_FAILED),
     S.PAUSED, "the canary batch failed"),
    (S.RUNNING, failures_over_threshold, (rm.Tick, rm.FAILURES_OVER_THRESHOLD), S.PAUSED,
     "2 of 4 updated devices failed, above the failure threshold"),
    (S.RUNNING, batch_below_threshold, (rm.Tick, rm.BATCH_BELOW_THRESHOLD), S.PAUSED,
     "batch 1 is below the success threshold"),
    (S.RUNNING, lambda: running_tick(machine(1), ok=["d000"]), (rm.Tick, rm.SETTLED), S.COMPLETED, None),
    (S.RUNNING, lambda: running_tick(machine(2, batch_size=None, force=True), ok=["d000"], bad=["d001"]),
     (rm.Tick, rm.SETTLED_WITH_FAILURES), S.FAILED, None),
    (S.RUNNING, lambda: (machine(2), rm.Pause("hold on")), rm.Pause, S.PAUSED, "hold on"),
    (S.RUNNING, lambda: (machine(2), rm.Cancel()), rm.Cancel, S.CANCELLED, "cancelled by an operator"),
    (S.PAUSED, lambda: ((m := paused()), rm.Tick(views(m))), rm.Tick, S.PAUSED, "paused by an operator"),
    (S.PAUSED, lambda: (paused(), rm.Resume()), rm.Resume, S.RUNNING, None),
    (S.PAUSED, lambda: (paused(), rm.Cancel()), rm.Cancel, S.CANCELLED, "cancelled by an operator"),
    (S.PAUSED, lambda: (paused(), rm.Pause("again")), rm.Pause, S.PAUSED, "paused by an operator"),
    (S.COMPLETED, lambda: (completed(), rm.Tick({})), rm.Tick, S.COMPLETED, None),
    (S.FAILED, lambda: (failed(), rm.Tick({})), rm.Tick, S.FAILED, None),
    (S.CANCELLED, lambda: (cancelled(), rm.Tick({})), rm.Tick, S.CANCELLED, "cancelled by an operator"),
]
EVENTS = {rm.Start: rm.Start(), rm.Tick: rm.Tick({}), rm.Pause: rm.Pause(), rm.Resume: rm.Resume(),
          rm.Cancel: rm.Cancel()}
SETUPS = {S.PENDING: fresh, S.RUNNING: machine, S.PAUSED: paused, S.COMPLETED: completed,
          S.FAILED: failed, S.CANCELLED: cancelled}
ILLEGAL = [(state, kind) for state in S for kind in EVENTS
           if not any(rm.event_type(key) is kind for key in rm.TRANSITIONS[state])]


def _key_name(key) -> str:
    return key.__name__ if isinstance(key, type) else f"{key[0].__name__}.{key[1]}"


def test_table_cases_cover_exactly_the_transition_table():
    pairs = [(c[0], c[2]) for c in TABLE_CASES]
    assert len(pairs) == len(set(pairs))
    assert set(pairs) == {(state, key) for state, row in rm.TRANSITIONS.items() for key in row}
    assert set(rm.TRANSITIONS) == set(S)
    assert set(ILLEGAL) == {(S.PENDING, rm.Pause), (S.PENDING, rm.Resume), (S.RUNNING, rm.Start),
                            (S.RUNNING, rm.Resume), (S.PAUSED, rm.Start),
                            *((s, k) for s in (S.COMPLETED, S.FAILED, S.CANCELLED)
                              for k in (rm.Start, rm.Pause, rm.Resume, rm.Cancel))}


@pytest.mark.parametrize(("state", "build", "key", "after", "reason"), TABLE_CASES,
                         ids=[f"{c[0].name}-{_key_name(c[2])}" for c in TABLE_CASES])
def test_table_transition(state, build, key, after, reason):
    m, event = build()
    assert m.state is state
    changed = after is not state
    effects = m.handle(event, T0)
    assert m.state is after is rm.TRANSITIONS[state][key] and m.reason == reason
    saved = [e for e in effects if isinstance(e, rm.SaveRollout) and e.state is after]
    announced = [e for e in effects if isinstance(e, rm.Publish) and e.kind == "rollout.state"]
    # a new state is saved and announced once, after everything else the event did; no change, no news
    assert len(announced) == (1 if changed else 0)
    if changed:
        assert saved and effects[-1] == announced[0] and announced[0].payload["state"] == after.value


def test_machine_setups_reach_their_states():
    for state, setup in SETUPS.items():
        assert (setup(2) if state is S.RUNNING else setup()).state is state


@pytest.mark.parametrize(("state", "kind"), ILLEGAL, ids=[f"{s.name}-{k.__name__}" for s, k in ILLEGAL])
def test_illegal_event_raises_and_changes_nothing_at_all(state, kind):
    m = SETUPS[state](2) if state is S.RUNNING else SETUPS[state]()
    before = copy.deepcopy({k: v for k, v in vars(m).items() if not callable(v)})
    with pytest.raises(rm.IllegalTransition):
        m.handle(EVENTS[kind], T0)
    assert {k: v for k, v in vars(m).items() if not callable(v)} == before


def test_an_unknown_event_is_illegal_in_every_state():
    for state, setup in SETUPS.items():
        m = setup(2) if state is S.RUNNING else setup()
        with pytest.raises(rm.IllegalTransition):
            m.handle(object(), T0)
        assert m.state is state


# -- partial failure (issue 38): lost tells, unreachable devices, a bus that is down ----------------
def resends(effects) -> list[str]:
    return [e.device_id for e in effects if isinstance(e, rm.Resend)]


def test_a_device_stuck_in_updating_is_sent_its_assignment_again_after_the_bound():
    m = machine(1, resend_after=dt.timedelta(seconds=15))
    assert updates(m.handle(rm.Tick(views(m)), T0)) == ["d000"]
    # the tell was lost: online, not applying, no result
    assert resends(m.handle(rm.Tick(views(m)), T0 + dt.timedelta(seconds=14))) == []
    effects = m.handle(rm.Tick(views(m)), T0 + dt.timedelta(seconds=15))
    assert resends(effects) == ["d000"] and updates(effects) == []  # the assignment stands: no re-assign
    assert m.steps["d000"].step is rm.Step.UPDATING and m.steps["d000"].updated_at == T0 + dt.timedelta(seconds=15)
    assert [s.device_id for e in effects if isinstance(e, rm.SaveSteps) for s in e.steps] == ["d000"]
    # the bound counts from the re-send, not from the first send
    assert resends(m.handle(rm.Tick(views(m)), T0 + dt.timedelta(seconds=29))) == []
    assert resends(m.handle(rm.Tick(views(m)), T0 + dt.timedelta(seconds=30))) == ["d000"]
    m.handle(rm.Tick(applied(m, ["d000"])), T0 + dt.timedelta(seconds=31))
    assert m.state is rm.RolloutState.COMPLETED


def test_no_resend_to_a_device_applying_answered_or_offline():
    m = machine(3, batch_size=None, resend_after=dt.timedelta(seconds=15))
    m.handle(rm.Tick(views(m)), T0)
    later = T0 + dt.timedelta(seconds=60)
    effects = m.handle(rm.Tick({"d000": rm.DeviceView(online=True, applying=True),
                                "d001": rm.DeviceView(online=False),
                                "d002": rm.DeviceView(online=True, result="applied")}), later)
    assert resends(effects) == []
    assert m.steps["d000"].step is rm.Step.VERIFYING and m.steps["d001"].step is rm.Step.UPDATING


def test_a_device_applying_past_the_hubs_own_bound_is_sent_its_assignment_again():
    # The apply that said "applying" was lost with its node: no verdict will ever come from it.
    m = machine(1, resend_after=dt.timedelta(seconds=15), applying_after=dt.timedelta(seconds=135))
    m.handle(rm.Tick(views(m)), T0)
    applying = {"d000": rm.DeviceView(online=True, applying=True)}
    m.handle(rm.Tick(applying), T0 + dt.timedelta(seconds=1))
    assert m.steps["d000"].step is rm.Step.VERIFYING
    assert resends(m.handle(rm.Tick(applying), T0 + dt.timedelta(seconds=135))) == []
    effects = m.handle(rm.Tick(applying), T0 + dt.timedelta(seconds=136))
    assert resends(effects) == ["d000"] and m.steps["d000"].step is rm.Step.UPDATING
    # the bound counts again from the re-send; the device's answer ends it
    assert resends(m.handle(rm.Tick(applying), T0 + dt.timedelta(seconds=137))) == []
    m.handle(rm.Tick(applied(m, ["d000"])), T0 + dt.timedelta(seconds=138))
    assert m.state is rm.RolloutState.COMPLETED and m.counts()["failed"] == 0


def test_a_verifying_device_whose_apply_never_reached_it_is_updating_again_and_resent():
    # The apply did not reach the device (the bus was down): storage says pending again, not failed.
    m = machine(1, resend_after=dt.timedelta(seconds=15))
    m.handle(rm.Tick(views(m)), T0)
    m.handle(rm.Tick({"d000": rm.DeviceView(online=True, applying=True)}), T0 + dt.timedelta(seconds=1))
    assert m.steps["d000"].step is rm.Step.VERIFYING
    assert resends(m.handle(rm.Tick(views(m)), T0 + dt.timedelta(seconds=10))) == []
    effects = m.handle(rm.Tick(views(m)), T0 + dt.timedelta(seconds=16))
    assert resends(effects) == ["d000"] and m.steps["d000"].step is rm.Step.UPDATING
    assert m.state is rm.RolloutState.RUNNING and m.counts()["failed"] == 0


def test_an_unreachable_device_is_not_failed_and_the_rollout_waits_on_it():
    m = machine(4, batch_size=2)  # canary 1, then 2, then 1
    m.handle(rm.Tick(views(m)), T0)
    m.handle(rm.Tick(applied(m, ["d000"])), T0 + dt.timedelta(seconds=1))
    assert m.current_batch == 1
    for i in range(2, 60):  # a device of batch 1 cannot be reached for a minute
        m.handle(rm.Tick({**applied(m, ["d000", "d001"]), "d002": rm.DeviceView(online=False)}),
                 T0 + dt.timedelta(seconds=i))
    assert m.steps["d002"].step is rm.Step.UPDATING and m.state is rm.RolloutState.RUNNING
    assert m.current_batch == 1 and m.counts()["failed"] == 0


def test_with_the_bus_down_no_batch_starts_no_device_starts_and_nothing_is_resent():
    m = machine(3, batch_size=1, resend_after=dt.timedelta(seconds=15))  # batches of one each
    m.handle(rm.Tick(views(m)), T0)
    # the canary settled while the owner is cut off from NATS: batch 1 waits
    effects = m.handle(rm.Tick(applied(m, ["d000"]), bus_up=False), T0 + dt.timedelta(seconds=1))
    assert m.current_batch == 0 and updates(effects) == [] and m.steps["d001"].step is rm.Step.PENDING
    assert m.steps["d000"].step is rm.Step.SUCCEEDED  # results are still read
    # the bus is back: it starts
    effects = m.handle(rm.Tick(applied(m, ["d000"])), T0 + dt.timedelta(seconds=2))
    assert m.current_batch == 1 and updates(effects) == ["d001"]
    # stuck past the bound while the bus is down: no re-send (it could be lost too); after: re-sent
    assert resends(m.handle(rm.Tick(applied(m, ["d000"]), bus_up=False), T0 + dt.timedelta(seconds=30))) == []
    assert resends(m.handle(rm.Tick(applied(m, ["d000"])), T0 + dt.timedelta(seconds=31))) == ["d001"]


def test_with_the_bus_down_a_settled_rollout_still_ends():
    m = machine(1)
    m.handle(rm.Tick(views(m)), T0)
    m.handle(rm.Tick(applied(m, ["d000"]), bus_up=False), T0 + dt.timedelta(seconds=1))
    assert m.state is rm.RolloutState.COMPLETED


def test_a_cancelled_rollout_sends_nothing_again():
    m = machine(1, resend_after=dt.timedelta(seconds=15))
    m.handle(rm.Tick(views(m)), T0)
    m.handle(rm.Cancel(), T0 + dt.timedelta(seconds=1))
    assert resends(m.handle(rm.Tick(views(m)), T0 + dt.timedelta(seconds=60))) == []
