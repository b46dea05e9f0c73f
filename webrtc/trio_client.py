"""The CLI's side of a tunnel (client.py, asyncio) run from a trio program: tests and bench/tunnel.py.

``fleethub tunnel`` runs client.py on its own asyncio loop with no trio in the process. A trio program
that wants the same client runs it on loop.py's shared asyncio thread, as the agent runs its peers.
"""

from __future__ import annotations

from typing import Any

import trio

from .client import Ready, run_tunnel
from .loop import shared, to_trio


async def run_tunnel_in_trio(*args: Any, task_status: trio.TaskStatus[Ready] = trio.TASK_STATUS_IGNORED,
                             **kw: Any) -> str:
    """``client.run_tunnel(*args, **kw)`` on the shared asyncio thread; ``nursery.start`` gets its Ready
    once the tunnel is usable. Cancelling the caller cancels the tunnel, which closes its session."""
    ready = trio.Event()
    got: list[Ready] = []
    ended: list[str] = []

    def on_ready(r: Ready) -> None:
        got.append(r)
        ready.set()

    async with trio.open_nursery() as nursery:
        async def run() -> None:
            try:
                # to_trio: on_ready runs in this thread, before the run's own end (callbacks keep order)
                ended.append(await shared().run(run_tunnel(*args, on_ready=to_trio(on_ready), **kw)))
            finally:
                ready.set()

        nursery.start_soon(run)
        await ready.wait()
        if got:
            task_status.started(got[0])
    return ended[0]
