"""The in-process command bus: subject matching, newest subscription wins, request/reply errors."""

from __future__ import annotations

import pytest
import trio

from actors.bus import Bus, NoResponders, RequestTimeout
from actors.errors import DeviceRefused


def answering(name: str, calls: list | None = None):
    async def handler(subject: str, payload: dict) -> dict:
        if calls is not None:
            calls.append((name, subject, payload))
        return {"by": name, "subject": subject, **payload}
    return handler


async def test_exact_subject():
    with trio.fail_after(1):
        bus = Bus()
        calls: list = []
        bus.subscribe("cmd.d1.reboot", answering("exact", calls))
        assert await bus.request("cmd.d1.reboot", {"n": 1}, timeout=1) == \
            {"by": "exact", "subject": "cmd.d1.reboot", "n": 1}
        assert calls == [("exact", "cmd.d1.reboot", {"n": 1})]
        for other in ("cmd.d1.reboot.now", "cmd.d1", "cmd.d2.reboot", "cmd.d1.rebootx"):
            assert not bus.has_responder(other)
            with pytest.raises(NoResponders):
                await bus.request(other, {}, timeout=1)


async def test_prefix_pattern_takes_the_rest_of_the_subject():
    with trio.fail_after(1):
        bus = Bus()
        bus.subscribe("cmd.d1.>", answering("d1"))
        assert (await bus.request("cmd.d1.reboot", {}, timeout=1))["by"] == "d1"
        assert (await bus.request("cmd.d1.tunnel.open", {}, timeout=1))["subject"] == "cmd.d1.tunnel.open"
        assert not bus.has_responder("cmd.d1")       # ">" needs at least one more token
        assert not bus.has_responder("cmd.d10.reboot")
        assert not bus.has_responder("cmd.d2.reboot")


async def test_exact_beats_prefix_and_longer_prefix_beats_shorter():
    with trio.fail_after(1):
        bus = Bus()
        bus.subscribe("cmd.>", answering("all"))
        bus.subscribe("cmd.d1.>", answering("d1"))
        bus.subscribe("cmd.d1.reboot", answering("exact"))
        assert (await bus.request("cmd.d1.reboot", {}, timeout=1))["by"] == "exact"
        assert (await bus.request("cmd.d1.ping", {}, timeout=1))["by"] == "d1"
        assert (await bus.request("cmd.d2.ping", {}, timeout=1))["by"] == "all"


async def test_star_matches_exactly_one_token():
    with trio.fail_after(1):
        bus = Bus()
        bus.subscribe("cmd.*.reboot", answering("star"))
        assert (await bus.request("cmd.d7.reboot", {}, timeout=1))["by"] == "star"
        assert not bus.has_responder("cmd.reboot")
        assert not bus.has_responder("cmd.d7.x.reboot")
        assert not bus.has_responder("cmd.d7.reboot.now")
        bus.subscribe("cmd.*.tunnel.>", answering("star-rest"))
        assert (await bus.request("cmd.d7.tunnel.open", {}, timeout=1))["by"] == "star-rest"
        assert not bus.has_responder("cmd.d7.tunnel")


async def test_newest_subscription_of_a_pattern_wins_and_closing_the_old_one_keeps_it():
    with trio.fail_after(1):
        bus = Bus()
        old = bus.subscribe("cmd.d1.>", answering("old"))
        new = bus.subscribe("cmd.d1.>", answering("new"))
        assert (await bus.request("cmd.d1.reboot", {}, timeout=1))["by"] == "new"
        old.close()
        assert (await bus.request("cmd.d1.reboot", {}, timeout=1))["by"] == "new"
        assert bus.statistics() == {"subscriptions": 1}
        new.close()
        with pytest.raises(NoResponders):
            await bus.request("cmd.d1.reboot", {}, timeout=1)
        assert bus.statistics() == {"subscriptions": 0}


async def test_subscription_as_context_manager_unsubscribes():
    with trio.fail_after(1):
        bus = Bus()
        with bus.subscribe("cmd.d1.>", answering("d1")):
            assert bus.has_responder("cmd.d1.reboot")
        assert not bus.has_responder("cmd.d1.reboot")


async def test_no_responders_is_raised_at_once(autojump_clock):
    with trio.fail_after(1):
        bus = Bus()
        start = trio.current_time()
        with pytest.raises(NoResponders, match="cmd.d1.reboot"):
            await bus.request("cmd.d1.reboot", {}, timeout=30)
        assert trio.current_time() == start


async def test_request_timeout_at_the_exact_virtual_time(autojump_clock):
    with trio.fail_after(100):
        bus = Bus()
        cancelled = trio.Event()

        async def silent(subject, payload):
            try:
                await trio.sleep_forever()
            finally:
                cancelled.set()

        bus.subscribe("cmd.d1.>", silent)
        await trio.sleep(3)
        with pytest.raises(RequestTimeout, match="cmd.d1.reboot"):
            await bus.request("cmd.d1.reboot", {}, timeout=7.5)
        assert trio.current_time() == 10.5
        assert cancelled.is_set()  # the handler does not go on running after the caller gave up


async def test_slow_answer_within_the_timeout_is_returned(autojump_clock):
    with trio.fail_after(100):
        bus = Bus()

        async def slow(subject, payload):
            await trio.sleep(4.999)
            return {"ok": True}

        bus.subscribe("cmd.d1.>", slow)
        assert await bus.request("cmd.d1.ping", {}, timeout=5) == {"ok": True}
        assert trio.current_time() == 4.999


async def test_handler_exceptions_propagate_to_the_requester():
    with trio.fail_after(1):
        bus = Bus()

        async def failing(subject, payload):
            raise DeviceRefused("disk full", code="enospc")

        bus.subscribe("cmd.d1.>", failing)
        with pytest.raises(DeviceRefused, match="disk full") as info:
            await bus.request("cmd.d1.reboot", {}, timeout=1)
        assert info.value.code == "enospc"  # its HTTP status is the hub's business (hub/errors.py)
