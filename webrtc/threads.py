"""A blocking call awaited on asyncio, in a daemon thread of its own (the ``fleethub tunnel`` CLI).

Not ``asyncio.to_thread``: its executor's threads are joined when ``asyncio.run`` ends, so a request
still out to a hub that does not answer would hold ssh's ProxyCommand open for up to its timeout after
ssh hung up. A daemon thread is left behind when the process exits, and a cancelled caller stops
waiting at once. The CLI runs a handful of these in its life (its requests to the hub, aiortc's
import): a thread each costs less than keeping a pool.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def in_daemon_thread(fn: Callable[[], T], *, name: str) -> T:
    """``fn()`` in a new daemon thread; its result or its exception here. A cancelled caller does not
    wait for it (``fn`` runs on to its end, unobserved)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # the caller was cancelled
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:  # noqa: BLE001 — handed to the caller as it is
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for this any more

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future
