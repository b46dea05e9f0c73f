"""Supervision: the Supervisor that runs actors (actors/_runtime/actor.py) and restarts them, and the
Registry that finds or starts the actor for a key.

    Supervisor   runs actors in its nursery, one task per awake actor; restarts a crashed one after a
                 backoff; past ``max_restarts`` crashes in ``window`` seconds gives that actor up (it
                 stops, its askers hear ``ActorStopped``, the Registry forgets it, so the next message
                 for its key starts a fresh one from storage); wakes parked actors (a message, or its
                 timer, actors/_runtime/parktimer.py). One actor's crashes cost that actor, never the process:
                 one device sending what crashes its actor must not take the hub's other devices down.
    Registry     the actors by key, running or parked; ``get`` starts a missing one exactly once.

How an actor runs, parks and waits out a storage outage is told in actors/_runtime/actor.py.
"""

from __future__ import annotations

import contextvars
import logging
from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import trio
from trio import TaskStatus

from actors._runtime.parktimer import ParkTimer
from actors.errors import ActorStopped
from device_client.shared.backoff import Backoff
from storage.db import DatabaseUnavailable

if TYPE_CHECKING:
    from actors._runtime.actor import Actor

log = logging.getLogger("fleethub.actors")
A = TypeVar("A", bound="Actor")


class Escalation(Exception):
    """The supervisor itself cannot go on (its nursery failed): the process must stop. An actor's
    crashes never raise it: past its budget the actor is given up (``Supervisor._give_up``)."""


