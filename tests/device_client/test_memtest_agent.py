"""Memory tests through the agent: the memtest verbs against a real WebSocket playing the hub.

Real sockets, so these run on trio's real clock with small memory (256 KiB) and no idle decay unless
a test needs a run that waits (idle decay's 5 minutes), which it then cancels or kills.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import trio
from device_fakehub import FakeHub

from device_client.shared import protocol, verbs
from device_client.agent import Agent, AgentConfig
from device_client.memtest import MemtestConfig
from device_client.workload_spec import parse_spec

FAST = {"backoff_initial": 0.01, "backoff_max": 0.04}
SMALL = 256 << 10


def plan(mode="live", **kw):
    base = {"mode": mode, "impact": "stopped" if mode in ("full_online", "test_boot") else "running",
            "placement": "offline" if mode == "test_boot" else "online", "quick": mode == "live_quick",
            "passes": 1, "kernelPasses": 2, "bitFade": False, "holdOnFailure": False,
            "timeBudgetSeconds": 7200}
    return {**base, **kw}


@pytest.fixture
async def hub(nursery):
    return await nursery.start(FakeHub().serve)


def make_agent(hub, data_dir, **memtest):
    config = MemtestConfig(budget=SMALL, chunk_words=1 << 13, **memtest)
    return Agent(AgentConfig(hub.url, "tok", data_dir, memtest=config, **FAST))


async def start(nursery, agent):
    scope = trio.CancelScope()

    async def run(task_status):
        with scope:
            await agent.run(task_status=task_status)

    await nursery.start(run)
    return scope


async def progress_until(link, phase, step=None):
    """The first progress in ``phase`` (a spec phase; or a step, e.g. idle_decay of phase testing)."""
    while True:
        event = await link.next_event("memtest.progress")
        assert event.payload["phase"] in protocol.MEMTEST_PHASES, event.payload["phase"]
        if phase in (event.payload["phase"], event.payload.get("step")) and step in (None, event.payload.get("step")):
            return event.payload


async def test_live_run_start_busy_cancel_status_ack(hub, nursery, tmp_path):
    with trio.fail_after(30):
        agent = make_agent(hub, tmp_path / "dev", fault="stuck")
        await start(nursery, agent)
        link = await hub.next_link()
        assert link.hello.capabilities.memoryTest.online is True
        assert (await link.command("memtest.cancel", {})).error.code == "not_running"
        bad = await link.command("memtest.start", {"runId": "r0", "plan": plan(passes=0)})
        assert bad.error.code == "invalid" and "passes" in bad.error.message

        reply = await link.command("memtest.start", {"runId": "r1", "plan": plan(bitFade=True)})
        assert reply.ok and reply.payload["status"]["runId"] == "r1"
        waiting = await progress_until(link, "idle_decay")  # the suite ran; idle decay waits 5 minutes
        assert waiting["errors"] > 0 and waiting["pattern"] == "idle_decay"
        assert waiting["coverageBytes"] == waiting["totalBytes"] == SMALL

        busy = await link.command("memtest.start", {"runId": "r2", "plan": plan()})
        assert busy.error.code == "busy"
        running = await link.command("memtest.status", {})
        assert running.payload["supported"] is True and running.payload["status"]["phase"] == "testing"
        assert running.payload["status"]["step"] == "idle_decay"
        assert (await link.command("memtest.cancel", {"runId": "other"})).error.code == "not_running"

        cancelled = await link.command("memtest.cancel", {"runId": "r1"})
        assert cancelled.ok and cancelled.payload["status"]["phase"] == "cancelled"
        result = (await link.next_event("memtest.result")).payload["result"]
        assert result["outcome"] == "cancelled" and result["runId"] == "r1"
        assert result["errorCount"] == waiting["errors"] > 0  # what was found before the cancel is kept
        assert result["pages"] and len(result["errors"]) <= 256

        status = (await link.command("memtest.status", {})).payload
        assert status["status"]["phase"] == "cancelled"
        assert [r["runId"] for r in status["history"]] == ["r1"]
        assert status["health"]["edac"]["correctable"] >= 0 and status["health"]["simulated"] is True
        # what the agent sends is what the link's models say (the hub refuses anything else)
        verbs.check_reply("memtest.status", status)
        verbs.check_reply("memtest.cancel", cancelled.payload)
        verbs.check_event("memtest.result", {"result": result})
        verbs.check_event("memtest.progress", waiting)

        # unacknowledged results are sent again at the next link; acknowledged ones are not
        await link.ws.aclose()
        link = await hub.next_link()
        assert link.hello.lastMemoryTest["runId"] == "r1"
        again = (await link.next_event("memtest.result")).payload["result"]
        assert again["runId"] == "r1"
        assert (await link.command("memtest.ack", {"runIds": ["r1"]}, id="ack-1")).ok
        await link.ws.aclose()
        link = await hub.next_link()
        await link.next_event("memtest.health")
        assert not [f for f in link.frames_nowait() if getattr(f, "kind", "") == "memtest.result"]


async def test_full_online_stops_and_always_restores_the_workload(hub, nursery, tmp_path):
    with trio.fail_after(30):
        agent = make_agent(hub, tmp_path / "dev")
        await start(nursery, agent)
        link = await hub.next_link()
        await agent.workload.start(parse_spec({"workload": {"command": ["sleep", "600"]}}))
        first = agent.workload.pid
        assert first is not None

        reply = await link.command("memtest.start", {"runId": "f1", "plan": plan("full_online")})
        assert reply.ok
        assert not agent.workload.running  # stopped before the reply
        result = (await link.next_event("memtest.result")).payload["result"]
        assert result["outcome"] == "pass" and result["verdict"] == "ok"
        with trio.fail_after(5):
            while not agent.workload.running:
                await trio.sleep(0.01)
        assert agent.workload.pid != first and not agent.workload.held

        # cancelled in the middle: restored as well
        assert (await link.command("memtest.start", {"runId": "f2", "plan": plan("full_online", bitFade=True)})).ok
        await progress_until(link, "idle_decay")
        assert agent.workload.held and not agent.workload.running
        assert (await link.command("memtest.cancel", {})).ok
        assert (await link.next_event("memtest.result")).payload["result"]["outcome"] == "cancelled"
        with trio.fail_after(5):
            while not agent.workload.running:
                await trio.sleep(0.01)
        await agent.workload.stop()


async def test_unsupported_boards_and_firmware(hub, nursery, tmp_path):
    with trio.fail_after(10):
        agent = make_agent(hub, tmp_path / "a", test_boot=False)
        await start(nursery, agent)
        link = await hub.next_link()
        caps = link.hello.capabilities.memoryTest
        assert caps.online and not caps.offline
        assert caps.offlineReason == "test boot is not supported by this board's bootloader yet"
        reply = await link.command("memtest.start", {"runId": "t", "plan": plan("test_boot")})
        assert reply.error.code == "unsupported"

        other = make_agent(hub, tmp_path / "b", enabled=False)
        await start(nursery, other)
        link = await hub.next_link()
        assert not link.hello.capabilities.memoryTest.online
        assert (await link.command("memtest.start", {"runId": "t", "plan": plan()})).error.code == "unknown_command"


async def test_test_boot_reboots_tests_in_maintenance_and_returns_to_service(hub, nursery, tmp_path):
    with trio.fail_after(30):
        agent = make_agent(hub, tmp_path / "dev", fault="stuck")
        await start(nursery, agent)
        link = await hub.next_link()
        # a configured workload: started again at every boot by the configuration's boot hook
        applied = await link.command("config.apply", {
            "configId": "c", "versionId": "v1", "version": 1, "files": [],
            "spec": {"workload": {"command": ["sleep", "600"], "healthCheck": {"graceSeconds": 0}}}})
        assert applied.ok and applied.payload["status"] == "applied", applied
        assert agent.workload.running
        reply = await link.command("memtest.start", {"runId": "tb", "plan": plan("test_boot")})
        assert reply.ok and reply.payload["status"]["phase"] == "rebooting"
        await link.closed.wait()

        link = await hub.next_link()
        assert link.hello.bootReason == "memory_test"
        assert link.hello.maintenance is True and link.hello.workloadHeld is True
        assert not agent.workload.running

        result = None
        while result is None:  # sent on this link, or again on the next one if the reboot was first
            try:
                with trio.fail_after(10):
                    result = (await link.next_event("memtest.result")).payload["result"]
            except trio.TooSlowError:
                link = await hub.next_link()
        assert result["runId"] == "tb" and result["outcome"] == "fail" and result["verdict"] == "weak_cells"
        assert result["kernel"]["passes"] == 2 and result["retired"]

        while link.hello.bootReason != "memory_test_done":
            link = await hub.next_link()
        assert link.hello.maintenance is False and link.hello.workloadHeld is False
        assert sorted(link.hello.retiredPages) == sorted(result["retired"])
        with trio.fail_after(5):
            while not agent.workload.running:
                await trio.sleep(0.01)
        await agent.workload.stop()


def _agent_process(hub, data_dir, log):
    return subprocess.Popen(
        [sys.executable, "-m", "hub.cli", "agent", "--hub", hub.url, "--token", "tok", "--data-dir",
         str(data_dir), "--memory-budget", "256K"], stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True, cwd=os.getcwd())


@pytest.mark.parametrize("mode", ["live", "test_boot"])
async def test_a_killed_agent_reports_the_run_interrupted_and_never_retries_it(hub, tmp_path, mode):
    log = (tmp_path / "agent.log").open("ab")  # the agents' output, for a failing test's report
    with trio.fail_after(60), log:
        proc = _agent_process(hub, tmp_path / "dev", log)
        try:
            link = await hub.next_link()
            reply = await link.command("memtest.start", {"runId": "k1", "plan": plan(mode, bitFade=True)})
            assert reply.ok
            if mode == "test_boot":
                link = await hub.next_link()  # the agent re-executed itself: boot reason memory_test
                assert link.hello.bootReason == "memory_test" and link.hello.maintenance
            await progress_until(link, "idle_decay")
            os.kill(proc.pid, signal.SIGKILL)
            await trio.to_thread.run_sync(proc.wait)
            await link.closed.wait()

            proc = _agent_process(hub, tmp_path / "dev", log)
            link = await hub.next_link()
            assert link.hello.bootReason == "power_on"
            assert link.hello.maintenance is False and link.hello.workloadHeld is False
            assert link.hello.memoryTestRunning is None
            last = link.hello.lastMemoryTest
            assert last["runId"] == "k1" and last["outcome"] == "interrupted"
            assert last["interrupted"] == {"phase": "testing", "step": "idle_decay", "pass": 1, "pattern": "idle_decay"}
            assert last["verdict"] == "unknown"  # the spec's values only: what it found died with it
            sent = (await link.next_event("memtest.result")).payload["result"]
            assert sent["outcome"] == "interrupted"
            status = (await link.command("memtest.status", {})).payload
            assert status["status"]["phase"] == "interrupted"
        finally:
            proc.kill()
            proc.wait()


async def test_retired_pages_stay_out_of_use(hub, nursery, tmp_path):
    with trio.fail_after(30):
        agent = make_agent(hub, tmp_path / "dev", fault="stuck")
        await start(nursery, agent)
        link = await hub.next_link()
        assert (await link.command("memtest.start", {"runId": "a", "plan": plan()}, id="s1")).ok
        first = (await link.next_event("memtest.result")).payload["result"]
        assert first["outcome"] == "fail" and len(first["retired"]) == 2
        health = (await link.command("memtest.status", {}, id="st1")).payload["health"]
        assert health["retiredPages"] == 2 and health["fault"] is False
        assert health["hardwareCorruptedBytes"] == 2 * 4096 and len(health["kernelErrors"]) == 2
        # the faulty cells are in retired pages: a simulated device no longer uses them
        assert (await link.command("memtest.start", {"runId": "b", "plan": plan()}, id="s2")).ok
        second = (await link.next_event("memtest.result")).payload["result"]
        assert (second["outcome"], second["errorCount"], second["retired"]) == ("pass", 0, [])
        await link.ws.aclose()
        link = await hub.next_link()
        assert sorted(link.hello.retiredPages) == sorted(first["retired"])
