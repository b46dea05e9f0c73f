"""actors/natsbus.py against a real nats-server: two buses stand for two hub processes."""

from __future__ import annotations

import pytest
import trio

from actors import errors as actor_errors
from actors.bus import BusError, NoResponders, RequestTimeout, Unavailable
from actors.natsbus import open_nats_bus
from tests.hubtools import wait_for
from tests.proctools import sigstop


async def _until_held(bus, subject: str) -> None:
    """A subscription reaches the server a moment after subscribe() returns."""
    async def held() -> bool:
        try:
            await bus.request(subject, {"probe": True}, timeout=1)
            return True
        except NoResponders:
            return False
    for _ in range(100):
        if await held():
            return
        await trio.sleep(0.02)
    raise AssertionError(f"{subject} never got a responder")


async def test_request_reaches_the_other_node_and_errors_cross(nats_server):
    with trio.fail_after(15):
        async with open_nats_bus(nats_server.url, "a") as a, open_nats_bus(nats_server.url, "b") as b:
            async def answer(subject, payload):
                if payload.get("refuse"):
                    raise actor_errors.DeviceRefused("no space left", code="disk_full")
                if payload.get("hub_refuse"):  # what the hub's link raises: a subclass the tree does not name
                    from hub.errors import DeviceError
                    raise DeviceError("no memory test is running", code="not_running")
                if payload.get("bug"):
                    raise KeyError("secret-ish internals")
                return {"subject": subject, "echo": payload}

            sub = a.subscribe("cmd.dev1.>", answer)
            await _until_held(b, "cmd.dev1.ping")
            assert await b.request("cmd.dev1.ping", {"n": 1}, timeout=2) == {
                "subject": "cmd.dev1.ping", "echo": {"n": 1}}
            with pytest.raises(actor_errors.DeviceRefused) as refused:
                await b.request("cmd.dev1.reboot", {"refuse": True}, timeout=2)
            assert (refused.value.code, refused.value.message) == ("disk_full", "no space left")
            with pytest.raises(actor_errors.DeviceRefused) as refused:
                await b.request("cmd.dev1.memtest.cancel", {"hub_refuse": True}, timeout=2)
            assert refused.value.code == "not_running"
            with pytest.raises(BusError) as bug:
                await b.request("cmd.dev1.x", {"bug": True}, timeout=2)
            assert "secret-ish" not in str(bug.value)
            sub.close()

            async def gone() -> bool:
                # While the unsubscribe reaches the server, a request may still be routed to "a": it
                # answers DeviceOffline, or (if the client already dropped the subscription) times out.
                try:
                    await b.request("cmd.dev1.ping", {}, timeout=1)
                    return False
                except NoResponders:
                    return True
                except (actor_errors.DeviceOffline, RequestTimeout):
                    return False
            for _ in range(100):
                if await gone():
                    break
                await trio.sleep(0.02)
            else:
                raise AssertionError("the closed subscription still answers")


async def test_no_responders_is_immediate_and_silence_times_out(nats_server):
    with trio.fail_after(15):
        async with open_nats_bus(nats_server.url, "a") as a, open_nats_bus(nats_server.url, "b") as b:
            started = trio.current_time()
            with pytest.raises(NoResponders):
                await b.request("cmd.nobody.ping", {}, timeout=5)
            assert trio.current_time() - started < 1  # not the 5 s timeout

            async def silent(subject, payload):
                await trio.sleep_forever()

            a.subscribe("cmd.slow.>", silent)
            await trio.sleep(0.2)  # reach the server (a probe would hang in the silent handler)
            started = trio.current_time()
            with pytest.raises(RequestTimeout):
                await b.request("cmd.slow.ping", {}, timeout=0.5)
            assert 0.4 < trio.current_time() - started < 2


async def test_newest_local_subscription_wins_and_older_close_keeps_it(nats_server):
    with trio.fail_after(15):
        async with open_nats_bus(nats_server.url, "a") as a, open_nats_bus(nats_server.url, "b") as b:
            async def old(subject, payload):
                return {"who": "old"}

            async def new(subject, payload):
                return {"who": "new"}

            first = a.subscribe("cmd.d.>", old)
            await _until_held(b, "cmd.d.ping")
            a.subscribe("cmd.d.>", new)
            first.close()  # the old link ends after the new one took over: the new one keeps the subject
            await trio.sleep(0.1)
            assert await b.request("cmd.d.ping", {}, timeout=2) == {"who": "new"}