def is_storage_outage(exc: BaseException) -> bool:
    """``DatabaseUnavailable``, alone or as every leaf of an exception group (an actor's nursery)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_storage_outage(e) for e in exc.exceptions)
    return isinstance(exc, DatabaseUnavailable)


class _StartedFlag:
    """Passes ``started()`` on to the real task status and remembers that it happened. (One small
    object per start: a class defined per call cost 2.5 KiB per actor, measured with tracemalloc.)"""

    __slots__ = ("status", "started_once")

    def __init__(self, status: Any) -> None:
        self.status = status
        self.started_once = False

    def started(self, value: Any = None) -> None:
        # Let go of trio's task status once used: it pins the task tree of whoever started the
        # actor (a device's first connection) for as long as the actor's first task lives.
        status, self.status = self.status, None
        self.started_once = True
        status.started(value)


class Supervisor:
    """Runs actors in its nursery, restarts them when they crash, and wakes parked ones."""

    def __init__(self, nursery: trio.Nursery, *, max_restarts: int = 5, window: float = 60.0,
                 backoff_initial: float = 0.05, backoff_max: float = 5.0) -> None:
        self.nursery = nursery
        self.max_restarts = max_restarts
        self.window = window
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.restarts_total = 0
        self.given_up_total = 0  # actors stopped after exceeding their crash budget
        self.storage_waits_total = 0  # times an actor waited for storage instead of crashing
        self.running = 0  # actor tasks now (each awake actor has one)
        self.parked = 0  # actors parked now (no task; a message or the timer wakes them)
        self.wakes_total = 0  # tasks started for parked actors
        # Tasks it starts for actors (wakes, background work) begin with the context it was made in,
        # not with the waker's: a request that wakes an actor must not lend it its context variables
        # (storage crossings are counted per request through one, storage/db.py).
        self._context = contextvars.copy_context()
        # The parked actors' deadlines, woken by one task for all (actors/_runtime/parktimer.py).
        self.timer = ParkTimer(self._spawn, self._wake)

    def statistics(self) -> dict[str, int]:
        """Actor tasks now, parked actors now, wakes so far, entries in the timer heap."""
        return {"running": self.running, "parked": self.parked, "wakes": self.wakes_total,
                "timers": len(self.timer)}

    async def start(self, actor: Actor) -> Actor:
        """Start ``actor``; returns once its ``on_start`` finished (errors there reach the caller)."""
        actor._supervisor = self
        actor._awake = True
        return await self.nursery.start(self._keep_running, actor)

    def _spawn(self, async_fn: Callable[..., Any], *args: Any, name: Any = None) -> None:
        self._context.run(self.nursery.start_soon, async_fn, *args, name=name)

    def _wake(self, actor: Actor, woken_for: float | None = None) -> None:
        # raises RuntimeError once the nursery has closed
        self._spawn(self._keep_running, actor, trio.TASK_STATUS_IGNORED, woken_for)
        actor._awake = True
        self.parked -= 1
        self.wakes_total += 1

    async def _keep_running(self, actor: Actor, task_status: TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
                            woken_for: float | None = None) -> None:
        # One task per awake period: from a start or a wake until the actor parks or stops. Restarts
        # after a crash happen in it; what counts towards escalation is kept on the actor, so that an
        # actor which parks between crashes still escalates.
        first = task_status is not trio.TASK_STATUS_IGNORED
        status: Any = _StartedFlag(task_status) if first else trio.TASK_STATUS_IGNORED
        del task_status  # only the flag holds it, and only until started() (see _StartedFlag)
        self.running += 1
        try:
            while True:
                try:
                    await actor.run(task_status=status, woken_for=woken_for)
                    return
                except BaseException as exc:
                    if isinstance(exc, BaseExceptionGroup):
                        # A crash at the moment the supervisor is being cancelled arrives grouped with
                        # Cancelled: log the crash, let the cancellation go on.
                        cancelled, crash = exc.split(trio.Cancelled)
                        if cancelled is not None:
                            if crash is not None:
                                log.error("actor %s crashed during shutdown", actor.key, exc_info=crash)
                            raise cancelled from None
                    if not isinstance(exc, Exception):
                        raise  # Cancelled, KeyboardInterrupt: not a crash
                    if first and not status.started_once:
                        raise  # never came up: the caller of start() hears about it
                    actor._needs_start = True  # whatever it held may be inconsistent: rebuild from storage
                    woken_for = None
                    if is_storage_outage(exc):
                        # PostgreSQL is down (a restart's on_start, a background task): an outage, not
                        # a bug. Start again after the storage backoff; the mailbox waits meanwhile.
                        actor.storage_unavailable("a start")
                        await trio.sleep_until(actor._storage_until)
                        first, status = False, trio.TASK_STATUS_IGNORED
                        continue
                    if not await self._count_crash(actor, exc):
                        self._give_up(actor)
                        return
                    first, status = False, trio.TASK_STATUS_IGNORED
        finally:
            self.running -= 1

    async def _count_crash(self, actor: Actor, exc: Exception) -> bool:
        """False past ``max_restarts`` crashes in ``window`` (the actor is given up); else wait out the
        backoff and say True (restart it)."""
        now = trio.current_time()
        crashes, backoff = actor._crash_times, actor._restart_backoff
        if crashes is None or backoff is None:  # its first crash: both are made together
            crashes = actor._crash_times = deque()
            backoff = actor._restart_backoff = Backoff(self.backoff_initial, self.backoff_max, jitter=False)
        if crashes and crashes[-1] < now - self.window:
            backoff.reset()  # stable for a whole window: start gently again
        crashes.append(now)
        while crashes and crashes[0] < now - self.window:
            crashes.popleft()
        if len(crashes) > self.max_restarts:
            log.critical("actor %s crashed %d times in %ss: given up (the next message for it starts a "
                         "fresh one)", actor.key, len(crashes), self.window, exc_info=exc)
            return False
        delay = backoff.next_delay()
        log.error("actor %s crashed; restarting in %.2fs", actor.key, delay, exc_info=exc)
        actor.restarts += 1
        self.restarts_total += 1
        await trio.sleep(delay)
        return True

    def _give_up(self, actor: Actor) -> None:
        """Stop an actor past its crash budget: what waits in its mailbox is answered (an asker hears
        ``ActorStopped``, nothing waits for a reply that will not come), the Registry forgets it, and
        ``on_given_up`` lets it undo what outlives it (a DeviceActor closes its device's link)."""
        self.given_up_total += 1
        for _msg, reply in actor._mailbox.take_all():
            if reply is not None:
                reply.fail(ActorStopped(f"actor {actor.key} was given up after repeated crashes"))
        actor._stop()
        try:
            actor.on_given_up()
        except Exception:  # noqa: BLE001 — its own clean-up failing must not undo the containment
            log.exception("actor %s: on_given_up failed", actor.key)



class Registry:
    """The actors by key (running or parked); ``get`` starts the missing one exactly once, even under
    concurrency."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self._actors: dict[Hashable, Actor] = {}
        self._starting: dict[Hashable, trio.Event] = {}

    def lookup(self, key: Hashable) -> Actor | None:
        return self._actors.get(key)

    def starting(self, key: Hashable) -> bool:
        """Whether ``get`` is starting this key's actor now (its ``on_start`` may take storage round
        trips; ``lookup`` says None until it has finished)."""
        return key in self._starting

    async def get(self, key: Hashable, factory: Callable[[], A]) -> A:
        while True:
            known = self._actors.get(key)
            if known is not None and not known.stopped:
                return cast(A, known)  # a key's actor is of the kind its factory makes
            starting = self._starting.get(key)
            if starting is None:
                break
            await starting.wait()
        event = self._starting[key] = trio.Event()
        try:
            actor = factory()
            actor._on_stop = self._forget
            await self.supervisor.start(actor)
            self._actors[key] = actor
            return actor
        finally:
            del self._starting[key]
            event.set()

    def _forget(self, actor: Actor) -> None:
        if self._actors.get(actor.key) is actor:
            del self._actors[actor.key]

    def __len__(self) -> int:
        return len(self._actors)

    def actors(self) -> list[Actor]:
        return list(self._actors.values())

    def statistics(self) -> dict[str, Any]:
        """A snapshot for /metrics: actor counts by kind, mailbox depth, handled, restarts.
        It walks every actor (15,000 devices: a few ms); /metrics is scraped every few seconds.
        How many of them are parked: ``supervisor.statistics()``."""
        by_kind: dict[str, int] = {}
        depth_max = handled = 0
        for actor in self._actors.values():
            kind = type(actor).__name__
            by_kind[kind] = by_kind.get(kind, 0) + 1
            s = actor.statistics()
            depth_max = max(depth_max, s.mailbox_depth)
            handled += s.handled
        return {"actors": len(self._actors), "by_kind": by_kind, "mailbox_depth_max": depth_max,
                "handled": handled, "restarts": self.supervisor.restarts_total,
                "given_up": self.supervisor.given_up_total,
                "storage_waits": self.supervisor.storage_waits_total}
