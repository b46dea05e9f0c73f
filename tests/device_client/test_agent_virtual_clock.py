"""The agent's timing on trio's virtual clock: reconnect backoff, the close codes' waits, a drain's
window and the heartbeat schedule, against the fake hub over in-memory streams (a real trio-websocket
client and server, no socket). Instants are exact, so a wrong delay or interval fails; the tests take
a few milliseconds of wall time for minutes of the agent's."""

from __future__ import annotations

import datetime as dt
import json
import logging
import random

import pytest
import trio

from device_client import agent as agent_module
from device_client.shared import protocol
from device_client.agent import Agent, AgentConfig
from device_client.shared.clock import TestClock

from device_fakehub import FakeHub


class Top(random.Random):
    """Full jitter's top, always: each reconnect delay is its ceiling, so the instants are known."""

    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.fixture(autouse=True)
def no_threads(monkeypatch):
    """The agent reads and writes its state files in threads. While one runs no task is runnable, so
    the virtual clock would jump to the next deadline (the test's own fail_after): run them inline."""
    async def inline(fn, *args, **_options):
        await trio.lowlevel.checkpoint()
        return fn(*args)

    monkeypatch.setattr(trio.to_thread, "run_sync", inline)


async def run_agent(nursery, hub: FakeHub, data_dir, **kw) -> Agent:
    agent = Agent(AgentConfig("http://hub.test", "tok", data_dir, connector=hub.in_memory(nursery), rng=Top(),
                              backoff_initial=0.5, backoff_max=4.0, **kw))
    nursery.start_soon(agent.run)
    return agent


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in zip(times, times[1:])]


async def test_refused_connects_back_off_doubling_to_the_cap_and_a_welcome_resets_it(nursery, tmp_path,
                                                                                       autojump_clock):
    hub = FakeHub(heartbeat=1000)
    hub.refuse = 6
    with trio.fail_after(600):
        await run_agent(nursery, hub, tmp_path / "dev")
        link = await hub.next_link()
        assert gaps(hub.attempts) == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
        await link.ws.aclose(1011, "hub restarting")
        closed_at = trio.current_time()
        await hub.next_link()
        assert hub.attempts[-1] - closed_at == pytest.approx(0.5)  # back to the first delay


async def test_a_refused_token_is_retried_at_the_slowest_backoff_and_logged(nursery, tmp_path, autojump_clock, caplog):
    # docs/device-protocol.md: a 401 is not retried faster than the backoff cap (here 4 s); the
    # ordinary 0.5, 1, 2 s hammered a hub that had said the token does not work.
    caplog.set_level(logging.WARNING, logger="fleethub.agent")
    hub = FakeHub(heartbeat=1000)
    hub.reject_status = 401
    with trio.fail_after(600):
        agent = await run_agent(nursery, hub, tmp_path / "dev")
        while hub.rejections < 5:
            await trio.sleep(0.1)
        assert not agent.connected and agent.statistics().link_failures == 5
        assert gaps(hub.attempts) == [4.0, 4.0, 4.0, 4.0]
        assert any("refused the device token (HTTP 401)" in r.getMessage() for r in caplog.records)
        hub.reject_status = None
        await agent.wait_connected()
        assert agent.device_id == "dev-1" and gaps(hub.attempts)[-1] == 4.0


async def test_superseded_stays_away_30_s_more_and_revoked_waits_the_longest(nursery, tmp_path, autojump_clock):
    hub = FakeHub(heartbeat=1000)
    with trio.fail_after(600):
        await run_agent(nursery, hub, tmp_path / "dev")
        link = await hub.next_link()
        await link.ws.aclose(4001, "another connection with this device's token took over")
        closed_at = trio.current_time()
        link = await hub.next_link()
        assert hub.attempts[-1] - closed_at == pytest.approx(30.0 + 0.5)
        await link.ws.aclose(4003, "the device was unpaired: its token is revoked")
        closed_at = trio.current_time()
        await hub.next_link()
        assert hub.attempts[-1] - closed_at == pytest.approx(4.0)  # the slowest backoff


