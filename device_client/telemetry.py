"""Telemetry: while the organisation's telemetry entitlement is on, the device sends a ``telemetry``
event with a few health figures every ``interval`` seconds (device_client/shared/protocol.py, Billing).

The setting comes from the hub (command ``telemetry.set``), is persisted in ``telemetry.json`` so a
reboot keeps it, and is reported in every hello so the hub only sends the command when it differs.
Off by default: nothing is sent until the hub says so.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .background import BootLoop
from .shared.clock import rfc3339
from .commands import CommandError
from .state import write_json_atomic

if TYPE_CHECKING:
    from .context import DeviceContext

log = logging.getLogger("fleethub.agent.telemetry")

DEFAULT_INTERVAL = 60.0


def _meminfo() -> dict[str, int]:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    wanted = {"MemTotal": "memoryTotalBytes", "MemAvailable": "memoryAvailableBytes"}
    out = {}
    for line in lines:
        name, _, rest = line.partition(":")
        if name in wanted and rest.split():
            out[wanted[name]] = int(rest.split()[0]) * 1024
    return out


class Telemetry:
    def __init__(self, data_dir: Path, interval: float = DEFAULT_INTERVAL,
                 system: Callable[[], dict[str, Any]] | None = None) -> None:
        self.path = Path(data_dir) / "telemetry.json"
        self.interval = interval
        self.system = system  # the device's system facts (device_client/sysinfo.py), in every sample
        self.enabled = self._load()
        self.sent = 0
        self.device: Any = None
        self._wake = trio.Event()

    def _load(self) -> bool:
        try:
            return bool(json.loads(self.path.read_text()).get("enabled", False))
        except (OSError, ValueError, AttributeError):
            return False

    def attach(self, device: DeviceContext) -> Telemetry:
        self.device = device
        device.register("telemetry.set", self._set)
        device.add_hello_provider(lambda: {"telemetry": self.enabled})
        BootLoop(device, self._loop)
        return self

    def configure(self, *, interval: float) -> None:
        """Change the period (tests, ``fleethub sim``); takes effect at once."""
        self.interval = interval
        self._poke()

    def _poke(self) -> None:
        self._wake.set()
        self._wake = trio.Event()

    async def _set(self, payload: dict[str, Any]) -> dict[str, Any]:
        enabled = payload.get("enabled")
        if not isinstance(enabled, bool):
            raise CommandError("invalid_payload", "enabled must be true or false")
        if enabled != self.enabled:
            await trio.to_thread.run_sync(write_json_atomic, self.path, {"enabled": enabled})
            self.enabled = enabled
            log.info("telemetry %s", "on" if enabled else "off")
            self._poke()
        return {"enabled": self.enabled}

    def sample(self) -> dict[str, Any]:
        device = self.device
        stats = device.statistics()
        sample: dict[str, Any] = {"sentAt": rfc3339(device.clock.now()), "uptime": round(device.uptime(), 3),
                                  "links": stats.links, "heartbeatsSent": stats.heartbeats_sent}
        try:
            sample["loadAverage"] = [round(x, 3) for x in os.getloadavg()]
        except OSError:
            pass
        sample.update(_meminfo())
        if self.system is not None:
            sample["system"] = self.system()
        return sample

    async def _loop(self) -> None:
        while True:
            wake = self._wake
            if not self.enabled:
                await wake.wait()
                continue
            with trio.move_on_after(self.interval):
                await wake.wait()
                continue  # the setting or the period changed: start the period again
            if self.enabled and self.device.connected and await self.device.send_event("telemetry", self.sample()):
                self.sent += 1
