"""A loop a device part runs for as long as the device is up: started at every boot, stopped before
a reboot and when the agent stops (so a simulated reboot restarts it like a real one would).

It runs in the agent's own nursery (the one that supervises the workload), not in a link's: these
loops outlive link drops and decide themselves whether there is a link to send on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from .context import DeviceContext


class BootLoop:
    def __init__(self, device: DeviceContext, body: Callable[[], Awaitable[None]]) -> None:
        self.device = device
        self.body = body
        self._scope: trio.CancelScope | None = None
        device.add_boot_hook(self._start)
        device.add_shutdown_hook(self._stop)

    async def _start(self) -> None:
        nursery = self.device.nursery
        if nursery is None or self._scope is not None:
            return
        self._scope = trio.CancelScope()
        nursery.start_soon(self._run, self._scope)

    async def _run(self, scope: trio.CancelScope) -> None:
        with scope:
            await self.body()

    async def _stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None
