"""The memory-test machine's table (actors/machines/memtest.py): every legal (state, key) with its next
state, every refused pair with its error and nothing changed, every illegal (state, type) — as
tests/machines/test_connection.py does for its table. Behaviour in detail: test_memtest.py."""

from __future__ import annotations

import copy

import pytest

from actors.machines import memtest as mm
from actors.machines.memtest import (
    BUSY,
    BUSY_ENDED,
    ENDED,
    NOTHING,
    OTHER_RUN,
    STALE,
    TOO_SOON,
    UNSUPPORTED,
    Busy,
    Cancel,
    Finished,
    MemtestMachine,
    NotRunning,
    Observed,
    Progress,
    Reset,
    RunState,
    Start,
    StartAccepted,
    StartRefused,
    TooSoon,
    Unsupported,
)
from tests.machines.test_memtest import BOTH, LIVE, at, result, status

S = RunState
EVENT_TYPES = (Start, StartAccepted, StartRefused, Cancel, Progress, Observed, Finished, Reset)


def idle() -> MemtestMachine:
    return MemtestMachine()


def starting(t: float = 0) -> MemtestMachine:
    m = MemtestMachine()
    m.handle(Start("r1", LIVE, BOTH), at(t))
    return m


def running() -> MemtestMachine:
    m = starting()
    m.handle(StartAccepted(status("r1")), at(0))  # accepted at T0
    return m


def ended() -> MemtestMachine:
    """r1 ran (accepted at T0) and finished: idle, its status terminal."""
    m = running()
    m.handle(Finished(result("r1")), at(1))
    return m


def starting_after_early_end() -> MemtestMachine:
    m = starting()
    m.handle(Progress(status("r1", "done")), at(1))  # the start's run reported its end before the answer
    return m


def starting_soon_after_a_run() -> MemtestMachine:
    m = ended()  # accepted at T0
    m.handle(Start("r2", LIVE, BOTH), at(100))
    return m


NO_MEMTEST = {"online": False, "offline": False}
# (state, build -> machine in that state, event, time, key, next state)
CASES = [
    (S.IDLE, idle, Start("r1", LIVE, BOTH), 0, Start, S.STARTING),
    (S.IDLE, idle, StartAccepted(status("r1")), 0, StartAccepted, S.IDLE),
    (S.IDLE, idle, StartAccepted(status("r1", "done")), 0, (StartAccepted, ENDED), S.IDLE),
    (S.IDLE, idle, Cancel(None), 0, Cancel, S.IDLE),
    (S.IDLE, ended, Cancel("r9"), 9, (Cancel, OTHER_RUN), S.IDLE),
    (S.IDLE, idle, Progress(status("r1")), 0, Progress, S.RUNNING),
    (S.IDLE, idle, Progress(status("r1", "done")), 0, (Progress, ENDED), S.IDLE),
    (S.IDLE, ended, Progress(status("r1")), 9, (Progress, STALE), S.IDLE),
    (S.IDLE, idle, Observed(status("r1")), 0, Observed, S.RUNNING),
    (S.IDLE, ended, Observed(None), 9, (Observed, NOTHING), S.IDLE),
    (S.IDLE, ended, Finished(result("r1")), 9, Finished, S.IDLE),
    (S.IDLE, idle, Finished(result("r9")), 0, (Finished, OTHER_RUN), S.IDLE),
    (S.IDLE, ended, Reset(), 9, Reset, S.IDLE),
    (S.STARTING, starting, StartAccepted({"runId": "r1", "phase": "testing"}), 1, StartAccepted, S.RUNNING),
    (S.STARTING, starting, StartAccepted({"runId": "r1", "phase": "done"}), 1, (StartAccepted, ENDED), S.IDLE),
    (S.STARTING, starting, StartRefused(), 1, StartRefused, S.IDLE),
    (S.STARTING, starting, StartRefused(status("r0")), 1, (StartRefused, BUSY), S.RUNNING),
    (S.STARTING, starting, StartRefused(status("r0", "done")), 1, (StartRefused, BUSY_ENDED), S.IDLE),
    (S.STARTING, starting, Progress(status("r1")), 1, Progress, S.STARTING),
    (S.STARTING, starting, Progress(status("r1", "done")), 1, (Progress, ENDED), S.STARTING),
    (S.STARTING, starting_after_early_end, Progress(status("r1")), 2, (Progress, STALE), S.STARTING),
    (S.STARTING, starting, Observed(status("r0")), 1, Observed, S.STARTING),
    (S.STARTING, starting, Observed(None), 1, (Observed, NOTHING), S.STARTING),
    (S.STARTING, starting, Finished(result("r1")), 1, Finished, S.IDLE),
    (S.STARTING, starting, Finished(result("r0")), 1, (Finished, OTHER_RUN), S.STARTING),
    (S.STARTING, starting, Reset(), 1, Reset, S.IDLE),
    (S.RUNNING, running, StartAccepted(status("r1")), 1, StartAccepted, S.RUNNING),
    (S.RUNNING, running, StartAccepted(status("r1", "done")), 1, (StartAccepted, ENDED), S.RUNNING),
    (S.RUNNING, running, Cancel("r1"), 1, Cancel, S.RUNNING),
    (S.RUNNING, running, Progress(status("r1", pattern="checkerboard")), 1, Progress, S.RUNNING),
    (S.RUNNING, running, Progress(status("r1", "done")), 1, (Progress, ENDED), S.IDLE),
    (S.RUNNING, running, Observed(status("r1")), 1, Observed, S.RUNNING),
    (S.RUNNING, running, Observed(None), 1, (Observed, NOTHING), S.IDLE),
    (S.RUNNING, running, Finished(result("r1")), 1, Finished, S.IDLE),
    (S.RUNNING, running, Finished(result("r0")), 1, (Finished, OTHER_RUN), S.RUNNING),
    (S.RUNNING, running, Reset(), 1, Reset, S.RUNNING),
]

