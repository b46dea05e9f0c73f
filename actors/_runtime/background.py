"""An actor's background work, run without a nursery of its own (actors/_runtime/actor.py's parking).

    ActorTasks   ``actor.tasks.start_soon(fn, *args)``: ``fn`` runs in the Supervisor's nursery, in a
                 cancel scope of its own, and counts as the actor's: while any runs the actor does not
                 park; its crash is the actor's crash; an actor that crashes or stops cancels it and
                 waits for it to end.

Kept apart from actors/_runtime/actor.py, which holds the Actor: this is the piece that
stands in for the nursery each actor had before parking (one per actor, about 2 KiB even when idle).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from actors._runtime.actor import Actor

log = logging.getLogger("fleethub.actors")


class ActorTasks:
    """An actor's background work (a device command awaiting its reply, a delivery job).

    Each task runs in the Supervisor's nursery inside a cancel scope of its own, so the actor's own
    task can end (park) and start again without a nursery per wake. What trio's nursery did for the
    actor is kept: a crash in the background is the actor's crash (its loop is interrupted and the
    Supervisor restarts it), and the work is cancelled, and waited for, when the actor crashes or stops.
    """

    # Slots, not attributes of the actor: attributes set on an instance after __init__ cost a first
    # version of parking about 0.9 KiB per actor (a dict per instance, by its size), and past 30
    # attributes CPython always gives an instance a dict of its own; a DeviceActor has 24.
    __slots__ = ("_actor", "_scopes", "_crashed", "_gone", "_loop", "_wait")

    def __init__(self, actor: Actor) -> None:
        self._actor = actor
        self._scopes: set[trio.CancelScope] | None = None  # made at the first task: most actors never have one
        self._crashed: list[BaseException] | None = None  # work that crashed; the actor's task raises it
        self._gone: trio.Event | None = None  # set when the last task ended (the actor's task waits for it)
        self._loop: trio.CancelScope | None = None  # around the actor's loop: a crash here interrupts it
        self._wait: trio.CancelScope | None = None  # the loop's idle wait: moved when the last task ends

    @property
    def child_tasks(self) -> frozenset[trio.CancelScope]:
        """The work in flight (one entry per task, from ``start_soon`` until it ends), as trio's."""
        return frozenset(self._scopes) if self._scopes else frozenset()

    def __len__(self) -> int:
        return len(self._scopes) if self._scopes else 0

    def start_soon(self, async_fn: Callable[..., Any], *args: Any, name: Any = None) -> None:
        supervisor = self._actor._supervisor
        if supervisor is None:
            raise RuntimeError(f"actor {self._actor.key} has no supervisor to run background work")
        scope = trio.CancelScope()  # counted from now, like a nursery's child: cancelled even before it runs
        if self._scopes is None:
            self._scopes = set()
        self._scopes.add(scope)
        try:
            supervisor._spawn(self._run, scope, async_fn, args, name=name or async_fn)
        except BaseException:
            self._scopes.discard(scope)
            raise

    async def _run(self, scope: trio.CancelScope, async_fn: Callable[..., Any], args: tuple) -> None:
        actor = self._actor
        try:
            with scope:
                await async_fn(*args)
        except Exception as exc:
            if actor.stopped:
                log.error("actor %s: background work failed after the actor stopped", actor.key, exc_info=exc)
            else:
                self._crash(exc)
        finally:
            scopes = self._scopes
            assert scopes is not None  # start_soon made it before this task
            scopes.discard(scope)
            if not scopes:
                self._all_done()

    def _cancel_all(self) -> None:
        if self._scopes:
            for scope in self._scopes:
                scope.cancel()

    def _crash(self, exc: Exception) -> None:
        if self._crashed is None:
            self._crashed = []
        self._crashed.append(exc)
        self._cancel_all()
        if self._loop is not None:
            self._loop.cancel()  # the actor's loop stops where it is; its run() raises the crash
        elif not self._actor._awake:
            self._actor._wake()  # not expected (background work keeps its actor awake), but never lose a crash

    def _all_done(self) -> None:
        """The last task ended: whoever waits for that goes on, and an idle loop may park a
        ``park_after`` from now."""
        gone, self._gone = self._gone, None
        if gone is not None:
            gone.set()
        wait = self._wait
        if wait is not None:
            wait.deadline = min(wait.deadline, trio.current_time() + self._actor.park_after)

    async def _end(self) -> None:
        """Cancel what runs and wait until it ended (an actor's crash or stop)."""
        if self._scopes:
            self._cancel_all()
            gone = self._gone = trio.Event()
            await gone.wait()
