"""Parked actors (issue 22) on trio's virtual clock: an idle actor has no task; a message or its
deadline, through the Supervisor's one timer task, starts one again, with its state kept.

Tasks are counted in the test's nursery, which is the Supervisor's: an awake actor's task is named
after ``Supervisor._keep_running``, the timer after ``ParkTimer._run_timer`` (actors/_runtime/parktimer.py).
"""

from __future__ import annotations

import contextvars
import math
import random
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from actors.device import GetLive
from actors.errors import ActorCrashed, ActorStopped, Conflict
from actors.machines.connection import Heartbeat
from actors.runtime import Actor, Registry, Supervisor
from tests.actors.test_runtime import Probe
from tests.actors.test_device_actor import SETTINGS, connect, hub, state_event


class Sleeper(Probe):
    """tests/actors/test_runtime.py's Probe that keeps what it saw in memory (which a restart, not a
    park, would lose: ``on_start`` clears it), with deadlines, a time to stop and a few more messages."""

    mailbox_size = 16

    def __init__(self, key="sleeper", *, deadlines: list[float] | None = None, stop_at: float = math.inf) -> None:
        super().__init__(key)
        self.deadlines = deadlines or []
        self.stop_at = stop_at
        self.running_seen = 0  # the most actor tasks the supervisor ran while this one handled a message

    async def on_start(self) -> None:
        await super().on_start()
        self.seen = []

    async def receive(self, msg):
        self.running_seen = max(self.running_seen, self._supervisor.running)
        kind, *args = msg
        if kind == "background":
            self.tasks.start_soon(trio.sleep, args[0])
            return None
        if kind == "var":
            return VAR.get()
        if kind == "later":
            self.deadlines[0] = args[0]
            return None
        return await super().receive(msg)  # echo, sleep, crash, refuse

    def next_deadline(self) -> float:
        return min(self.deadlines[0] if self.deadlines else math.inf, self.stop_at)

    async def on_deadline(self) -> None:
        if self.deadlines and self.deadlines[0] <= trio.current_time():
            self.fired.append(trio.current_time())
            self.deadlines.pop(0)

    def should_stop(self) -> bool:
        return trio.current_time() >= self.stop_at


VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_parking_var", default="unset")


@asynccontextmanager
async def supervised(actor: Actor, limit: float = 100):
    """``actor`` started under a Supervisor in a nursery of the test's (its tasks are counted there),
    within ``limit`` seconds of virtual time; the nursery is cancelled when the block ends."""
    with trio.fail_after(limit):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery)
            yield nursery, sup, await sup.start(actor)
            nursery.cancel_scope.cancel()


def actor_tasks(nursery: trio.Nursery) -> list[str]:
    return sorted(t.name.rsplit(".", 1)[-1] for t in nursery.child_tasks)


async def test_an_idle_actor_parks_after_park_after_and_keeps_its_state(autojump_clock):
    async with supervised(Sleeper()) as (nursery, sup, actor):
        assert await actor.ask(("echo", "kept"), timeout=1) == "kept"
        await trio.sleep(0.999)
        assert actor_tasks(nursery) == ["_keep_running"] and not actor.parked
        await trio.sleep(0.001)  # idle for park_after (1 s) since the last message: its task ends
        await trio.testing.wait_all_tasks_blocked()
        assert actor_tasks(nursery) == [] and actor.parked
        assert sup.statistics() == {"running": 0, "parked": 1, "wakes": 0, "timers": 0}
        assert actor.seen == ["kept"] and actor.starts == [0]


async def test_tell_and_ask_wake_a_parked_actor_without_on_start(autojump_clock):
    async with supervised(Sleeper()) as (nursery, sup, actor):
        await trio.sleep(10)
        assert actor.parked
        actor.tell(("echo", "told"))
        assert not actor.parked and sup.statistics()["wakes"] == 1
        await trio.sleep(5)
        assert actor.parked
        assert await actor.ask(("echo", "asked"), timeout=1) == "asked"
        assert trio.current_time() == 15  # answered at once
        assert actor.seen == ["told", "asked"]  # in memory across both parks
        assert actor.starts == [0] and actor.restarts == 0
        assert actor.handled == 2 and sup.statistics()["wakes"] == 2
        # an error answer does not keep it awake either
        with pytest.raises(Conflict):
            await actor.ask(("refuse",), timeout=1)
        await trio.sleep(1.5)
        assert actor.parked


