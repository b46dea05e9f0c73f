"""A coroutine run at once, in the callback that starts it, and handed to a task only if it waits.

aiortc's per-packet work is written as coroutines (``_handle_data``, ``_send_sack``, ``_send_data``)
that, on the tunnel's path, never wait: a send is a ``sendto`` or a record queued for the loop turn's
``sendmsg`` (send.py). Run as a task, each costs a Task object and a loop turn before it starts.
``start`` steps the coroutine by hand instead; should it wait after all (a path not seen in a tunnel),
the rest runs as a task, from where it stopped, with the future it waits on handed to that task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def start(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
    """Run ``coro`` until it ends (None) or waits (the task that runs the rest). What it raises
    before it waits is raised here, to the caller, as a task would have held it."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_Rest(coro, waiting).run())


class _Rest:
    """The rest of a coroutine that was stepped by hand and waits: awaiting this resumes it where it
    stopped, with the future it was waiting on handed to the task that now runs it."""

    def __init__(self, coro: Any, waiting: Any) -> None:
        self.coro, self.waiting = coro, waiting

    async def run(self) -> Any:
        return await self

    def __await__(self) -> Any:
        coro, value = self.coro, self.waiting
        while True:
            try:
                sent = yield value
            except BaseException as exc:  # noqa: BLE001 — a cancellation or error goes into the coroutine
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                continue
            try:
                value = coro.send(sent)
            except StopIteration as stop:
                return stop.value
