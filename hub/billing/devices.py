"""Billing's side of the device link.

Device → hub events (device_client/telemetry.py):

    telemetry       {...}  published on the device's event stream (``device.telemetry``) by the
                    device actor and counted here per organisation.

The registry proxy's bytes are not a device's report: the hub serves them and meters them itself
(hub/registry/proxy.py). A ``registry.bytes`` event from an older agent is an ordinary device event,
billed nothing: a device's own count of what it was served is not what the hub carried.

Hub → device: command ``telemetry.set {enabled}`` at link time when the hello's ``telemetry`` field
differs from the organisation's entitlement, and to every connected device of the organisation when
a billing admin switches telemetry.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable

import trio

from actors.bus import Bus, BusError
from actors.device import DeviceHooks
from device_client.shared.protocol import subject
from hub.billing.state import OrgBilling
from hub.errors import FleethubError

log = logging.getLogger("fleethub.billing")

TELEMETRY = "telemetry"
EVENT_KINDS = frozenset({TELEMETRY})
PUSH_CONCURRENCY = 64


def telemetry_counts(s) -> Counter:
    """Telemetry events received per organisation since the hub started."""
    return s.device_hooks.telemetry_events


async def send_telemetry(bus: Bus, timeout: float, device_id: uuid.UUID, enabled: bool) -> bool:
    try:
        await bus.request(subject(str(device_id), "telemetry.set"), {"enabled": enabled}, timeout=timeout)
    except (BusError, FleethubError) as exc:  # offline, timed out, refused: the next link sets it
        log.info("device %s: telemetry.set %s not delivered: %r", device_id, enabled, exc)
        return False
    return True


async def push_telemetry(s, org_id: uuid.UUID, enabled: bool) -> int:
    """Tell every connected device of the organisation; returns how many acknowledged."""
    ids = [d for d in await s.stores.billing.device_ids(org_id) if d in s.links]
    limiter = trio.CapacityLimiter(PUSH_CONCURRENCY)
    done = 0

    async def one(device_id: uuid.UUID) -> None:
        nonlocal done
        async with limiter:
            done += await send_telemetry(s.bus, s.settings.command_timeout, device_id, enabled)

    async with trio.open_nursery() as nursery:
        for device_id in ids:
            nursery.start_soon(one, device_id)
    return done


async def push_telemetry_in_background(s, org_id: uuid.UUID, enabled: bool) -> None:
    """For the services nursery: a failure is logged, never allowed to take the hub down; devices
    not told now are told at their next link."""
    try:
        await push_telemetry(s, org_id, enabled)
    except Exception:
        log.exception("telemetry.set %s for organisation %s: push failed", enabled, org_id)


class BillingHooks(DeviceHooks):
    """Billing's part of every DeviceActor, passed in by ``Services.device_actor`` (actors import
    nothing from the hub): telemetry events, and telemetry.set at link time."""

    event_kinds = EVENT_KINDS

    def __init__(self, bus: Bus, command_timeout: float,
                 billing_of: Callable[[uuid.UUID], Awaitable[OrgBilling]]) -> None:
        self.bus, self.command_timeout = bus, command_timeout  # telemetry.set to the device
        self.billing_of = billing_of  # the organisation's entitlements (hub/billing/state.py org_billing)
        self.telemetry_events: Counter = Counter()  # per organisation, since the hub started

    async def on_link(self, org_id: uuid.UUID, device_id: uuid.UUID, facts: dict) -> None:
        if facts.get("telemetry") is None:
            return  # an agent without the telemetry part: it would not know the command
        wanted = (await self.billing_of(org_id)).enabled("telemetry")
        if facts.get("telemetry") is not wanted:
            await send_telemetry(self.bus, self.command_timeout, device_id, wanted)

    async def on_event(self, org_id: uuid.UUID, device_id: uuid.UUID, kind: str, payload: dict) -> None:
        if kind == TELEMETRY:
            self.telemetry_events[org_id] += 1