async def test_a_drain_comes_back_within_the_window_the_hub_gave(nursery, tmp_path, autojump_clock):
    hub = FakeHub(heartbeat=1000)
    with trio.fail_after(600):
        await run_agent(nursery, hub, tmp_path / "dev")
        link = await hub.next_link()
        reply = await link.command("link.drain", {"reconnectAfter": 12})
        assert reply.ok
        drained_at = trio.current_time()
        await link.closed.wait()
        await hub.next_link()
        assert hub.attempts[-1] - drained_at == pytest.approx(12.0)  # the top of the window


@pytest.mark.parametrize("reason, window", [("the hub is shutting down; reconnect within 25 s", 25.0),
                                            ("going away", 10.0)])  # unreadable: the documented default
async def test_a_4004_close_comes_back_at_the_top_of_the_window_its_reason_states(nursery, tmp_path,
                                                                                  autojump_clock, reason, window):
    hub = FakeHub(heartbeat=1000)
    with trio.fail_after(600):
        await run_agent(nursery, hub, tmp_path / "dev")
        link = await hub.next_link()
        await link.ws.aclose(4004, reason)
        closed_at = trio.current_time()
        await hub.next_link()
        assert hub.attempts[-1] - closed_at == pytest.approx(window)  # Top(): the window's ceiling


async def test_heartbeats_keep_the_welcome_interval_exactly(nursery, tmp_path, autojump_clock):
    hub = FakeHub(heartbeat=5)
    clock = TestClock()
    with trio.fail_after(600):
        agent = await run_agent(nursery, hub, tmp_path / "dev", clock=clock)
        link = await hub.next_link()
        linked_at = hub.attempts[-1]
        beats, payloads = [], []
        for _ in range(4):
            payloads.append((await link.next_event("heartbeat")).payload)
            beats.append(trio.current_time())
        assert beats[0] - linked_at == pytest.approx(5.0)
        assert gaps(beats) == [5.0, 5.0, 5.0]
        # what each says: the device's uptime and its clock, from the injected clock, 5 s apart
        assert gaps([p["uptime"] for p in payloads]) == [5.0, 5.0, 5.0]
        said = [dt.datetime.fromisoformat(p["deviceClock"].replace("Z", "+00:00")) for p in payloads]
        assert said[0] == clock.now() - dt.timedelta(seconds=15)
        assert gaps([t.timestamp() for t in said]) == [5.0, 5.0, 5.0]
        # a command in between neither delays nor adds one
        assert (await link.command("ping")).ok
        await link.next_event("heartbeat")
        assert trio.current_time() - beats[-1] == pytest.approx(5.0)
        assert agent.statistics().heartbeats_sent == 5


async def test_a_frame_too_big_from_the_hub_is_not_taken_for_a_refusal_by_the_hub(nursery, tmp_path, autojump_clock):
    """Our end closing with 1009 (the hub's command over our limit) is not the hub refusing our frame:
    nothing is recorded, reported, dropped or learned; the agent comes back with its usual backoff."""
    hub = FakeHub(heartbeat=1000)
    with trio.fail_after(600):
        agent = await run_agent(nursery, hub, tmp_path / "dev")
        link = await hub.next_link()
        await agent.wait_connected()
        await agent.send_event("bulky", {"x": "y" * 8000})  # a frame a mistaken 1009 would be blamed on
        await link.next_event("bulky")
        big = {"type": "command", "id": "big", "subject": "cmd.dev-1.ping",
               "payload": {"pad": "z" * protocol.MAX_FRAME_BYTES}}
        await link.ws.send_message(json.dumps(big))  # past protocol.encode, which would refuse it
        await link.closed.wait()
        assert link.ws.closed.code == 1009
        await hub.next_link()
        assert agent.frames.records() == [] and agent.frames.learned is None
        assert agent.frames.limit == protocol.MAX_FRAME_BYTES
        assert gaps(hub.attempts) == [0.5]


