"""Who may pull through the proxy, and what they were served, metered.

A caller is a device, by its device token (HTTP Basic with any user name, as podman sends what an
auth file holds, or Bearer). Its fleet must have the proxy on (``fleets.registry_proxy``), and it
pulls only from a repository that a configuration version of its organisation names: the proxy is
not an open relay into the registries the hub can reach. Answers are kept ``ACCESS_TTL`` seconds, so
a hundred devices pulling one image cost storage a handful of reads, not one per request; a fleet
switched off, or a device deleted, loses access within that time.

Metering: the bytes handed to a device's connection, per organisation and fleet and UTC day, as
``registry_fallback_bytes`` (hub/metering.py). What the proxy fetched from upstream is its own cost
and is not billed: a blob fetched once and served a hundred times bills the hundred.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from hub.auth.pat import digest as token_digest
from storage.registry import RegistryAccess

from .cache import Cache
from .upstream import Upstream

if TYPE_CHECKING:
    from device_client.shared.clock import Clock
    from hub.metering import Meter
    from hub.settings import Settings
    from storage.db import Database


class ProxyHost(Protocol):
    """What the registry proxy uses of the process (hub/services.py ``Services`` provides it)."""

    @property
    def db(self) -> "Database": ...
    @property
    def settings(self) -> "Settings": ...
    @property
    def clock(self) -> "Clock": ...
    @property
    def meter(self) -> "Meter": ...  # the bytes it serves, billed
    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> bool: ...

ACCESS_TTL = 30.0
MAX_REMEMBERED = 10_000  # answers kept at most; the oldest go first


@dataclass(frozen=True)
class Puller:
    device_id: uuid.UUID
    org_id: uuid.UUID
    fleet_id: uuid.UUID | None
    proxy_on: bool


class RegistryProxy:
    def __init__(self, services: ProxyHost) -> None:
        self.s = services
        settings = services.settings
        self.access = RegistryAccess(services.db)
        # fills in the hub's own tasks: a blob streams to the devices while it arrives (cache.py)
        self.cache = Cache(settings.data_dir / "registry-cache", settings.registry_cache_mib << 20,
                           spawn=services.spawn)
        self.upstream = Upstream(allowed=settings.registries)
        self.served = 0  # bytes handed to devices since the start (tests and the bench read it)
        self._loaded: trio.Event | None = None
        self._pullers: dict[bytes, tuple[float, Puller | None]] = {}
        self._names: dict[tuple[uuid.UUID, str], tuple[float, bool]] = {}

    async def ready(self) -> None:
        """The cache as the last run left it, read once; requests meanwhile wait (the reading
        clears the temporary directory, where their fills would be)."""
        if self._loaded is None:
            self._loaded = trio.Event()
            try:
                await trio.to_thread.run_sync(self.cache.load)
            finally:
                self._loaded.set()
        await self._loaded.wait()

    async def puller(self, token: str) -> Puller | None:
        key = token_digest(token)
        now = trio.current_time()
        known = self._pullers.get(key)
        if known is not None and known[0] > now:
            return known[1]
        row = await self.access.puller(key)
        found = Puller(row["id"], row["org_id"], row["fleet_id"], row["registry_proxy"]) if row else None
        _remember(self._pullers, key, (now + ACCESS_TTL, found))
        return found

    async def may_pull(self, puller: Puller, name: str) -> bool:
        key = (puller.org_id, name)
        now = trio.current_time()
        known = self._names.get(key)
        if known is not None and known[0] > now:
            return known[1]
        allowed = await self.access.names_repository(puller.org_id, name)
        _remember(self._names, key, (now + ACCESS_TTL, allowed))
        return allowed

    def carried(self, puller: Puller, n: int) -> None:
        if n <= 0:
            return
        self.served += n
        day = self.s.clock.now().astimezone(dt.UTC).date()
        self.s.meter.add(puller.org_id, "registry_fallback_bytes", n, day=day,
                         key=str(puller.fleet_id) if puller.fleet_id else "")


def _remember(table: dict, key: Any, value: Any) -> None:
    if len(table) >= MAX_REMEMBERED:
        table.pop(next(iter(table)))
    table[key] = value