async def test_publish_reaches_every_subscriber(nats_server):
    with trio.fail_after(15):
        async with open_nats_bus(nats_server.url, "a") as a, open_nats_bus(nats_server.url, "b") as b:
            heard: list[tuple[str, dict]] = []

            async def listen(subject, payload):
                heard.append((subject, payload))

            a.subscribe("events.org.*", listen)
            await trio.sleep(0.2)
            b.publish("events.org.o1", {"kind": "x"})
            await wait_for(lambda: heard == [("events.org.o1", {"kind": "x"})], timeout=5)


async def test_a_nats_restart_fails_requests_fast_then_the_subscriptions_come_back(nats_server):
    with trio.fail_after(30):
        async with open_nats_bus(nats_server.url, "a") as a, open_nats_bus(nats_server.url, "b") as b:
            async def answer(subject, payload):
                return {"ok": True}

            a.subscribe("cmd.dev.>", answer)
            await _until_held(b, "cmd.dev.ping")
            await trio.to_thread.run_sync(nats_server.stop)
            await wait_for(lambda: not b.connected, timeout=5)
            started = trio.current_time()
            with pytest.raises(Unavailable):  # not NoResponders: whether a node holds it is unknown
                await b.request("cmd.dev.ping", {}, timeout=5)
            assert trio.current_time() - started < 0.5  # not the 5 s timeout: the bus knows it is cut off
            await trio.to_thread.run_sync(nats_server.start)  # the same port
            await wait_for(lambda: a.connected and b.connected, timeout=10)
            await _until_held(b, "cmd.dev.ping")  # a's subscription is back without subscribing again
            assert await b.request("cmd.dev.ping", {}, timeout=2) == {"ok": True}
            assert a.reconnects >= 1 and b.reconnects >= 1


async def test_an_error_inside_the_bus_s_lifetime_leaves_it_unchanged(nats_server):
    """A hub whose start fails inside ``open_nats_bus`` must say why: closing the bus once let a
    Cancelled replace the error, which the bus's nursery then swallowed ("generator didn't yield")."""
    with trio.fail_after(15):
        with pytest.raises(BaseExceptionGroup) as caught:
            async with open_nats_bus(nats_server.url, "a"):
                raise LookupError("the real reason the hub could not start")
        assert caught.group_contains(LookupError, match="real reason")


async def test_a_connection_that_dies_silently_is_found_and_replaced(nats_server):
    """The link to the server stops passing bytes with no close (nats.py issues #522, #671: its own
    PING would take minutes to notice): the bus's probe finds it within seconds, requests fail at once
    meanwhile, and once the network is back the bus reconnects and its subscriptions answer again."""
    from tests.cluster.natstools import CuttableLink

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            link = await nursery.start(CuttableLink(int(nats_server.url.rsplit(":", 1)[1])).run)
            async with open_nats_bus(nats_server.url, "a") as a, open_nats_bus(link.url, "b") as b:
                async def answer(subject, payload):
                    return {"ok": True}

                b.subscribe("cmd.dev.>", answer)  # b holds the device; its link to the server dies
                await _until_held(a, "cmd.dev.ping")
                link.stall()
                stalled = trio.current_time()
                await wait_for(lambda: not b.connected, timeout=15)
                assert trio.current_time() - stalled < b.probe_every + b.stall_after + 1
                await wait_for(lambda: b.stale >= 1, timeout=15)
                assert trio.current_time() - stalled < b.probe_every + b.probe_timeout + 3
                started = trio.current_time()
                with pytest.raises(Unavailable):
                    await b.request("cmd.other.ping", {}, timeout=5)  # held elsewhere, if anywhere
                assert trio.current_time() - started < 0.5
                assert await b.request("cmd.dev.ping", {}, timeout=5) == {"ok": True}  # held here: in process
                assert b.statistics()["stalls"] >= 1 and b.local >= 1
                assert trio.current_time() - started < 0.5
                await link.heal()
                await wait_for(lambda: b.connected, timeout=20)
                await _until_held(a, "cmd.dev.ping")  # b's subscription is back on the server
                assert await a.request("cmd.dev.ping", {}, timeout=2) == {"ok": True}
            nursery.cancel_scope.cancel()


