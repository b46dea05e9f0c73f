"""Actors: one trio task, one bounded mailbox, one machine (DESIGN.md section 4).

    Actor        subclass it; implement ``on_start`` (rebuild from storage), ``receive`` (one message
                 at a time) and optionally ``next_deadline``/``on_deadline`` and ``should_stop``.
    ask / tell   ``await actor.ask(msg, timeout)`` waits for the reply; ``actor.tell(msg)`` does not,
                 and a full mailbox raises ``MailboxFull`` rather than dropping the message.
    Supervisor   restarts a crashed actor with backoff; more than ``max_restarts`` crashes inside
                 ``window`` seconds escalates: ``Escalation`` propagates and the process exits non-zero.
    Registry     gets or starts the actor for a key, and forgets it when it stops.

A ``receive`` that raises an ``AskError`` (actors/errors.py) answers the asker with that error and the
actor goes on (the error is the caller's business: offline device, busy test, ...). Any other exception is a crash:
the asker gets ``ActorCrashed`` and the supervisor restarts the actor, which rebuilds its state from
storage. The mailbox survives a restart, so messages queued behind the crash are still handled.

Storage being unreachable (``DatabaseUnavailable``: PostgreSQL down or restarting) is an expected
condition, not a crash, so a database restart cannot escalate into stopping the process:

- from ``receive``: the asker gets the error (the app answers 503 database_unavailable) and the actor
  goes on with its state;
- from ``on_deadline``: the deadline is tried again after a backoff (0.1 s doubling to 5 s, back to
  0.1 s once a deadline succeeds); meanwhile the mailbox keeps moving;
- from ``on_start`` after a restart (or a background task): the supervisor starts the actor again
  after that backoff, without counting a crash. A first start's error still reaches its caller.

An actor whose work must survive the outage keeps it in memory and retries it from ``on_deadline``
(RolloutActor and TunnelActor keep the storage effects they could not carry out). Each wait is
counted (``storage_waits``, on /metrics).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import trio

from actors.errors import ActorCrashed, ActorError, ActorStopped, AskError, AskTimeout, MailboxFull
from actors.mailbox import Mailbox
from device_client.backoff import Backoff
from storage.db import DatabaseUnavailable

__all__ = ["Actor", "ActorCrashed", "ActorError", "ActorStopped", "AskTimeout", "Escalation", "MailboxFull",
           "Registry", "Reply", "Supervisor"]

log = logging.getLogger("fleethub.actors")


class Escalation(Exception):
    """An actor crashed more often than its supervisor allows: the process must stop."""


def is_storage_outage(exc: BaseException) -> bool:
    """``DatabaseUnavailable``, alone or as every leaf of an exception group (an actor's nursery)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_storage_outage(e) for e in exc.exceptions)
    return isinstance(exc, DatabaseUnavailable)


class Reply:
    """A one-shot reply slot: the asker waits on it, the actor (or a task it spawned) fills it."""

    __slots__ = ("_event", "_value", "_error")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def set(self, value: Any) -> None:
        if not self._event.is_set():
            self._value = value
            self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._event.is_set():
            self._error = error
            self._event.set()

    async def wait(self) -> Any:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


@dataclass(frozen=True)
class ActorStatistics:
    key: Hashable
    mailbox_depth: int
    mailbox_size: int
    handled: int
    restarts: int


class Actor:
    """Base class of DeviceActor, RolloutActor, TunnelActor."""

    mailbox_size = 64
    # While storage is unreachable, deadline work waits this long before trying again (doubling).
    storage_backoff_initial = 0.1
    storage_backoff_max = 5.0
    # Class defaults: an actor gets its own values only once it has seen an outage (15,000 devices).
    storage_waits = 0
    _storage_backoff: Backoff | None = None  # the one Backoff (device_client/backoff.py), made at the first outage
    _storage_until = -math.inf  # deadlines wait until then: storage was unreachable

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self._mailbox = Mailbox(self.mailbox_size)  # of (message, Reply or None)
        self.handled = 0
        self.restarts = 0
        self.stopped = False
        self._current_reply: Reply | None = None
        self._on_stop: Callable[[Actor], None] | None = None
        self._supervisor: Supervisor | None = None
        self.tasks: trio.Nursery | None = None

    # -- what subclasses implement -----------------------------------------------------------
    async def on_start(self) -> None:
        """Rebuild state (from storage) before the first message; runs again after every restart."""

    async def receive(self, msg: Any) -> Any:
        """Handle one message; the return value answers an ``ask``."""
        raise TypeError(f"{type(self).__name__} does not handle {type(msg).__name__}")

    def next_deadline(self) -> float:
        """The trio time at which ``on_deadline`` must run (``math.inf`` for never)."""
        return math.inf

    async def on_deadline(self) -> None:
        """Called when ``next_deadline`` passes with no message."""

    def should_stop(self) -> bool:
        """Checked when the mailbox is empty: True lets an idle actor end (passivation)."""
        return False

    # -- asking and telling --------------------------------------------------------------------
    def tell(self, msg: Any) -> None:
        try:
            self._mailbox.send_nowait((msg, None))
        except trio.WouldBlock:
            raise MailboxFull(f"mailbox of {self.key} is full") from None
        except trio.ClosedResourceError:
            raise ActorStopped(f"actor {self.key} has stopped") from None

    async def post(self, msg: Any) -> None:
        """Like ``tell`` but waits for mailbox space: for the actor's own background tasks, whose
        outcome must not be dropped (the actor's loop never waits on them, so this cannot deadlock)."""
        try:
            await self._mailbox.send((msg, None))
        except trio.ClosedResourceError:
            raise ActorStopped(f"actor {self.key} has stopped") from None

    async def ask(self, msg: Any, timeout: float = 10.0) -> Any:
        reply = Reply()
        try:
            self._mailbox.send_nowait((msg, reply))
        except trio.WouldBlock:
            raise MailboxFull(f"mailbox of {self.key} is full") from None
        except trio.ClosedResourceError:
            raise ActorStopped(f"actor {self.key} has stopped") from None
        with trio.move_on_after(timeout):
            return await reply.wait()
        raise AskTimeout(f"actor {self.key} did not answer within {timeout}s")

    def defer_reply(self) -> Reply:
        """Take over the current ask's reply, to fill it later (after a device answers, say).

        ``receive`` returns at once and the actor goes on with its mailbox; whoever holds the
        Reply must eventually ``set`` or ``fail`` it.
        """
        reply, self._current_reply = self._current_reply or Reply(), None
        return reply

    def statistics(self) -> ActorStatistics:
        return ActorStatistics(self.key, len(self._mailbox), self._mailbox.size, self.handled, self.restarts)

    # -- the loop ------------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # Work an actor starts in the background (a device command awaiting its reply) lives in
        # this nursery: it ends with the actor and its crash is the actor's crash.
        await self.on_start()  # outside the nursery: its error reaches the starter as itself
        async with trio.open_nursery() as self.tasks:
            task_status.started(self)
            await self._loop()
            self.tasks.cancel_scope.cancel()

    async def _loop(self) -> None:
        while True:
            if not len(self._mailbox) and self.should_stop():
                self._stop()
                return
            envelope = None
            with trio.move_on_at(max(self.next_deadline(), self._storage_until)):
                envelope = await self._mailbox.receive()
            if envelope is None:
                try:
                    await self.on_deadline()
                except DatabaseUnavailable:
                    self.storage_unavailable("a deadline")
                else:
                    if self._storage_until != -math.inf:  # storage answers again
                        self._storage_until = -math.inf
                        if self._storage_backoff is not None:
                            self._storage_backoff.reset()
                continue
            msg, reply = envelope
            self._current_reply = reply
            try:
                result = await self.receive(msg)
            except DatabaseUnavailable as exc:
                # Not a crash: the asker hears it (503) and the actor keeps its state and goes on.
                if reply is not None:
                    reply.fail(exc)
                self.storage_unavailable(type(msg).__name__)
            except AskError as exc:
                if reply is not None:
                    reply.fail(exc)
            except Exception as exc:
                if reply is not None:
                    reply.fail(ActorCrashed(f"actor {self.key} crashed: {type(exc).__name__}"))
                raise
            else:
                if reply is not None and self._current_reply is reply:
                    reply.set(result)
            finally:
                self._current_reply = None
                self.handled += 1

    async def until_stored(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``await fn(*args)``, waiting out storage outages with this actor's backoff: for background
        work whose outcome must not be lost (a device's configuration result). ``fn`` must be safe
        to call again after a ``DatabaseUnavailable``. The actor stopping cancels the wait."""
        while True:
            try:
                return await fn(*args)
            except DatabaseUnavailable:
                self.storage_unavailable(getattr(fn, "__name__", "background work"))
                await trio.sleep_until(self._storage_until)

    def storage_unavailable(self, what: str) -> None:
        """Storage could not be reached: deadlines wait out a backoff; counted, logged once per outage."""
        now = trio.current_time()
        backoff = self._storage_backoff
        if backoff is None:
            backoff = self._storage_backoff = Backoff(self.storage_backoff_initial, self.storage_backoff_max,
                                                      jitter=False)
        if self._storage_until < now - self.storage_backoff_max:
            backoff.reset()  # a new outage: start gently again
        if backoff.attempt == 0:
            log.warning("actor %s: storage unreachable during %s; retrying with backoff", self.key, what)
        self._storage_until = now + backoff.next_delay()
        self.storage_waits += 1
        if self._supervisor is not None:
            self._supervisor.storage_waits_total += 1

    def _stop(self) -> None:
        # No await between the emptiness check and here: nothing can slip into the mailbox.
        self.stopped = True
        self._mailbox.close()
        if self._on_stop is not None:
            self._on_stop(self)


class _StartedFlag:
    """Passes ``started()`` on to the real task status and remembers that it happened. (One small
    object per start: a class defined per call cost 2.5 KiB per actor, measured with tracemalloc.)"""

    __slots__ = ("status", "started_once")

    def __init__(self, status: Any) -> None:
        self.status = status
        self.started_once = False

    def started(self, value: Any = None) -> None:
        # Let go of trio's task status once used: it pins the task tree of whoever started the
        # actor (a device's first connection) for as long as the actor lives (~23 KiB a device).
        status, self.status = self.status, None
        self.started_once = True
        status.started(value)


class Supervisor:
    """Runs actors in its nursery and restarts them when they crash."""

    def __init__(self, nursery: trio.Nursery, *, max_restarts: int = 5, window: float = 60.0,
                 backoff_initial: float = 0.05, backoff_max: float = 5.0) -> None:
        self.nursery = nursery
        self.max_restarts = max_restarts
        self.window = window
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.restarts_total = 0
        self.storage_waits_total = 0  # times an actor waited for storage instead of crashing

    async def start(self, actor: Actor) -> Actor:
        """Start ``actor``; returns once its ``on_start`` finished (errors there reach the caller)."""
        actor._supervisor = self
        return await self.nursery.start(self._keep_running, actor)

    async def _keep_running(self, actor: Actor, task_status=trio.TASK_STATUS_IGNORED) -> None:
        crashes: deque[float] | None = None  # made at the first crash: most actors never crash
        flag = _StartedFlag(task_status)
        del task_status  # only the flag holds it, and only until started() (see _StartedFlag)
        first = True
        backoff = Backoff(self.backoff_initial, self.backoff_max, jitter=False)
        while True:
            if not first:
                flag = _StartedFlag(trio.TASK_STATUS_IGNORED)
            try:
                await actor.run(task_status=flag)
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
                if first and not flag.started_once:
                    raise  # never came up: the caller of start() hears about it
                if is_storage_outage(exc):
                    # PostgreSQL is down (a restart's on_start, a background task): an outage, not
                    # a bug. Start again after the storage backoff; the mailbox waits meanwhile.
                    actor.storage_unavailable("a start")
                    await trio.sleep_until(actor._storage_until)
                    first = False
                    continue
                now = trio.current_time()
                if crashes is None:
                    crashes = deque()
                if crashes and crashes[-1] < now - self.window:
                    backoff.reset()  # stable for a whole window: start gently again
                crashes.append(now)
                while crashes and crashes[0] < now - self.window:
                    crashes.popleft()
                if len(crashes) > self.max_restarts:
                    log.critical("actor %s crashed %d times in %ss; escalating", actor.key,
                                 len(crashes), self.window)
                    raise Escalation(f"actor {actor.key} exceeded its restart limit") from exc
                delay = backoff.next_delay()
                log.exception("actor %s crashed; restarting in %.2fs", actor.key, delay)
                actor.restarts += 1
                self.restarts_total += 1
                await trio.sleep(delay)
                first = False


class Registry:
    """The live actors by key; ``get`` starts the missing one exactly once, even under concurrency."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self._actors: dict[Hashable, Actor] = {}
        self._starting: dict[Hashable, trio.Event] = {}

    def lookup(self, key: Hashable) -> Actor | None:
        return self._actors.get(key)

    async def get(self, key: Hashable, factory: Callable[[], Actor]) -> Actor:
        while True:
            actor = self._actors.get(key)
            if actor is not None and not actor.stopped:
                return actor
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
        It walks every actor (15,000 devices: a few ms); /metrics is scraped every few seconds."""
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
                "storage_waits": self.supervisor.storage_waits_total}