# (state, build, event, time, key, the error it is refused with)
REFUSED = [
    (S.IDLE, idle, Start("r1", LIVE, NO_MEMTEST), 0, (Start, UNSUPPORTED), Unsupported),
    (S.IDLE, ended, Start("r2", LIVE, BOTH), 4, (Start, TOO_SOON), TooSoon),
    (S.STARTING, starting, Start("r2", LIVE, BOTH), 1, Start, Busy),
    (S.STARTING, starting, Start("r2", LIVE, NO_MEMTEST), 1, (Start, UNSUPPORTED), Busy),
    (S.STARTING, starting_soon_after_a_run, Start("r3", LIVE, BOTH), 1, (Start, TOO_SOON), Busy),
    (S.STARTING, starting, Cancel(None), 1, Cancel, Busy),
    (S.STARTING, starting, Cancel("r0"), 1, (Cancel, OTHER_RUN), Busy),
    (S.RUNNING, running, Start("r2", LIVE, BOTH), 60, Start, Busy),
    (S.RUNNING, running, Start("r2", LIVE, NO_MEMTEST), 60, (Start, UNSUPPORTED), Busy),
    (S.RUNNING, running, Start("r2", LIVE, BOTH), 1, (Start, TOO_SOON), Busy),
    (S.RUNNING, running, Cancel("r0"), 1, (Cancel, OTHER_RUN), NotRunning),
]

ILLEGAL = [(state, kind) for state in S for kind in EVENT_TYPES
           if not any(mm.event_type(k) is kind for k in mm.TRANSITIONS[state])
           and not any(s is state and mm.event_type(k) is kind for s, k in mm.REFUSALS)]


def name(key) -> str:
    return key.__name__ if isinstance(key, type) else f"{key[0].__name__}.{key[1]}"


def test_cases_cover_exactly_the_table_and_the_refusals():
    pairs = [(c[0], c[4]) for c in CASES]
    assert len(pairs) == len(set(pairs)) and set(pairs) == {(s, k) for s, row in mm.TRANSITIONS.items() for k in row}
    refused = [(c[0], c[4]) for c in REFUSED]
    assert len(refused) == len(set(refused)) and set(refused) == set(mm.REFUSALS)
    assert not set(pairs) & set(refused)
    assert set(ILLEGAL) == {(S.IDLE, StartRefused), (S.RUNNING, StartRefused)}


@pytest.mark.parametrize(("state", "build", "event", "t", "key", "after"), CASES,
                         ids=[f"{c[0].name}-{name(c[4])}" for c in CASES])
def test_transition(state, build, event, t, key, after):
    m = build()
    assert m.state is state
    assert m.key(event, at(t)) == key
    m.handle(event, at(t))
    assert m.state is after is mm.TRANSITIONS[state][key]


@pytest.mark.parametrize(("state", "build", "event", "t", "key", "error"), REFUSED,
                         ids=[f"{c[0].name}-{name(c[4])}" for c in REFUSED])
def test_refusal_raises_its_error_and_changes_nothing(state, build, event, t, key, error):
    m = build()
    assert m.state is state and m.key(event, at(t)) == key
    before = copy.deepcopy(vars(m))
    with pytest.raises(error):
        m.handle(event, at(t))
    assert vars(m) == before


@pytest.mark.parametrize(("state", "kind"), ILLEGAL, ids=[f"{s.name}-{k.__name__}" for s, k in ILLEGAL])
def test_illegal_event_raises_and_changes_nothing(state, kind):
    m = {S.IDLE: idle, S.RUNNING: running}[state]()
    before = copy.deepcopy(vars(m))
    with pytest.raises(mm.IllegalTransition):
        m.handle(kind(), at(1))
    assert vars(m) == before


@pytest.mark.parametrize("build", [idle, starting, running])
def test_an_unknown_event_is_illegal_in_every_state(build):
    m = build()
    before = copy.deepcopy(vars(m))
    with pytest.raises(mm.IllegalTransition):
        m.handle(object(), at(1))
    assert vars(m) == before