async def test_a_reboot_is_stored_before_its_reply_is_sent(nursery, tmp_path, autojump_clock):
    """docs/device-protocol.md, "Reboot": the boot reason and the reply are on disk before the reply
    leaves, so a power cut between the two still boots with the reason and answers a resend once."""
    hub = FakeHub(heartbeat=1000)
    order: list[str] = []
    with trio.fail_after(600):
        agent = await run_agent(nursery, hub, tmp_path / "dev")
        link = await hub.next_link()
        await agent.wait_connected()
        prepare = agent.store.prepare_reboot

        def recorded_prepare(reason, command_id, reply):
            order.append(f"stored {reason} {command_id} {(reply or {}).get('ok')}")
            return prepare(reason, command_id, reply)

        agent.store.prepare_reboot = recorded_prepare
        ws = agent.link._ws
        send = ws.send_message

        async def recorded_send(text):
            frame = json.loads(text)
            if frame.get("type") == "reply":
                order.append(f"reply {frame.get('id')}")
            await send(text)

        ws.send_message = recorded_send
        reply = await link.command("reboot", {"reason": "maintenance"}, id="c-reboot")
        assert reply.ok
        assert order[:2] == ["stored maintenance c-reboot True", "reply c-reboot"], order
        relinked = await hub.next_link()
        assert relinked.hello.bootReason == "maintenance"
        again = await relinked.command("reboot", {"reason": "maintenance"}, id="c-reboot")
        assert again.ok and agent.boot_count == 2  # the resend is answered from what was stored, no second boot


async def test_a_reboot_asked_for_between_links_ends_the_wait_and_the_next_link_is_whole(nursery, tmp_path,
                                                                                         autojump_clock):
    # A part may ask with no link up (the memory tester's return to service): the backoff's wait ends
    # at once, the agent reboots, and the link after the reboot runs its session (the leave the reboot
    # asked of the link is forgotten at the boot) with the new boot reason.
    hub = FakeHub(heartbeat=1000)
    hub.reject_status = 503
    with trio.fail_after(600):
        agent = await run_agent(nursery, hub, tmp_path / "dev")
        while hub.rejections < 2:
            await trio.sleep(0.01)
        await trio.sleep(0.1)  # inside the 1 s wait before the third connect
        hub.reject_status = None
        asked = trio.current_time()
        agent.request_reboot("memory_test_done")
        link = await hub.next_link()
        assert trio.current_time() - asked == pytest.approx(agent_module.REBOOT_PAUSE)
        assert link.hello.bootReason == "memory_test_done"
        assert (await link.command("ping", {})).ok


def test_the_drain_reason_the_hub_writes_is_the_one_the_device_reads():
    from device_client.shared.linkcodes import DRAIN_WINDOW_DEFAULT, drain_window, draining_reason

    assert [drain_window(draining_reason(w)) for w in (3, 10.0, 60)] == [3.0, 10.0, 60.0]
    assert drain_window(None) == drain_window("bye") == DRAIN_WINDOW_DEFAULT
    assert drain_window("reconnect within 99999 s") == 3600.0  # a hostile reason cannot park a device for days


def test_hub_urls_take_one_a_list_or_commas_and_refuse_a_bad_one_at_start():
    from device_client.agent import hub_urls

    assert hub_urls("http://a:1") == ["http://a:1"]
    assert hub_urls(" http://a:1, https://b:2 ,") == ["http://a:1", "https://b:2"]
    assert hub_urls(["http://a:1", "http://b:2"]) == ["http://a:1", "http://b:2"]
    for bad in ("", ",", "http://a:1,ftp://b"):
        with pytest.raises(ValueError):
            hub_urls(bad)


async def test_a_4003_keeps_the_device_away_whichever_of_its_tasks_noticed_the_close(nursery, tmp_path,
                                                                                      autojump_clock):
    # The close code is read from the socket, not from the error that ended the link: a send that hit
    # the closed link (BrokenResourceError) used to leave no code, and the device came straight back
    # (CI's qualification kit saw a reconnect 0.00 s after close 4003).
    from contextlib import asynccontextmanager

    from trio_websocket import ConnectionClosed

    hub = FakeHub(heartbeat=1000)
    in_memory = hub.in_memory(nursery)

    @asynccontextmanager
    async def a_send_notices_first(headers):
        async with in_memory(headers) as ws:
            try:
                yield ws
            except ConnectionClosed:
                raise trio.BrokenResourceError("a send found the link closed") from None

    with trio.fail_after(600):
        agent = Agent(AgentConfig("http://hub.test", "tok", tmp_path / "dev", connector=a_send_notices_first,
                                  rng=Top(), backoff_initial=0.5, backoff_max=4.0))
        nursery.start_soon(agent.run)
        link = await hub.next_link()
        await link.ws.aclose(4003, "the device was unpaired: its token is revoked")
        closed_at = trio.current_time()
        await hub.next_link()
        assert hub.attempts[-1] - closed_at == pytest.approx(4.0)  # the slowest backoff, not 0.5
