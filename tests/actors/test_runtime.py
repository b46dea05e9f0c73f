"""The actor runtime on trio's virtual clock: ask/tell, mailboxes, supervision, the registry.

Every test runs under pytest-trio's ``autojump_clock``, so backoffs, windows and deadlines of many
seconds pass at once and the tests assert the exact virtual instant things happen at.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import trio
import trio.testing

from actors.runtime import (
    Actor,
    ActorCrashed,
    ActorStatistics,
    ActorStopped,
    AskTimeout,
    MailboxFull,
    Registry,
    Reply,
    Supervisor,
)
from actors.errors import AskError, Conflict, NotFound
from storage.db import DatabaseUnavailable


class Boom(Exception):
    """A bug inside an actor: not an AskError."""


class Probe(Actor):
    """Records what it saw; messages are tuples naming what to do."""

    mailbox_size = 4

    def __init__(self, key="probe", *, fail_starts: tuple[int, ...] = ()) -> None:
        super().__init__(key)
        self.fail_starts = fail_starts  # which on_start calls (1-based) raise
        self.starts: list[float] = []
        self.seen: list = []
        self.active = 0
        self.max_active = 0
        self.deferred: list[Reply] = []
        self.deadlines: list[float] = []
        self.fired: list[float] = []
        self.stop_when_idle = False

    async def on_start(self) -> None:
        self.starts.append(trio.current_time())
        if len(self.starts) in self.fail_starts:
            raise Boom(f"start {len(self.starts)} failed")

    async def receive(self, msg):
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            kind, *args = msg
            if kind == "echo":
                self.seen.append(args[0])
                return args[0]
            if kind == "sleep":
                await trio.sleep(args[0])
                self.seen.append(("slept", args[0]))
                return trio.current_time()
            if kind == "wait":
                await args[0].wait()
                return "released"
            if kind == "crash":
                raise Boom("crash")
            if kind == "refuse":
                raise Conflict("not now")
            if kind == "defer":
                self.deferred.append(self.defer_reply())
                return "returned-value-is-ignored"
            if kind == "crash-in-background":
                reply = self.defer_reply()

                async def background():
                    await trio.sleep(0)
                    reply.fail(ActorCrashed("background work failed"))
                    raise Boom("background crash")

                self.tasks.start_soon(background)
                return None
            if kind == "stop-when-idle":
                self.stop_when_idle = True
                return None
            return await super().receive(msg)
        finally:
            self.active -= 1

    def next_deadline(self) -> float:
        return self.deadlines[0] if self.deadlines else math.inf

    async def on_deadline(self) -> None:
        self.fired.append(trio.current_time())
        self.deadlines.pop(0)

    def should_stop(self) -> bool:
        return self.stop_when_idle


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


# -- ask and tell -------------------------------------------------------------------------------
async def test_ask_returns_the_reply_and_tell_is_handled(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery).start(Probe())
            assert actor.tell(("echo", "told")) is None
            assert await actor.ask(("echo", "asked"), timeout=1) == "asked"
            assert actor.seen == ["told", "asked"]
            assert actor.handled == 2
            nursery.cancel_scope.cancel()


async def test_messages_are_handled_one_at_a_time_in_order(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery).start(Probe())
            actor.tell(("sleep", 3))
            actor.tell(("echo", 1))
            actor.tell(("sleep", 2))
            # the ask queues behind the rest and its reply comes after both sleeps
            assert await actor.ask(("echo", 2), timeout=10) == 2
            assert trio.current_time() == 5
            assert actor.seen == [("slept", 3), 1, ("slept", 2), 2]
            assert actor.max_active == 1
            nursery.cancel_scope.cancel()


async def test_a_full_mailbox_raises_instead_of_dropping(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery).start(Probe())
            gate = trio.Event()
            actor.tell(("wait", gate))
            await trio.testing.wait_all_tasks_blocked()   # the actor holds it; the mailbox is empty
            for i in range(Probe.mailbox_size):
                actor.tell(("echo", i))
            with pytest.raises(MailboxFull) as info:
                actor.tell(("echo", "one too many"))
            assert info.value.code == "busy"
            with pytest.raises(MailboxFull):
                await actor.ask(("echo", "asked too"), timeout=1)
            assert actor.statistics().mailbox_depth == Probe.mailbox_size
            gate.set()
            await trio.testing.wait_all_tasks_blocked()
            assert await actor.ask(("echo", "after"), timeout=1) == "after"
            assert actor.seen == [0, 1, 2, 3, "after"]  # everything accepted was handled, nothing else
            nursery.cancel_scope.cancel()


async def test_ask_times_out_at_the_exact_virtual_time(autojump_clock):
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery).start(Probe())
            await trio.sleep(1.5)
            with pytest.raises(AskTimeout) as info:
                await actor.ask(("sleep", 60), timeout=7)
            assert trio.current_time() == 8.5
            assert info.value.code == "timeout"
            # the actor was not disturbed: it finishes the message and answers the next ask
            assert await actor.ask(("echo", "next"), timeout=60) == "next"
            assert trio.current_time() == 61.5
            nursery.cancel_scope.cancel()


async def test_a_fleethub_error_answers_the_asker_and_the_actor_goes_on(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery)
            actor = await sup.start(Probe())
            with pytest.raises(Conflict, match="not now") as info:
                await actor.ask(("refuse",), timeout=1)
            assert info.value.code == "conflict"
            actor.tell(("refuse",))  # told: nobody to answer, the actor still goes on
            assert await actor.ask(("echo", 1), timeout=1) == 1
            assert actor.starts == [0] and actor.restarts == 0 and sup.restarts_total == 0
            assert actor.handled == 3
            nursery.cancel_scope.cancel()


async def test_unknown_message_is_a_crash_not_an_answer(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery, backoff_initial=1.0).start(Probe())
            with pytest.raises(ActorCrashed):
                await actor.ask(("nonsense",), timeout=5)
            assert await actor.ask(("echo", 1), timeout=5) == 1
            assert actor.restarts == 1
            nursery.cancel_scope.cancel()


# -- supervision --------------------------------------------------------------------------------
async def test_crash_answers_asker_and_supervisor_restarts_with_backoff(autojump_clock):
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, backoff_initial=1.0, backoff_max=10.0)
            actor = await sup.start(Probe())
            gate = trio.Event()
            actor.tell(("wait", gate))
            await trio.testing.wait_all_tasks_blocked()
            results: dict = {}

            async def ask(name, msg):
                try:
                    results[name] = (await actor.ask(msg, timeout=50), trio.current_time())
                except AskError as exc:
                    results[name] = (exc, trio.current_time())

            # queue a crash and, behind it, two messages; then let the actor go
            nursery.start_soon(ask, "crash", ("crash",))
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(ask, "behind", ("echo", "behind"))
            await trio.testing.wait_all_tasks_blocked()
            actor.tell(("echo", "told-behind"))
            await trio.sleep(2)
            gate.set()
            await trio.sleep(5)

            crash, crashed_at = results["crash"]
            assert isinstance(crash, ActorCrashed) and crashed_at == 2
            # restarted after backoff_initial: on_start ran again, then the queued messages
            assert actor.starts == [0, 3]
            assert results["behind"] == ("behind", 3)
            assert actor.seen == ["behind", "told-behind"]
            assert actor.restarts == 1 and sup.restarts_total == 1
            assert actor.statistics().restarts == 1

            # the backoff doubles: second crash restarts 2 s later, third 4 s later
            assert trio.current_time() == 7
            actor.tell(("crash",))
            await trio.sleep(10)
            actor.tell(("crash",))
            await trio.sleep(10)
            assert actor.starts == [0, 3, 9, 21]
            assert actor.restarts == 3
            nursery.cancel_scope.cancel()


async def test_backoff_is_capped_at_backoff_max(autojump_clock):
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, max_restarts=100, window=1000.0, backoff_initial=1.0, backoff_max=3.0)
            actor = await sup.start(Probe())
            for _ in range(4):
                crashed_at = trio.current_time()
                actor.tell(("crash",))
                await trio.sleep(20)
                assert actor.starts[-1] - crashed_at == min(2 ** (len(actor.starts) - 2), 3.0)
            assert actor.starts == [0, 1, 22, 43, 63]
            nursery.cancel_scope.cancel()


async def test_backoff_starts_again_after_a_stable_window(autojump_clock):
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, max_restarts=100, window=10.0, backoff_initial=1.0, backoff_max=8.0)
            actor = await sup.start(Probe())
            actor.tell(("crash",))
            await trio.sleep(5)
            actor.tell(("crash",))       # within the window of the first crash: backoff doubles
            await trio.sleep(20)
            actor.tell(("crash",))       # 20 s of calm, longer than the window: back to the initial
            await trio.sleep(5)
            assert actor.starts == [0, 1, 7, 26]
            nursery.cancel_scope.cancel()


async def test_more_than_max_restarts_within_the_window_gives_the_actor_up_not_the_process(autojump_clock):
    # Before: Escalation left the supervisor's nursery and stopped the process, so one device that
    # crashed its own actor six times in a minute took the hub's other devices down with it.
    actor, other = Probe(), Probe("other")
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, max_restarts=2, window=60, backoff_initial=1.0)
            registry = Registry(sup)
            await registry.get("probe", lambda: actor)
            await registry.get("other", lambda: other)
            for _ in range(3):
                actor.tell(("crash",))
            actor.tell(("echo", "queued behind the crashes"))
            await trio.sleep(10)
            assert actor.starts == [0, 1, 3]
            assert actor.restarts == 2 and sup.restarts_total == 2 and sup.given_up_total == 1
            assert actor.stopped and registry.lookup("probe") is None
            with pytest.raises(ActorStopped):
                await actor.ask(("echo", "late"), timeout=1)
            assert await other.ask(("echo", "still here"), timeout=1) == "still here"
            fresh = await registry.get("probe", Probe)  # the next message for the key starts a fresh one
            assert fresh is not actor and await fresh.ask(("echo", "again"), timeout=1) == "again"
            nursery.cancel_scope.cancel()


async def test_an_actor_given_up_answers_every_asker_waiting_in_its_mailbox(autojump_clock):
    actor = Probe()
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, max_restarts=0)
            await sup.start(actor)
            actor.tell(("crash",))
            answers = []

            async def ask() -> None:
                try:
                    answers.append(await actor.ask(("echo", "x"), timeout=50))
                except ActorStopped as exc:
                    answers.append(exc)

            nursery.start_soon(ask)
            await trio.sleep(5)
            assert len(answers) == 1 and isinstance(answers[0], ActorStopped) and actor.stopped
            nursery.cancel_scope.cancel()


async def test_restarts_spread_over_more_than_the_window_do_not_escalate(autojump_clock):
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, max_restarts=2, window=10, backoff_initial=1.0, backoff_max=1.0)
            actor = await sup.start(Probe())
            for t in (0, 6, 12, 18, 24, 30):  # never more than 2 crashes within any 10 s
                await trio.sleep_until(t)
                actor.tell(("crash",))
            await trio.sleep(5)
            assert actor.restarts == 6 and sup.restarts_total == 6
            assert actor.starts == [0, 1, 7, 13, 19, 25, 31]
            assert await actor.ask(("echo", "alive"), timeout=1) == "alive"
            nursery.cancel_scope.cancel()


async def test_crash_in_on_start_of_the_first_start_reaches_the_caller_unrestarted(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, backoff_initial=1.0)
            actor = Probe(fail_starts=(1,))
            with pytest.raises(BaseException) as info:
                await sup.start(actor)
            assert [str(e) for e in leaves(info.value)] == ["start 1 failed"]
            await trio.sleep(5)
            assert actor.starts == [0]  # not retried
            assert actor.restarts == 0 and sup.restarts_total == 0
            assert len(nursery.child_tasks) == 0


async def test_error_from_on_start_reaches_the_caller_as_itself(autojump_clock):
    class Missing(Probe):
        async def on_start(self) -> None:
            raise NotFound("fleet not found")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            with pytest.raises(NotFound):
                await Supervisor(nursery).start(Missing())


async def test_crash_in_on_start_after_a_restart_is_another_crash(autojump_clock):
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, backoff_initial=1.0)
            actor = await sup.start(Probe(fail_starts=(2,)))
            actor.tell(("crash",))
            actor.tell(("echo", "queued"))
            await trio.sleep(10)
            assert actor.starts == [0, 1, 3]  # start 2 failed, backoff doubled, start 3 came up
            assert actor.restarts == 2
            assert actor.seen == ["queued"]
            nursery.cancel_scope.cancel()


async def test_a_crash_in_background_work_is_the_actors_crash(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery, backoff_initial=1.0).start(Probe())
            with pytest.raises(ActorCrashed):
                await actor.ask(("crash-in-background",), timeout=5)
            await trio.sleep(2)
            assert actor.restarts == 1 and actor.starts == [0, 1]
            assert await actor.ask(("echo", 1), timeout=1) == 1
            nursery.cancel_scope.cancel()


async def test_a_crash_at_the_moment_of_shutdown_does_not_escape_the_supervisor(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery, backoff_initial=1.0).start(Probe())
            with pytest.raises(ActorCrashed):
                await actor.ask(("crash-in-background",), timeout=5)
            nursery.cancel_scope.cancel()  # shutting down while the crash unwinds


# -- storage outages -----------------------------------------------------------------------------
class Storage:
    """PostgreSQL as the runtime sees it: while ``down``, every read raises DatabaseUnavailable."""

    def __init__(self) -> None:
        self.down = False
        self.reads = 0

    def read(self) -> int:
        if self.down:
            raise DatabaseUnavailable("the database is not reachable (OSError)")
        self.reads += 1
        return self.reads


class Ticker(Probe):
    """Shaped like the RolloutActor: reads storage when it starts and at a deadline every 0.25 s, and
    keeps what it counted in memory (``ticks``), which a restart would lose."""

    def __init__(self, storage: Storage, key="ticker", **kw) -> None:
        super().__init__(key, **kw)
        self.storage = storage
        self.ticks = 0
        self.tried: list[float] = []
        self.next_tick = 0.0

    async def on_start(self) -> None:
        await super().on_start()
        self.storage.read()
        self.next_tick = trio.current_time()

    def next_deadline(self) -> float:
        return self.next_tick

    async def on_deadline(self) -> None:
        self.tried.append(trio.current_time())
        self.storage.read()
        self.ticks += 1
        self.next_tick = trio.current_time() + 0.25

    async def receive(self, msg):
        if msg == ("read",):
            return self.storage.read()
        return await super().receive(msg)


async def test_deadline_work_waits_out_a_storage_outage_with_backoff(autojump_clock):
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            storage = Storage()
            sup = Supervisor(nursery)
            actor = await sup.start(Ticker(storage))
            await trio.sleep(1.1)
            assert actor.ticks == 5  # 0, 0.25, 0.5, 0.75, 1.0
            storage.down = True
            await trio.sleep_until(30)
            storage.down = False
            await trio.sleep_until(33)
            # tried at the missed tick, then after 0.1, 0.2, 0.4, ... 3.2 and then every 5 s (the cap);
            # the first try after PostgreSQL is back succeeds and the 0.25 s ticks go on from there
            outage = [1.25, 1.35, 1.55, 1.95, 2.75, 4.35, 7.55, 12.55, 17.55, 22.55, 27.55]
            back = [32.55, 32.8]
            assert actor.tried == pytest.approx([0, 0.25, 0.5, 0.75, 1.0] + outage + back)
            assert actor.ticks == 5 + len(back)  # counted in memory before and after: nothing rebuilt
            assert actor.starts == [0] and actor.restarts == 0 and sup.restarts_total == 0
            assert actor.storage_waits == len(outage) and sup.storage_waits_total == len(outage)
            # a later outage starts gently again
            await trio.sleep_until(39.9)
            storage.down = True
            await trio.sleep_until(40.2)
            assert actor.tried[-3:] == pytest.approx([39.8, 40.05, 40.15]) and actor.ticks == 5 + 30
            nursery.cancel_scope.cancel()


async def test_a_hundred_storage_errors_in_a_minute_do_not_escalate(autojump_clock):
    with trio.fail_after(200):
        async with trio.open_nursery() as nursery:
            storage = Storage()
            sup = Supervisor(nursery, max_restarts=5, window=60.0)
            actor = await sup.start(Ticker(storage))
            await trio.sleep(1.1)
            storage.down = True
            for _ in range(100):  # every ask reads storage: each asker hears the outage at once
                asked = trio.current_time()
                with pytest.raises(DatabaseUnavailable):
                    await actor.ask(("read",), timeout=5)
                assert trio.current_time() == asked
                await trio.sleep(0.59)
            assert trio.current_time() == pytest.approx(60.1)
            ticks = actor.ticks
            assert ticks == 5
            storage.down = False
            await trio.sleep(5.25)  # at most one backoff (capped at 5 s) plus a tick
            assert actor.ticks > ticks
            assert await actor.ask(("read",), timeout=1) == storage.reads
            assert actor.starts == [0] and actor.restarts == 0 and sup.restarts_total == 0
            assert actor.storage_waits >= 100 and sup.storage_waits_total == actor.storage_waits
            nursery.cancel_scope.cancel()


async def test_a_restart_during_an_outage_waits_for_storage_without_counting_crashes(autojump_clock):
    with trio.fail_after(200):
        async with trio.open_nursery() as nursery:
            storage = Storage()
            sup = Supervisor(nursery, max_restarts=5, window=60.0, backoff_initial=1.0)
            actor = await sup.start(Ticker(storage))
            await trio.sleep(1.1)
            storage.down = True
            with pytest.raises(ActorCrashed):
                await actor.ask(("crash",), timeout=5)  # a bug, while PostgreSQL is down
            actor.tell(("echo", "queued"))
            await trio.sleep_until(90)
            # on_start after the crash's backoff (2.1) failed on storage, then every backoff up to 5 s
            assert actor.starts[:6] == pytest.approx([0, 2.1, 2.2, 2.4, 2.8, 3.6])
            assert all(b - a == pytest.approx(5) for a, b in zip(actor.starts[8:], actor.starts[9:]))
            assert actor.seen == []  # not started yet: the mailbox waits
            storage.down = False
            await trio.sleep(5.1)
            assert actor.seen == ["queued"]  # the restart came up and handled what waited
            assert actor.restarts == 1 and sup.restarts_total == 1  # the bug, and only the bug
            assert actor.storage_waits == len(actor.starts) - 2 == sup.storage_waits_total  # all but first and last
            nursery.cancel_scope.cancel()


async def test_a_real_bug_still_counts_against_the_crash_budget_during_an_outage(autojump_clock):
    actor = Ticker(Storage())
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, max_restarts=2, window=60, backoff_initial=1.0)
            await sup.start(actor)
            actor.storage.down = True
            for _ in range(10):
                with pytest.raises(DatabaseUnavailable):
                    await actor.ask(("read",), timeout=5)
            actor.storage.down = False
            for _ in range(3):
                actor.tell(("crash",))
            await trio.sleep(10)
            assert actor.stopped and sup.given_up_total == 1  # the outage's failures counted for nothing
            nursery.cancel_scope.cancel()
        assert actor.restarts == 2 and sup.restarts_total == 2


# -- registry and passivation -------------------------------------------------------------------
class SlowStart(Probe):
    created = 0

    def __init__(self, key) -> None:
        super().__init__(key)
        SlowStart.created += 1

    async def on_start(self) -> None:
        await trio.sleep(2)
        await super().on_start()


async def test_registry_starts_exactly_one_actor_under_concurrent_gets(autojump_clock):
    SlowStart.created = 0
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            registry = Registry(Supervisor(nursery))
            got: list = []

            async def get():
                got.append((await registry.get("k", lambda: SlowStart("k")), trio.current_time()))

            async with trio.open_nursery() as getters:
                for _ in range(10):
                    getters.start_soon(get)
            assert SlowStart.created == 1
            assert len({id(a) for a, _ in got}) == 1 and len(got) == 10
            assert {t for _, t in got} == {2}  # nobody got it before it had started
            actor = got[0][0]
            assert actor.starts == [2]
            assert registry.lookup("k") is actor and len(registry) == 1 and registry.actors() == [actor]
            assert await registry.get("k", lambda: SlowStart("k")) is actor and SlowStart.created == 1
            nursery.cancel_scope.cancel()


async def test_a_failed_start_is_not_registered_and_the_next_get_tries_again(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            registry = Registry(Supervisor(nursery))
            with pytest.raises(BaseException) as info:
                await registry.get("k", lambda: Probe("k", fail_starts=(1,)))
            assert any(isinstance(e, Boom) for e in leaves(info.value))
            assert registry.lookup("k") is None and len(registry) == 0
            actor = await registry.get("k", lambda: Probe("k"))
            assert registry.lookup("k") is actor
            nursery.cancel_scope.cancel()


async def test_passivation_removes_the_actor_and_a_later_get_starts_a_fresh_one(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            registry = Registry(Supervisor(nursery))
            first = await registry.get("k", lambda: Probe("k"))
            gate = trio.Event()
            first.tell(("wait", gate))
            await trio.testing.wait_all_tasks_blocked()
            first.tell(("stop-when-idle",))
            first.tell(("echo", 1))
            first.tell(("echo", 2))
            gate.set()
            await trio.testing.wait_all_tasks_blocked()
            # it stopped only once its mailbox was empty: nothing queued was lost
            assert first.seen == [1, 2]
            assert first.stopped and registry.lookup("k") is None and len(registry) == 0
            with pytest.raises(ActorStopped):
                first.tell(("echo", 3))
            with pytest.raises(ActorStopped):
                await first.ask(("echo", 3), timeout=1)
            second = await registry.get("k", lambda: Probe("k"))
            assert second is not first and second.starts == [0]
            assert await second.ask(("echo", "fresh"), timeout=1) == "fresh"
            assert len(nursery.child_tasks) == 1  # the stopped actor's task ended; only the new one runs
            nursery.cancel_scope.cancel()


async def test_registry_statistics(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, backoff_initial=1.0)
            registry = Registry(sup)
            a = await registry.get("a", lambda: Probe("a"))
            b = await registry.get("b", lambda: Probe("b"))
            await a.ask(("echo", 1), timeout=1)
            with pytest.raises(ActorCrashed):
                await a.ask(("crash",), timeout=5)
            gate = trio.Event()
            b.tell(("wait", gate))
            await trio.testing.wait_all_tasks_blocked()
            b.tell(("echo", 1))
            b.tell(("echo", 2))
            assert registry.statistics() == {"actors": 2, "by_kind": {"Probe": 2}, "mailbox_depth_max": 2,
                                             "handled": 2, "restarts": 1, "given_up": 0, "storage_waits": 0}
            gate.set()
            nursery.cancel_scope.cancel()


# -- replies, statistics, deadlines -------------------------------------------------------------
async def test_deferred_reply_is_filled_later_while_the_actor_goes_on(autojump_clock):
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery).start(Probe())
            answers: dict = {}

            async def ask_deferred(name):
                try:
                    answers[name] = (await actor.ask(("defer",), timeout=50), trio.current_time())
                except AskError as exc:
                    answers[name] = (exc, trio.current_time())

            nursery.start_soon(ask_deferred, 0)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(ask_deferred, 1)
            await trio.testing.wait_all_tasks_blocked()
            assert len(actor.deferred) == 2 and answers == {}
            assert await actor.ask(("echo", "meanwhile"), timeout=1) == "meanwhile"
            await trio.sleep(4)
            actor.deferred[0].set("later")
            actor.deferred[1].fail(Conflict("device said no"))
            await trio.testing.wait_all_tasks_blocked()
            assert answers[0] == ("later", 4)
            assert isinstance(answers[1][0], Conflict) and answers[1][1] == 4
            nursery.cancel_scope.cancel()


async def test_deferred_reply_of_a_tell_is_a_harmless_fresh_slot(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery).start(Probe())
            actor.tell(("defer",))
            assert await actor.ask(("echo", 1), timeout=1) == 1
            slot = actor.deferred[0]
            assert not slot.done
            slot.set("nobody waits")
            assert slot.done and await slot.wait() == "nobody waits"
            nursery.cancel_scope.cancel()


async def test_reply_is_one_shot():
    with trio.fail_after(1):
        reply = Reply()
        reply.set(1)
        reply.set(2)
        reply.fail(Conflict("late"))
        assert await reply.wait() == 1
        failed = Reply()
        failed.fail(Conflict("first"))
        failed.set(3)
        with pytest.raises(Conflict, match="first"):
            await failed.wait()


async def test_statistics_snapshot(autojump_clock):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery, backoff_initial=1.0).start(Probe("stats"))
            assert actor.statistics() == ActorStatistics("stats", 0, 4, 0, 0)
            gate = trio.Event()
            actor.tell(("wait", gate))
            await trio.testing.wait_all_tasks_blocked()
            actor.tell(("echo", 1))
            actor.tell(("crash",))
            actor.tell(("echo", 2))
            snapshot = actor.statistics()
            assert snapshot == ActorStatistics("stats", 3, 4, 0, 0)
            gate.set()
            await trio.sleep(5)
            assert actor.statistics() == ActorStatistics("stats", 0, 4, 4, 1)
            assert snapshot.mailbox_depth == 3  # a snapshot, not a live view
            with pytest.raises(dataclasses.FrozenInstanceError):
                snapshot.handled = 99
            nursery.cancel_scope.cancel()


async def test_on_deadline_fires_at_the_exact_virtual_time(autojump_clock):
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            actor = Probe()
            actor.deadlines = [5.0, 12.25]
            await Supervisor(nursery).start(actor)
            await trio.sleep(2)
            assert await actor.ask(("echo", "early"), timeout=1) == "early"
            assert actor.fired == []  # a message before the deadline does not fire it
            await trio.sleep(20)
            assert actor.fired == [5.0, 12.25]
            nursery.cancel_scope.cancel()


async def test_deadline_already_past_fires_at_once_and_waits_for_the_current_message(autojump_clock):
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            actor = await Supervisor(nursery).start(Probe())
            actor.tell(("sleep", 10))
            await trio.testing.wait_all_tasks_blocked()
            actor.deadlines = [3.0]
            await trio.sleep(20)
            assert actor.fired == [10.0]  # one message at a time: the deadline waits for the sleep
            nursery.cancel_scope.cancel()