async def test_messages_keep_their_order_across_parks_and_wakes(autojump_clock):
    async with supervised(Sleeper()) as (nursery, sup, actor):
        rng = random.Random(22)
        sent = []
        for i in range(40):
            actor.tell(("echo", i))
            sent.append(i)
            if i % 3 == 0:
                actor.tell(("sleep", 0.3))
                sent.append(("slept", 0.3))
            await trio.sleep(rng.choice([0, 0.5, 1.0, 1.5, 3]))
        await trio.sleep(20)
        assert actor.seen == sent
        assert actor.max_active == 1 and actor.starts == [0]


async def test_racing_tells_at_the_moment_of_parking_never_start_two_tasks(autojump_clock):
    async with supervised(Sleeper(), limit=1000) as (nursery, sup, actor):

        async def teller(at: float, n: int) -> None:
            await trio.sleep_until(at)
            actor.tell(("echo", n))

        rng = random.Random(22)
        n = 0
        for _ in range(30):
            actor.tell(("echo", n))  # wakes it: it parks again 1 s after the last message
            n += 1
            park = trio.current_time() + 1
            async with trio.open_nursery() as tellers:
                # tellers at that very instant (trio runs them in no promised order), and around it
                for _ in range(8):
                    tellers.start_soon(teller, park + rng.choice([-0.5, 0, 0, 0, 0.5, 1.5]), n)
                    n += 1
            await trio.sleep(5)
            assert actor.parked
            assert sorted(actor.seen) == list(range(n))  # each handled once, none lost
        assert actor.running_seen == 1 and actor.max_active == 1
        assert sup.statistics()["wakes"] >= 30 and sup.running == 0
        assert actor.starts == [0] and actor.restarts == 0


async def test_deadlines_of_many_parked_actors_are_kept_by_one_timer_task(autojump_clock):
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery)
            actors = []
            for i in range(200):
                # deadlines 5..204.5 s, two per actor, in no particular order
                first = 5 + (i * 37) % 200
                actors.append(await sup.start(Sleeper(f"a{i}", deadlines=[first, first + 0.5 + i % 7])))
            await trio.sleep(2)
            # all parked: one task in all, the timer
            assert actor_tasks(nursery) == ["_run_timer"]
            assert sup.statistics()["running"] == 0 and sup.statistics()["parked"] == 200
            for t in (50, 120):
                await trio.sleep_until(t)
                names = actor_tasks(nursery)
                assert names.count("_run_timer") == 1  # one timer however many actors wait
                assert names.count("_keep_running") == sum(not a.parked for a in actors) < 10
            await trio.sleep_until(300)
            for i, a in enumerate(actors):
                first = 5 + (i * 37) % 200
                assert a.fired == [first, first + 0.5 + i % 7]  # each at its exact virtual instant
                assert a.starts == [0]
            # nothing left to wait for: the timer task ended too
            await trio.testing.wait_all_tasks_blocked()
            assert actor_tasks(nursery) == [] and sup.statistics()["timers"] == 0
            nursery.cancel_scope.cancel()


async def test_a_kept_timer_entry_is_checked_against_the_deadline_the_actor_parked_with_last(autojump_clock):
    async with supervised(Sleeper(deadlines=[10, 100])) as (nursery, sup, actor):
        await trio.sleep(2)
        assert actor.parked and sup.statistics()["timers"] == 1
        actor.tell(("later", 25))  # handled, then it parks again: its entry at 10 is kept (earlier)
        await trio.sleep(2)
        assert actor.parked and sup.statistics() == {"running": 0, "parked": 1, "wakes": 1, "timers": 1}
        await trio.sleep_until(24)
        assert actor.fired == [] and sup.statistics()["wakes"] == 1  # at 10 it looked, and let it sleep
        await trio.sleep_until(30)
        assert actor.fired == [25] and sup.statistics()["wakes"] == 2
        assert sup.statistics()["timers"] == 1  # parked again, with 100
        actor.tell(("later", 40))  # earlier than the kept entry: a new one
        await trio.sleep_until(50)
        assert actor.fired == [25, 40] and sup.statistics()["wakes"] == 4


async def test_a_deadline_read_as_now_plus_an_interval_fires_on_time_across_parks(autojump_clock):
    class Poller(Sleeper):
        """Like the RolloutActor: "poll again in 3 s" from whenever it is asked."""

        def next_deadline(self) -> float:
            return trio.current_time() + 3

        async def on_deadline(self) -> None:
            self.fired.append(trio.current_time())

    async with supervised(Poller()) as (nursery, sup, actor):
        await trio.sleep_until(13.5)
        # it parks a second after each poll and the timer wakes it at the instant read before then
        assert actor.fired == [3, 6, 9, 12]
        assert actor.parked and sup.statistics()["wakes"] == 4


