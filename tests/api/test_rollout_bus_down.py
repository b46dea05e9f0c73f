"""A rollout while the owner's bus (NATS in a cluster) is down (issue 38 item 1), against a real hub
and raw devices: an apply that never reached a device leaves it pending, not failed, and is sent again
once the bus is back; an owner cut off from the bus starts no new batch."""

from __future__ import annotations

import pytest
import trio

from actors.bus import NoResponders
from tests.api.test_link_protocol import connect
from tests.hubtools import start_hub, wait_for

RESEND_AFTER = 1.0


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, command_timeout=2.0,
                           rollout_resend_after=RESEND_AFTER)


def applied_answer(commands: list[str], gate: trio.Event | None = None):
    async def answer(verb, payload):
        if verb != "config.apply":
            return {}
        commands.append(verb)
        if gate is not None:
            await gate.wait()
        return {"status": "applied", "configId": payload["configId"], "versionId": payload["versionId"], "files": []}
    return answer


async def rollout_of(hub, nursery, answers, batch_size: int) -> str:
    fid = (await hub.call("POST", "/v1/fleets", json={"name": "edge"})).json()["data"]["id"]
    for i, answer in enumerate(answers):
        _, token = await hub.provision(f"node-{i}", fleet_id=fid)
        await connect(nursery, hub, token, answer=answer)
    cid = (await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": {}})).json()["data"]["id"]
    r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid,
                                                     "batch_size": batch_size})
    assert r.status_code == 201, r.text
    return r.json()["data"]["id"]


async def state(hub, rid) -> dict:
    return (await hub.call("GET", f"/v1/rollouts/{rid}")).json()["data"]


async def test_an_apply_that_never_reached_the_device_is_not_a_failure_and_is_sent_again(hub, nursery):
    with trio.fail_after(60):
        bus = hub.services.bus
        real_request = bus.request
        down = True
        refused: list[str] = []

        async def request(subject, payload, timeout):
            # the bus is down for commands while its probe has not noticed yet (connected still true)
            if down and subject.endswith(".config.apply"):
                refused.append(subject)
                raise NoResponders(subject)
            return await real_request(subject, payload, timeout)

        bus.request = request
        commands: list[str] = []
        rid = await rollout_of(hub, nursery, [applied_answer(commands)], batch_size=5)
        await wait_for(lambda: len(refused) >= 1, timeout=10)
        await trio.sleep(0.5)  # several ticks of the rollout: it must not count the device failed
        st = await state(hub, rid)
        assert st["state"] == "running" and st["counts"]["failed"] == 0, st
        dev = (await hub.call("GET", f"/v1/devices/{st['devices'][0]['device_id']}")).json()["data"]
        assert dev["configuration"]["status"] == "pending", dev["configuration"]
        down = False
        back = trio.current_time()
        await wait_for(lambda: _in(hub, rid, "completed"), timeout=10, interval=0.1)
        took = trio.current_time() - back
        assert commands == ["config.apply"]  # the first send never reached it; the re-send did, once
        assert took < RESEND_AFTER + 2, took
        print(f"completed {took:.2f} s after the bus came back (re-send bound {RESEND_AFTER} s)")


async def test_an_owner_cut_off_from_the_bus_starts_no_new_batch(hub, nursery):
    with trio.fail_after(60):
        gate = trio.Event()
        canary: list[str] = []
        later: list[str] = []
        # canary of one, then a batch of two
        rid = await rollout_of(hub, nursery, [applied_answer(canary, gate), applied_answer(later),
                                              applied_answer(later)], batch_size=2)
        await wait_for(lambda: len(canary) == 1, timeout=10)
        hub.services.bus.connected = False  # what NatsBus says while NATS is unreachable
        gate.set()

        async def canary_settled():
            st = await state(hub, rid)
            return st["counts"]["succeeded"] == 1

        await wait_for(canary_settled, timeout=10, interval=0.1)
        await trio.sleep(1.5)  # several ticks
        st = await state(hub, rid)
        assert st["current_batch"] == 0 and later == [] and st["counts"]["pending"] == 2, st
        del hub.services.bus.connected
        await wait_for(lambda: _in(hub, rid, "completed"), timeout=10, interval=0.1)
        assert later == ["config.apply", "config.apply"]


async def _in(hub, rid, want) -> bool:
    return (await state(hub, rid))["state"] == want
