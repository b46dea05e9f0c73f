"""The Actor: its mailbox, its loop, ask/tell and the Reply, parking and storage outages.

    Actor        subclass it; implement ``on_start`` (rebuild from storage), ``receive`` (one message
                 at a time) and optionally ``next_deadline``/``on_deadline`` and ``should_stop``.
    ask / tell   ``await actor.ask(msg, timeout)`` waits for the reply; ``actor.tell(msg)`` does not,
                 and a full mailbox raises ``MailboxFull`` rather than dropping the message.

The Supervisor and the Registry are in actors/_runtime/supervisor.py; what users of the runtime
import is in actors/runtime.py.

Parking (issue 22: 15,000 online devices, each actor idle almost all the time). An actor whose mailbox
stayed empty for ``park_after`` seconds, with no background work in flight, parks: its task ends, the
Actor object and its in-memory state stay (in the Registry too). A ``tell``/``ask``/``post`` wakes it:
the Supervisor starts a task for it again, without ``on_start`` (which runs at the start and after
every crash, never after a park). The deadline an actor parks with is the ``next_deadline()`` its
loop read before it began to wait, as before parking existed; a finite one puts the actor in the
Supervisor's timer heap (one task for all, actors/_runtime/parktimer.py), which wakes it then and
runs ``on_deadline`` first. An actor keeps one entry, its earliest: when that falls due the timer
compares it with the deadline the actor parked with last (a device's heartbeats move it on) and
wakes it only if that has come.
One task at most per actor, handling its messages one at a time in order: the loop parks with no
await between finding the mailbox empty and parking, so a message arrives either before (and is
handled) or after (and wakes it). ``should_stop`` is checked as before, whenever the mailbox is empty.
Background work (``actor.tasks.start_soon``, actors/_runtime/background.py) runs in the Supervisor's nursery,
each task in its own cancel scope: its crash is the actor's crash, it is cancelled (and waited for)
when the actor crashes or stops, and while any of it runs the actor does not park.

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
from typing import TYPE_CHECKING, Any

import trio
from trio import TaskStatus

from actors._runtime.background import ActorTasks
from actors._runtime.mailbox import Mailbox
from actors.errors import ActorCrashed, ActorStopped, AskError, AskTimeout, MailboxFull
from device_client.shared.backoff import Backoff
from storage.db import DatabaseUnavailable

if TYPE_CHECKING:
    from actors._runtime.supervisor import Supervisor

log = logging.getLogger("fleethub.actors")


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
    # Idle this long (no message, no deadline, no background work), the actor parks: its task ends and
    # the next message (or its deadline, through the Supervisor's timer) starts one again. Short
    # against a device's heartbeat interval (30 s), long against a burst of messages.
    park_after = 1.0
    # While storage is unreachable, deadline work waits this long before trying again (doubling).
    storage_backoff_initial = 0.1
    storage_backoff_max = 5.0
    # Class defaults: an actor gets its own values only once it has seen an outage (15,000 devices).
    storage_waits = 0
    _storage_backoff: Backoff | None = None  # the one Backoff (device_client/shared/backoff.py), made at the first outage
    _storage_until = -math.inf  # deadlines wait until then: storage was unreachable
    # Class defaults too, for actors that crashed (few): set on the actor at its first crash.
    _crash_times: deque[float] | None = None  # when it crashed, within the supervisor's window (escalation)
    _restart_backoff: Backoff | None = None  # the supervisor's backoff for this actor, made at its first crash

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self._mailbox = Mailbox(self.mailbox_size)  # of (message, Reply or None)
        self.handled = 0
        self.restarts = 0
        self.stopped = False
        self._current_reply: Reply | None = None
        self._on_stop: Callable[[Actor], None] | None = None
        self._supervisor: Supervisor | None = None
        self._awake = False  # a task runs this actor, or is about to (from its start on)
        self._needs_start = True  # on_start must run first: the first start, and after every crash
        # While parked with a deadline: [earliest wake, seq, self, the deadline it parked with last] in
        # the supervisor's timer heap (actors/_runtime/parktimer.py).
        self._timer_entry: list | None = None
        self.tasks = ActorTasks(self)

    # -- what subclasses implement -----------------------------------------------------------
    async def on_start(self) -> None:
        """Rebuild state (from storage) before the first message; runs again after every restart
        (not after a park: a parked actor keeps its state)."""

    async def receive(self, msg: Any) -> Any:
        """Handle one message; the return value answers an ``ask``."""
        raise TypeError(f"{type(self).__name__} does not handle {type(msg).__name__}")

    def next_deadline(self) -> float:
        """The trio time at which ``on_deadline`` must run (``math.inf`` for never). Read whenever the
        actor is about to wait; a parked actor is woken at the value read before it parked."""
        return math.inf

    async def on_deadline(self) -> None:
        """Called when ``next_deadline`` passes with no message."""

    def should_stop(self) -> bool:
        """Checked when the mailbox is empty: True lets an idle actor end (passivation)."""
        return False

    def on_given_up(self) -> None:
        """The supervisor stopped this actor past its crash budget (actors/_runtime/supervisor.py): undo what
        would outlive it. Synchronous, and it must not raise."""

    # -- asking and telling --------------------------------------------------------------------
    def tell(self, msg: Any) -> None:
        self._enqueue(msg, None)

    def _enqueue(self, msg: Any, reply: Reply | None) -> None:
        """Into the mailbox without waiting (MailboxFull, ActorStopped), waking a parked actor."""
        try:
            self._mailbox.send_nowait((msg, reply))
        except trio.WouldBlock:
            raise MailboxFull(f"mailbox of {self.key} is full") from None
        except trio.ClosedResourceError:
            raise ActorStopped(f"actor {self.key} has stopped") from None
        if not self._awake:
            self._wake()

    async def post(self, msg: Any) -> None:
        """Like ``tell`` but waits for mailbox space: for the actor's own background tasks, whose
        outcome must not be dropped (the actor's loop never waits on them, so this cannot deadlock)."""
        try:
            await self._mailbox.send((msg, None))
        except trio.ClosedResourceError:
            raise ActorStopped(f"actor {self.key} has stopped") from None
        if not self._awake:
            self._wake()

    async def ask(self, msg: Any, timeout: float = 10.0) -> Any:
        reply = Reply()
        self._enqueue(msg, reply)
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

    @property
    def parked(self) -> bool:
        """Started, not stopped, and no task: waiting for a message or for the timer."""
        return not self._awake and not self.stopped and self._supervisor is not None

    # -- the task --------------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
                  woken_for: float | None = None) -> None:
        """One awake period: ``on_start`` if the actor (re)starts, then messages and deadlines until
        it parks, stops or crashes. The Supervisor runs it, again after every crash and wake
        (``woken_for``: the deadline the timer woke it for)."""
        tasks = self.tasks
        error: BaseException | None = None
        try:
            if self._needs_start:
                await self.on_start()  # not under the loop's scope: its error reaches the starter as itself
                self._needs_start = False
            task_status.started(self)
            if tasks._crashed is None:
                with trio.CancelScope() as tasks._loop:
                    await self._loop(woken_for)
        except BaseException as exc:
            error = exc
        tasks._loop = tasks._wait = None
        if error is None and tasks._crashed is None and not self.stopped:
            return  # parked (with nothing in the background, or it would not have parked): no await here
        # A crash, a stop or a cancellation ends the background work with the actor, as a nursery would.
        await tasks._end()
        crashed, tasks._crashed = tasks._crashed, None
        if crashed:
            raise BaseExceptionGroup(f"background work of actor {self.key} crashed",
                                     [*crashed, *([error] if error is not None else [])])
        if error is not None:
            raise error

    async def _loop(self, due: float | None = None) -> None:
        """``due``: the deadline the timer woke the actor for (it has come); else read as it waits."""
        mailbox, tasks = self._mailbox, self.tasks
        idle_since = trio.current_time()
        while True:
            if not len(mailbox) and self.should_stop():
                self._stop()
                return
            if due is None:
                due = max(self.next_deadline(), self._storage_until)
            # (Park only from an empty mailbox: a wait that ends at once would never take what is queued.)
            park_at = idle_since + self.park_after if not len(mailbox) and not tasks._scopes else math.inf
            envelope = None
            with trio.move_on_at(min(due, park_at)) as tasks._wait:
                envelope = await mailbox.receive()
            tasks._wait = None
            if envelope is None:
                now = trio.current_time()
                if now < due:
                    # Idle for park_after. A message may have come in since the wait ended (it is then
                    # handled first); otherwise park, with no await between this check and the park.
                    # The deadline stays the one read before the wait (a deadline such as "now + 0.25 s"
                    # would otherwise move on at every reading): the timer wakes the actor then.
                    if not len(mailbox) and not tasks._scopes:
                        if self.should_stop():
                            self._stop()
                            return
                        self._park(due)
                        return
                    due = None
                    continue
                due = None
                try:
                    await self.on_deadline()
                except DatabaseUnavailable:
                    self.storage_unavailable("a deadline")
                else:
                    if self._storage_until != -math.inf:  # storage answers again
                        self._storage_until = -math.inf
                        if self._storage_backoff is not None:
                            self._storage_backoff.reset()
                idle_since = trio.current_time()
                continue
            due = None
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
                idle_since = trio.current_time()

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

    # -- parking, waking, stopping -------------------------------------------------------------------
    def _wake(self) -> None:
        """A message for a parked actor: start its task again (no on_start: its state is in memory)."""
        if not self._awake and not self.stopped and self._supervisor is not None:
            try:
                self._supervisor._wake(self)
            except RuntimeError:  # the supervisor's nursery has closed: the process is ending
                raise ActorStopped(f"actor {self.key} has stopped: its supervisor is gone") from None

    def _park(self, due: float) -> None:
        # Called by the loop with the mailbox empty and nothing in the background; the task ends next.
        self._awake = False
        supervisor = self._supervisor
        assert supervisor is not None  # only the loop parks, and a supervisor runs it
        supervisor.parked += 1
        if due < math.inf:
            supervisor.timer.schedule(self, due)
        elif self._timer_entry is not None:
            self._timer_entry[3] = math.inf  # its older entry finds nothing to wake it for

    def _stop(self) -> None:
        # No await between the emptiness check and here: nothing can slip into the mailbox.
        self.stopped = True
        self._mailbox.close()
        self.tasks._cancel_all()  # its task waits for them before it ends
        entry, self._timer_entry = self._timer_entry, None
        if entry is not None:
            entry[2] = None  # the timer lets go of a stopped actor at once
        if self._on_stop is not None:
            self._on_stop(self)