async def test_a_crash_after_a_wake_restarts_with_on_start_and_counts_towards_its_crash_budget(autojump_clock):
    actor = Sleeper()
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, max_restarts=2, window=60, backoff_initial=1.0)
            await sup.start(actor)
            await trio.sleep(5)
            assert actor.parked
            with pytest.raises(ActorCrashed):
                await actor.ask(("crash",), timeout=5)
            actor.tell(("echo", "after"))
            await trio.sleep(5)
            assert actor.starts == [0, 6]  # restarted 1 s later, on_start again
            assert actor.seen == ["after"] and actor.restarts == 1
            assert actor.parked  # and parked again once idle
            actor.tell(("crash",))  # the second crash, after another wake: backoff doubled
            await trio.sleep(10)
            assert actor.starts == [0, 6, 12] and actor.restarts == 2 and actor.parked
            actor.tell(("crash",))  # a third within the window: given up, parked in between or not
            await trio.sleep(5)
            assert actor.stopped and sup.given_up_total == 1
            nursery.cancel_scope.cancel()
    assert actor.restarts == 2 and sup.restarts_total == 2


async def test_background_work_keeps_the_actor_awake_until_it_ends(autojump_clock):
    async with supervised(Sleeper()) as (nursery, sup, actor):
        actor.tell(("background", 7.5))
        await trio.sleep(7)
        assert not actor.parked and len(actor.tasks.child_tasks) == 1
        await trio.sleep(1.49)  # the work ended at 7.5: idle from then on, the actor parks at 8.5
        assert not actor.parked and not actor.tasks.child_tasks
        assert actor_tasks(nursery) == ["_keep_running"]
        await trio.sleep(0.01)
        await trio.testing.wait_all_tasks_blocked()
        assert actor.parked and actor_tasks(nursery) == []


async def test_a_parked_actor_stops_at_its_deadline_and_the_registry_forgets_it(autojump_clock):
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            registry = Registry(Supervisor(nursery))
            actor = await registry.get("k", lambda: Sleeper("k", stop_at=30))  # an offline device's idle timeout
            await trio.sleep(5)
            assert actor.parked and registry.lookup("k") is actor
            await trio.sleep_until(30)
            await trio.testing.wait_all_tasks_blocked()
            assert actor.stopped and not actor.parked and registry.lookup("k") is None
            assert registry.supervisor.statistics()["timers"] == 0
            with pytest.raises(ActorStopped):
                actor.tell(("echo", 1))
            again = await registry.get("k", lambda: Sleeper("k"))
            assert again is not actor and again.starts == [30]
            nursery.cancel_scope.cancel()


async def test_a_wake_does_not_lend_the_wakers_context_to_the_actor(autojump_clock):
    async with supervised(Sleeper()) as (nursery, sup, actor):
        await trio.sleep(5)
        assert actor.parked
        VAR.set("the request's")  # as the hub's request middleware sets the crossings counter
        assert await actor.ask(("var",), timeout=1) == "unset"


async def test_an_online_device_between_heartbeats_has_no_task_and_the_timer_marks_it_offline(autojump_clock):
    assert SETTINGS.heartbeat_timeout == 3
    with trio.fail_after(60):
        async with hub() as s:
            actor = await s.actor()
            sub = s.events.subscribe(("device", actor.device_id))
            link = connect(s, actor)
            for t in (2, 4, 6):
                await trio.sleep_until(t - 0.5)
                assert actor.parked, t  # online, a second after its last heartbeat: no task
                await trio.sleep_until(t)
                actor.tell(Heartbeat("c1"))
            assert (await sub.receive.receive())["payload"]["state"] == "online"
            offline = await sub.receive.receive()  # woken by the shared timer at last seen + timeout
            assert offline == state_event("offline", 6 + SETTINGS.heartbeat_timeout)
            assert trio.current_time() == 9 and link.closed_at == 9
            assert (await actor.ask(GetLive(), timeout=1))["state"] == "offline"
            assert s.stores.devices.reads == 1  # on_start once: every wake found its state in memory
            assert actor.restarts == 0 and s.supervisor.statistics()["wakes"] >= 4
