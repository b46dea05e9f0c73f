"""The loop watch's decisions (device_client/shared/loopwatch.py ``Stalls``), fed instants and CPU
clocks: no clock read, no thread. Threshold 0.4 s, so the watch's task sleeps 0.1 s between beats. Then
the threshold's parsing, and the watch kept out of a run on a virtual clock."""

from __future__ import annotations

import pytest
import trio

from device_client.shared import loopwatch
from device_client.shared.loopwatch import Sample, Stalls


def test_beats_on_time_are_no_stall_and_nothing_is_reported():
    stalls = Stalls(0.4)
    at = 0.0
    assert stalls.beat(at) is None
    for _ in range(20):
        at += 0.1 + 0.05  # the sleep and some ordinary lateness
        assert stalls.check(at) is None
        assert stalls.beat(at) is None
    assert (stalls.count, stalls.seconds, stalls.longest) == (0, 0.0, 0.0)


def test_a_stall_is_reported_once_while_it_lasts_and_counted_with_its_length_when_it_ends():
    stalls = Stalls(0.4)
    stalls.beat(10.0)
    assert stalls.check(10.3) is None  # 0.2 s past the sleep: under the threshold
    seen = stalls.check(10.6)
    assert seen is not None and seen.held == pytest.approx(0.5) and seen.unreported == 0
    assert stalls.check(10.9) is None and stalls.check(12.0) is None  # the same stall: once
    assert stalls.count == 0  # counted when it ends, with its whole length
    assert stalls.beat(12.1) == pytest.approx(2.0)
    assert (stalls.count, stalls.seconds, stalls.longest) == (1, pytest.approx(2.0), pytest.approx(2.0))


def test_a_stall_the_thread_never_saw_is_counted_when_the_loop_runs_again():
    # C code that keeps the GIL lets the thread look only after it ends: the beat comes first
    stalls = Stalls(0.4)
    stalls.beat(0.0)
    assert stalls.beat(0.9) == pytest.approx(0.8)
    assert stalls.check(0.95) is None
    assert stalls.count == 1


def test_reports_are_at_most_one_per_interval_and_the_next_says_how_many_were_not():
    stalls = Stalls(0.4, report_every=10.0)
    at = 0.0
    stalls.beat(at)
    reported = []
    for _ in range(4):  # four stalls of 0.6 s, 1 s apart
        seen = stalls.check(at + 0.7)
        reported.append(None if seen is None else seen.unreported)
        at += 1.0
        stalls.beat(at)
    assert reported == [0, None, None, None]
    for _ in range(100):  # ten quiet seconds
        at += 0.1
        assert stalls.beat(at) is None
    seen = stalls.check(at + 0.7)
    assert seen is not None and seen.unreported == 3
    assert stalls.count == 4


def _stall(thread: float, process: float, collecting: float = 1.0):
    stalls = Stalls(0.4)
    stalls.beat(0.0, Sample(thread=5.0, process=20.0, collecting=1.0))
    return stalls.check(1.1, Sample(thread=5.0 + thread, process=20.0 + process, collecting=collecting))


def test_a_report_tells_code_on_the_loop_from_another_threads_gil_from_a_loop_that_got_no_cpu():
    busy = _stall(thread=0.9, process=0.95)  # code on the loop: its stack is the culprit
    assert busy is not None and busy.ran == pytest.approx(0.9) and busy.others == pytest.approx(0.05)
    assert busy.why() == "its thread ran 0.90 s of it"
    gil = _stall(thread=0.02, process=0.9)  # another thread of the process held the GIL
    assert gil is not None and gil.why() == ("its thread ran 0.02 s of it; the process's other threads ran "
                                             "0.88 s: it waited for the GIL")
    starved = _stall(thread=0.01, process=0.03)  # nobody in the process ran
    assert starved is not None and starved.why() == (
        "its thread ran 0.01 s of it; the process ran little of it: it waited for a CPU (the machine busy "
        "elsewhere) or in a blocking call")
    collected = _stall(thread=0.1, process=0.9, collecting=1.8)
    assert collected is not None and collected.why() == "its thread ran 0.10 s of it; garbage collection 0.80 s"
    stalls = Stalls(0.4)
    stalls.beat(0.0)
    unknown = stalls.check(1.1)  # no CPU clock of another thread on this platform
    assert unknown is not None and unknown.ran is None and unknown.why() == ""


def test_nothing_is_reported_before_the_first_beat():
    assert Stalls(0.4).check(100.0) is None


@pytest.mark.parametrize("raw", ["-1", "nan", "inf", "half a second"])
def test_a_threshold_that_is_not_a_duration_is_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv(loopwatch.ENV, raw)
    with pytest.raises(SystemExit, match="FLEETHUB_LOOP_STALL_SECONDS must be a number of seconds"):
        loopwatch.threshold_from_env()


def test_the_threshold_defaults_and_zero_switches_the_watch_off(monkeypatch):
    monkeypatch.delenv(loopwatch.ENV, raising=False)
    assert loopwatch.threshold_from_env() == loopwatch.DEFAULT_THRESHOLD
    monkeypatch.setenv(loopwatch.ENV, "0")
    assert loopwatch.threshold_from_env() == 0.0


async def test_no_watch_runs_under_a_virtual_clock(autojump_clock):
    # its task's sleeps would return at once and keep the virtual clock from jumping to the next deadline
    async with trio.open_nursery() as nursery:
        await nursery.start(loopwatch.LoopWatch(0.4).run)
        assert loopwatch.current() is None
        await trio.sleep(3600)  # jumps: nothing else is awake
