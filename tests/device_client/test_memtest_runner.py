"""Runs on trio's autojump clock: idle decay's 5 minutes, the time budget, Live's back-off, and a
failed test boot held in maintenance for exactly 1,800 s (or until cancelled).

The test-boot tests use a real Agent that is not linked to any hub: its tester's boot hook is
called as the boot with reason memory_test would (the agent's own boot reads its state in a worker
thread, which an autojump clock would leap over).
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import trio

from actors.machines.memtest import progress as hub_progress

from device_client.agent import Agent, AgentConfig
from device_client.shared.clock import TestClock
from device_client.memtest import MemtestConfig
from device_client.memtest.hwsim import Hardware
from device_client.memtest.plan import MemInfo
from device_client.memtest.runner import BUDGET_MESSAGE, Run
from device_client.memtest.tester import HOLD_SECONDS

SMALL = 256 << 10


def plan(mode="live", **kw):
    return {"mode": mode, "passes": 1, "kernelPasses": 1, "bitFade": False, "holdOnFailure": False,
            "timeBudgetSeconds": 7200, **kw}


def make_run(p, *, fault=None, meminfo=None, size=SMALL, events=None):
    async def progress(status):
        if events is not None:
            events.append((trio.current_time(), status))

    return Run("r", p, size=size, clock=TestClock(), hw=Hardware(simulated=True), checkpoint=lambda c: None,
               progress=progress, fault=fault, physical=False, chunk_words=1 << 13, meminfo=meminfo)


async def test_idle_decay_waits_five_minutes_on_the_clock(autojump_clock):
    with trio.fail_after(3600):
        events = []
        result = await make_run(plan(bitFade=True), events=events).execute()
    assert result["outcome"] == "pass" and result["durationSeconds"] == 300.0
    assert {s["phase"] for t, s in events} <= {"preparing", "testing"}
    decay = [t for t, s in events if s["step"] == "idle_decay"]
    assert decay[0] == 0.0  # everything else took no virtual time
    # progress goes on about once a second while the data sits
    assert decay == [float(t) for t in range(301)]


async def test_the_time_budget_ends_the_run_with_error_and_keeps_what_it_found(autojump_clock):
    with trio.fail_after(3600):
        result = await make_run(plan(bitFade=True, timeBudgetSeconds=60), fault="stuck").execute()
    assert result["outcome"] == "error" and result["message"] == BUDGET_MESSAGE == "time budget reached"
    assert result["durationSeconds"] == 60.0
    assert result["errorCount"] > 0 and result["pages"]


async def test_live_backs_off_when_memory_is_tight(autojump_clock):
    readings = iter([MemInfo(1 << 30, 500 << 20, 0.0), MemInfo(1 << 30, 50 << 20, 0.0),
                     MemInfo(1 << 30, 600 << 20, 25.0)])
    last = MemInfo(1 << 30, 600 << 20, 0.0)
    with trio.fail_after(3600):
        result = await make_run(plan("live"), meminfo=lambda: next(readings, last)).execute()
    assert result["backoffs"] == 2  # MemAvailable under 10%, then PSI some avg10 of 25%
    assert result["totalBytes"] == SMALL // 4
    assert result["outcome"] == "pass"
    # stopped modes do not back off: their memory is the workload's anyway
    readings = iter([MemInfo(1 << 30, 1 << 20, 50.0)] * 10_000)
    with trio.fail_after(3600):
        stopped = await make_run(plan("full_online"), meminfo=lambda: next(readings)).execute()
    assert stopped["backoffs"] == 0 and stopped["totalBytes"] == SMALL


async def _failed_test_boot(nursery, tmp_path, **plan_kw):
    agent = Agent(AgentConfig("http://127.0.0.1:9", "tok", tmp_path / "dev", clock=TestClock(),
                              memtest=MemtestConfig(budget=SMALL, chunk_words=1 << 13, fault="stuck")))
    agent.nursery = nursery
    tester = agent.memtest
    reply = await tester._start({"runId": "tb", "plan": plan("test_boot", holdOnFailure=True, **plan_kw)})
    assert reply["status"]["phase"] == "rebooting" and agent._reboot_reason == "memory_test"
    agent.boot_reason, agent._reboot_reason = "memory_test", None  # what the agent's boot does
    await tester.boot()
    assert tester.maintenance and agent.workload.held
    while not tester.holding:
        await trio.sleep(1)
    return agent, tester


def _finished(tester):
    result = tester.store.history()[0]
    return dt.datetime.fromisoformat(result["finishedAt"]), result


async def test_a_failed_test_boot_is_held_exactly_1800_seconds(autojump_clock, nursery, tmp_path):
    with trio.fail_after(4 * 3600):
        agent, tester = await _failed_test_boot(nursery, tmp_path)
        finished, result = _finished(tester)
        assert result["outcome"] == "fail"
        status = (await tester._status({}))["status"]
        assert (status["phase"], status["step"]) == ("failed", "holding")
        assert agent._reboot_reason is None  # still held: no reboot yet
        await tester._done.wait()
    assert agent.clock.now() - finished == dt.timedelta(seconds=HOLD_SECONDS) == dt.timedelta(seconds=1800)
    assert agent._reboot_reason == "memory_test_done"
    assert not tester.maintenance and tester.store.test_boot() is None


async def test_cancel_releases_the_hold(autojump_clock, nursery, tmp_path):
    with trio.fail_after(4 * 3600):
        agent, tester = await _failed_test_boot(nursery, tmp_path)
        finished, _ = _finished(tester)
        await trio.sleep(100 - (agent.clock.now() - finished).total_seconds())
        reply = await tester._cancel({})
        assert reply["status"]["phase"] == "cancelled"
        await tester._done.wait()
    assert agent.clock.now() - finished == dt.timedelta(seconds=100)
    assert agent._reboot_reason == "memory_test_done"


async def test_a_failed_test_boot_without_hold_returns_to_service(autojump_clock, nursery, tmp_path):
    agent = Agent(AgentConfig("http://127.0.0.1:9", "tok", tmp_path / "dev", clock=TestClock(),
                              memtest=MemtestConfig(budget=SMALL, chunk_words=1 << 13, fault="stuck")))
    agent.nursery = nursery
    with trio.fail_after(3600):
        await agent.memtest._start({"runId": "tb", "plan": plan("test_boot", holdOnFailure=False)})
        agent.boot_reason, agent._reboot_reason = "memory_test", None  # what the agent's boot does
        await agent.memtest.boot()
        await agent.memtest._done.wait()
    finished, result = _finished(agent.memtest)
    assert result["outcome"] == "fail" and agent.clock.now() == finished
    assert agent._reboot_reason == "memory_test_done"


def test_plan_defaults_and_sizes():
    from device_client.memtest.plan import QUICK_CAP, PlanError, check, size_for

    full = check({"mode": "full_online"})
    assert (full["passes"], full["bitFade"], full["timeBudgetSeconds"]) == (2, True, 7200)
    live = check({"mode": "live"})
    assert (live["passes"], live["bitFade"]) == (1, False)
    for bad in ({"mode": "nap"}, {"mode": "live", "passes": 21}, {"mode": "live", "timeBudgetSeconds": 59},
                {"mode": "test_boot", "kernelPasses": 18}, {"mode": "live", "bitFade": "yes"}):
        try:
            check(bad)
        except PlanError:
            continue
        raise AssertionError(f"{bad} was accepted")
    gib = 1 << 30
    info = MemInfo(16 * gib, 8 * gib)
    assert size_for(check({"mode": "live_quick"}), info, None) == QUICK_CAP == 512 << 20
    assert size_for(check({"mode": "live_quick"}), MemInfo(gib, gib), None) == gib // 4
    assert size_for(check({"mode": "live"}), info, None) == 4 * gib - (64 << 20)
    assert size_for(check({"mode": "full_online", "maxBytes": gib}), info, None) == gib
    assert size_for(check({"mode": "full_online"}), info, 64 << 20) == 64 << 20  # a simulated device's budget


async def test_the_time_left_keeps_its_tenths_so_the_last_second_is_not_read_as_done():
    run = make_run(plan())
    # 950 of 1,000 planned bytes verified in 10 s: half a second of work left
    run.engine, run.region, run._planned = SimpleNamespace(verified_bytes=950), SimpleNamespace(active_bytes=100), 1000
    run.started = trio.current_time() - 10
    status = run.status()
    assert status["etaSeconds"] == 0.5
    assert 0.9 < hub_progress(status) < 1
