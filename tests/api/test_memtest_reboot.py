"""A reboot during a memory test, with a real hub, PostgreSQL and a real agent that reboots in process
(the simulation's reboot: the same agent object boots again). An online test cannot survive a
reboot: the run ends interrupted (spec: "device reset, crash or power loss -> outcome interrupted,
reported at next boot"), and the agent, the hub's live and stored reads, start and cancel all agree
that nothing runs."""

from __future__ import annotations

import trio

from device_client.memtest import MemtestConfig
from tests.api.test_memtests import ScriptedDevice
from tests.hubtools import start_agent, start_hub, wait_for


def mt(dev_id: str, suffix: str = "") -> str:
    return f"/v1/devices/{dev_id}/memory-test{suffix}"


async def read(hub, dev_id: str) -> dict:
    r = await hub.call("GET", mt(dev_id))
    assert r.status_code == 200, r.text
    return r.json()["data"]


async def phase_is(hub, dev_id: str, phase: str) -> bool:
    return ((await read(hub, dev_id)).get("status") or {}).get("phase") == phase


async def test_a_reboot_ends_the_running_test_interrupted_everywhere(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=2.0)
        dev_id, token = await hub.provision("rebooted")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent",
                                    memtest=MemtestConfig(budget=32 << 20))
        agent = running.agent
        r = await hub.call("POST", mt(dev_id), json={"passes": 20})
        assert r.status_code == 202, r.text
        started = trio.current_time()
        run_id = r.json()["data"]["runId"]
        await wait_for(lambda: phase_is(hub, dev_id, "testing"), timeout=20, interval=0.1)

        links = agent.statistics().links
        r = await hub.call("POST", f"/v1/devices/{dev_id}/reboot")
        assert r.status_code == 202, r.text
        await wait_for(lambda: _relinked(agent, links), timeout=30)

        # the agent: nothing runs, its last status is the interrupted run
        reply = await agent.memtest._status({})
        assert reply["status"]["runId"] == run_id and reply["status"]["phase"] == "interrupted"
        assert not agent.memtest.running

        # the hub: the live read, the stored result, the stream's last state
        await wait_for(lambda: phase_is(hub, dev_id, "interrupted"), timeout=20, interval=0.1)
        live = await read(hub, dev_id)
        assert live["source"] == "live" and live["status"]["runId"] == run_id
        results = (await hub.call("GET", mt(dev_id, "/results"))).json()["data"]["results"]
        assert [(x["runId"], x["outcome"]) for x in results] == [(run_id, "interrupted")]

        # cancel and start agree with the reads: nothing to cancel, and a new test may start
        r = await hub.call("POST", mt(dev_id, "/cancel"))
        assert r.status_code == 409 and r.json()["error"] == "not_running", r.text
        assert await phase_is(hub, dev_id, "interrupted")  # a status read leaves the hub idle
        await trio.sleep_until(started + 5.1)  # a device accepts one start every 5 s
        r = await hub.call("POST", mt(dev_id), json={"quick": True})
        assert r.status_code == 202, r.text


async def _relinked(agent, links: int) -> bool:
    return agent.connected and agent.statistics().links > links and agent.boot_reason == "reboot"


async def test_a_hello_without_the_running_test_ends_it_interrupted_on_the_hub(nursery, db_url, tmp_path):
    """A device that comes back from a reboot saying nothing runs, and without a result for the run
    the hub saw start: the hub's live and stored views end that run interrupted."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=2.0)
        dev_id, token = await hub.provision("forgetful")
        before = ScriptedDevice(hub, token)
        await nursery.start(before.run)
        r = await hub.call("POST", mt(dev_id), json={"passes": 3})
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["runId"]
        assert (await read(hub, dev_id))["status"]["phase"] == "preparing"
        before.scope.cancel()  # the reboot: the link drops, the device comes back with nothing running
        await wait_for(lambda: _offline(hub, dev_id), timeout=10)
        after = ScriptedDevice(hub, token, bootReason="reboot")
        await nursery.start(after.run)
        await wait_for(lambda: _online(hub, dev_id), timeout=10)
        after.scope.cancel()
        await wait_for(lambda: _offline(hub, dev_id), timeout=10)
        stored = await read(hub, dev_id)
        assert stored["source"] == "stored"
        assert (stored["status"]["runId"], stored["status"]["phase"]) == (run_id, "interrupted")


async def _online(hub, dev_id: str) -> bool:
    return (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]["online"] is True


async def _offline(hub, dev_id: str) -> bool:
    return not await _online(hub, dev_id)


async def test_a_hello_after_a_reboot_still_reporting_an_online_test_does_not_keep_the_hub_busy(
        nursery, db_url, tmp_path):
    """The stale status of a device that keeps its last status through a reboot (as the agent did):
    the hub ends the online test interrupted and takes a new start to the device."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=2.0)
        dev_id, token = await hub.provision("stale")
        before = ScriptedDevice(hub, token)

        async def drop_link() -> None:
            await trio.sleep(0.2)
            before.scope.cancel()

        async def reboot(p: dict) -> dict:
            nursery.start_soon(drop_link)  # the link drops right after the reply goes out
            return {"rebooting": True}

        before.handlers["reboot"] = reboot
        await nursery.start(before.run)
        r = await hub.call("POST", mt(dev_id), json={"passes": 3})
        assert r.status_code == 202, r.text
        started = trio.current_time()
        stale = {**before.running, "phase": "testing"}
        r = await hub.call("POST", f"/v1/devices/{dev_id}/reboot")
        assert r.status_code == 202, r.text
        await wait_for(lambda: _offline(hub, dev_id), timeout=10)
        after = ScriptedDevice(hub, token, bootReason="reboot", memoryTestRunning=stale)
        after.running = None  # what it runs now: nothing (only its hello is stale)
        await nursery.start(after.run)
        await wait_for(lambda: _online(hub, dev_id), timeout=10)
        await trio.sleep_until(started + 5.1)
        r = await hub.call("POST", mt(dev_id), json={"quick": True})
        assert r.status_code == 202, r.text
        assert after.sent("memtest.start"), "the start went to the device, not refused from a stale status"
