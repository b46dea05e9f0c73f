"""hub/auth/cache.py on trio's virtual clock: entries refreshed before they expire, off the caller's
path and once however many callers hit them; a value read before a forget is never kept."""

from __future__ import annotations

import pytest
import trio

from hub.auth.cache import AuthCache


class Loads:
    """A storage lookup stand-in: counts calls, can be held mid-load, returns ``value``."""

    def __init__(self, value="row-1") -> None:
        self.value = value
        self.calls = 0
        self.gate: trio.Event | None = None
        self.fail = False

    async def __call__(self):
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise OSError("storage away")
        return self.value


def tags(_value) -> tuple[str, ...]:
    return ("pat:1",)


@pytest.fixture
async def cache(nursery):
    c = AuthCache(ttl=30.0, refresh_before=10.0)
    await nursery.start(c.keep_fresh)
    return c


async def test_a_hit_near_expiry_answers_at_once_and_is_refreshed_in_the_background(cache, autojump_clock):
    load = Loads()
    assert await cache.get_or_load("k", load, tags) == "row-1" and load.calls == 1
    await trio.sleep(15)
    assert await cache.get_or_load("k", load, tags) == "row-1" and load.calls == 1  # not yet due
    await trio.sleep(10)  # 25 s: inside the last 10 s
    load.value, load.gate = "row-2", trio.Event()
    assert await cache.get_or_load("k", load, tags) == "row-1"  # answered from the cache, not waiting
    await trio.sleep(0.1)
    assert load.calls == 2 and cache.refreshes == 0  # the refresh is in flight, in keep_fresh
    load.gate.set()
    await trio.sleep(0.1)
    assert cache.refreshes == 1
    await trio.sleep(10)  # 35 s: the first load would have expired
    misses = cache.misses
    assert await cache.get_or_load("k", load, tags) == "row-2"
    assert cache.misses == misses and load.calls == 2


async def test_many_callers_at_once_cost_one_refresh(cache, autojump_clock):
    load = Loads()
    await cache.get_or_load("k", load, tags)
    await trio.sleep(25)
    load.gate = trio.Event()
    async with trio.open_nursery() as callers:
        for _ in range(16):
            callers.start_soon(cache.get_or_load, "k", load, tags)
    await trio.sleep(0.1)  # every caller answered from the cache; keep_fresh has started its load
    assert load.calls == 2  # one refresh, however many hits found it due
    load.gate.set()
    await trio.sleep(0.1)
    for _ in range(16):
        await cache.get_or_load("k", load, tags)
    assert load.calls == 2


async def test_callers_that_miss_together_share_one_load(cache, autojump_clock):
    load = Loads()
    load.gate = trio.Event()
    got = []

    async def caller():
        got.append(await cache.get_or_load("k", load, tags))

    async with trio.open_nursery() as callers:
        for _ in range(16):
            callers.start_soon(caller)
        await trio.sleep(0.1)
        load.gate.set()
    assert got == ["row-1"] * 16 and load.calls == 1
    gone = Loads(None)  # nothing found is not kept: the next caller looks again
    await cache.get_or_load("gone", gone, tags)
    await cache.get_or_load("gone", gone, tags)
    assert gone.calls == 2


async def test_a_forget_during_a_load_keeps_nothing_of_what_was_read(cache, autojump_clock):
    load = Loads()
    load.gate = trio.Event()
    async with trio.open_nursery() as n:
        n.start_soon(cache.get_or_load, "k", load, tags)
        await trio.sleep(0.1)
        cache.forget("pat:1")  # revoked while the lookup was on its way: what it read may be stale
        load.gate.set()
    load.gate = None
    assert await cache.get_or_load("k", load, tags) == "row-1" and load.calls == 2  # looked up again


async def test_a_forget_during_a_refresh_is_not_undone_by_it(cache, autojump_clock):
    load = Loads()
    await cache.get_or_load("k", load, tags)
    await trio.sleep(25)
    load.gate = trio.Event()
    await cache.get_or_load("k", load, tags)  # due: the refresh starts and waits at the gate
    await trio.sleep(0.1)
    cache.forget("pat:1")
    load.gate.set()
    await trio.sleep(0.1)
    assert cache.get("k") is None and cache.refreshes == 0


async def test_a_refresh_that_finds_nothing_drops_the_entry_and_a_failed_one_leaves_it(cache, autojump_clock):
    gone, broken = Loads(), Loads()
    await cache.get_or_load("gone", gone, tags)
    await cache.get_or_load("broken", broken, tags)
    await trio.sleep(25)
    gone.value, broken.fail = None, True
    assert await cache.get_or_load("gone", gone, tags) == "row-1"
    assert await cache.get_or_load("broken", broken, tags) == "row-1"
    await trio.sleep(0.1)
    assert cache.get("gone") is None  # deleted in storage: the next request hears so
    assert cache.get("broken") == "row-1"  # storage away: kept until it expires, as before
    await trio.sleep(6)
    assert cache.get("broken") is None


async def test_without_keep_fresh_an_entry_simply_expires(autojump_clock):
    c, load = AuthCache(ttl=30.0, refresh_before=10.0), Loads()
    await c.get_or_load("k", load, tags)
    await trio.sleep(25)
    await c.get_or_load("k", load, tags)
    await trio.sleep(6)
    assert load.calls == 1 and c.get("k") is None
    await c.get_or_load("k", load, tags)
    assert load.calls == 2