async def test_publishes_cross_in_batches_in_order_and_what_is_dropped_is_counted(nats_server):
    """5,000 broadcasts from one trio burst reach a subscriber in order, carried by far fewer asyncio
    tasks than messages; published with NATS down, they are counted as dropped, not lost silently."""
    with trio.fail_after(30):
        async with open_nats_bus(nats_server.url, "a") as a, open_nats_bus(nats_server.url, "b") as b:
            heard = []

            async def got(subject, payload):
                heard.append(payload["n"])

            b.subscribe("events.org.x", got)
            await trio.sleep(0.3)  # the subscription reaches the server
            for n in range(5000):
                a.publish("events.org.x", {"n": n})
            await wait_for(lambda: len(heard) == 5000, timeout=20)
            assert sorted(heard) == list(range(5000))
            assert a.published == 5000 and a.publish_batches < 500, a.statistics()
            assert a.publish_dropped == 0 and a.publish_failed == 0
            await trio.to_thread.run_sync(nats_server.stop)
            await wait_for(lambda: not a.connected, timeout=5)
            a.publish("events.org.x", {"n": -1})
            assert a.publish_dropped == 1 and a.statistics()["publish_dropped"] == 1
            await trio.to_thread.run_sync(nats_server.start)


async def test_a_request_in_flight_when_the_server_stalls_fails_within_two_seconds(nats_server):
    """nats-server SIGSTOPped (issue 38 item 3): the bus's probe notices within about
    ``probe_every + stall_after`` and ends the request then, with Unavailable, instead of letting it wait
    out its 10 s timeout; a subject this process holds is still answered, in process."""
    import os
    import signal

    with trio.fail_after(30):
        async with open_nats_bus(nats_server.url, "a") as a, open_nats_bus(nats_server.url, "b") as b:
            async def answer(subject, payload):
                return {"ok": True}

            a.subscribe("cmd.dev.>", answer)
            await _until_held(b, "cmd.dev.ping")
            sigstop(nats_server.proc.pid)  # returns once it has stopped
            try:
                started = trio.current_time()
                with pytest.raises(Unavailable):
                    await b.request("cmd.dev.ping", {}, timeout=10)
                took = trio.current_time() - started
                assert took < b.probe_every + b.stall_after + 0.5, took
                assert not b.connected and b.stalls == 1
                assert await a.request("cmd.dev.ping", {}, timeout=10) == {"ok": True}
            finally:
                os.kill(nats_server.proc.pid, signal.SIGCONT)
            await wait_for(lambda: a.connected and b.connected, timeout=15)
            assert await b.request("cmd.dev.ping", {}, timeout=5) == {"ok": True}


async def test_a_request_waiting_when_the_connection_dies_fails_then_not_at_its_timeout(nats_server):
    """Issue 38: a configuration apply waits up to 120 s for its reply. When the connection dies under
    it, nats-py would keep it waiting all that time for a reply the dead connection cannot bring, and
    the device would be judged failed by the timeout: it ends as soon as the bus knows (Unavailable:
    nothing is known to have reached the device)."""
    from tests.cluster.natstools import CuttableLink

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            link = await nursery.start(CuttableLink(int(nats_server.url.rsplit(":", 1)[1])).run)
            async with open_nats_bus(nats_server.url, "a") as a, open_nats_bus(link.url, "b") as b:
                async def silent(subject, payload):
                    await trio.sleep_forever()

                a.subscribe("cmd.dev.>", silent)  # a holds the device, which takes its time to answer
                await trio.sleep(0.2)  # reach the server
                ended: list[float] = []

                async def ask() -> None:
                    with pytest.raises(Unavailable):
                        await b.request("cmd.dev.config.apply", {}, timeout=30)
                    ended.append(trio.current_time())

                nursery.start_soon(ask)
                await trio.sleep(0.3)
                link.stall()  # b's link to the server stops passing bytes
                stalled = trio.current_time()
                await wait_for(lambda: bool(ended), timeout=20)
                assert ended[0] - stalled < b.probe_every + b.probe_timeout + 3  # found by the probe, not 30 s
                assert b.dropped_in_flight == 1
            nursery.cancel_scope.cancel()
