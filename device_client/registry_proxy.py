"""Registry-proxy accounting: the bytes the device's registry proxy carried, reported to the hub
for billing as event ``registry.bytes`` {fleetBytes, day} (device_client/shared/protocol.py, Billing).

``carried(n)`` is what the proxy calls for each chunk it relays. Counts are kept per UTC day until
the hub has them: a report that cannot be sent (no link) stays pending, and pending counts are
written to ``registry_proxy.json`` at shutdown and read back at boot, so a reboot loses nothing.

This agent has no container runtime, so no real image pulls go through a proxy here; the
simulation backend (``simulate(bytes_per_minute)``, used by ``fleethub sim
--registry-bytes-per-minute``) stands in for that traffic and feeds the same ``carried`` path.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .background import BootLoop
from .state import write_json_atomic

if TYPE_CHECKING:
    from .context import DeviceContext

log = logging.getLogger("fleethub.agent.registry")

DEFAULT_REPORT_INTERVAL = 60.0


class RegistryProxy:
    def __init__(self, data_dir: Path, report_interval: float = DEFAULT_REPORT_INTERVAL) -> None:
        self.path = Path(data_dir) / "registry_proxy.json"
        self.report_interval = report_interval
        self.bytes_per_minute = 0
        self.pending: dict[str, int] = {}  # UTC day -> bytes not yet reported
        self.reported = 0  # bytes the hub has been sent
        self.device: Any = None
        self._sim_carry = 0.0
        self._wake = trio.Event()

    def attach(self, device: DeviceContext) -> RegistryProxy:
        self.device = device
        device.add_boot_hook(self._load)
        BootLoop(device, self._loop)
        device.add_shutdown_hook(self._save)
        return self

    def configure(self, *, report_interval: float | None = None, bytes_per_minute: int | None = None) -> None:
        if report_interval is not None:
            self.report_interval = report_interval
        if bytes_per_minute is not None:
            if bytes_per_minute < 0:
                raise ValueError("bytes_per_minute must not be negative")
            self.bytes_per_minute = bytes_per_minute
        self._poke()

    def _poke(self) -> None:
        self._wake.set()
        self._wake = trio.Event()

    def simulate(self, bytes_per_minute: int) -> None:
        self.configure(bytes_per_minute=bytes_per_minute)

    def _today(self) -> str:
        return self.device.clock.now().astimezone(dt.UTC).date().isoformat()

    def carried(self, n: int) -> None:
        if n > 0:
            idle = not self.pending
            day = self._today()
            self.pending[day] = self.pending.get(day, 0) + int(n)
            if idle and not self.bytes_per_minute:
                self._poke()  # an idle loop sleeps until there is something to report

    async def _load(self) -> None:
        try:
            stored = json.loads(await trio.to_thread.run_sync(self.path.read_text))
            for day, n in stored.get("pending", {}).items():
                self.pending[day] = self.pending.get(day, 0) + int(n)
            await trio.to_thread.run_sync(self.path.unlink)
        except (OSError, ValueError, AttributeError, TypeError):
            pass

    async def _save(self) -> None:
        if self.pending:
            await trio.to_thread.run_sync(write_json_atomic, self.path, {"pending": self.pending})
            self.pending = {}

    async def report(self) -> int:
        """Send what is pending, oldest day first; returns the bytes the hub was sent."""
        sent = 0
        for day in sorted(self.pending):
            n = self.pending[day]
            if not self.device.connected or not await self.device.send_event(
                    "registry.bytes", {"fleetBytes": n, "day": day}):
                break
            # only what was sent: carried() may have added to this day meanwhile
            left = self.pending.get(day, 0) - n
            if left > 0:
                self.pending[day] = left
            else:
                self.pending.pop(day, None)
            sent += n
        self.reported += sent
        return sent

    async def _loop(self) -> None:
        last = trio.current_time()
        while True:
            wake = self._wake
            if not self.bytes_per_minute and not self.pending:
                await wake.wait()  # nothing carried: no periodic wake-ups on a device without traffic
                last = trio.current_time()
                wake = self._wake
            with trio.move_on_after(self.report_interval):
                await wake.wait()
            now = trio.current_time()
            if self.bytes_per_minute:
                self._sim_carry += self.bytes_per_minute * (now - last) / 60.0
                whole = int(self._sim_carry)
                self._sim_carry -= whole
                self.carried(whole)
            last = now
            if self.pending:
                await self.report()
