"""Where this process stands among the hub's processes: alone (``SingleNode``), or one node of a cluster
(``hub.cluster.topology.ClusterNode``). Chosen once, by ``open_services`` (hub/services.py), from
FLEETHUB_NATS_URL; everything that differs between the two is behind this port, so no view, actor or
storage call asks which it is:

- command routing is the bus's (actors/bus.py in one process, actors/natsbus.py over NATS): a command
  for a device linked elsewhere reaches it there, or the bus answers that nobody holds it;
- tells that must reach the device's actor (``tell_elsewhere``) and asks only its actor answers
  (``holder``);
- presence: the link epoch a node claims when it accepts a link (``link_up``, ``link_epoch``), and
  whether a device's actor here or its presence row says what it is doing (``actor_is_live``,
  ``presence_from_row``);
- rollout ownership (``create_rollout``, ``hold_rollout``, ``rollout_fence``);
- credential throttles (``limits``): counted in this process, or on every node;
- what runs in the background and what a start resets (``start``), and what /readyz and /metrics say.

The actors' share of this port is ``actors.services.Placement``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from actors.services import Placement
from hub.auth.ratelimit import BurstLimiter, Decision
from hub.auth.sessions import Reservation

if TYPE_CHECKING:
    from hub.services import Services


class Limits(Protocol):
    """Credential throttles (sign-in, the token endpoint, page-map uploads): one count per process, or
    one for every node of a cluster (hub/cluster/limits.py)."""

    async def reserve_login(self, account: str, address: str, now: dt.datetime) -> Reservation: ...

    async def login_succeeded(self, attempt: Reservation) -> None: ...

    async def hit_burst(self, limiter: BurstLimiter, key: tuple, limit: int, now: dt.datetime) -> Decision: ...


class LocalLimits:
    """The throttles of this process alone: with no await before the count, parallel guesses each take
    a slot, so at most the limit of them reach the password check. The login throttle is the process's
    (``Services.login_throttle``, which /metrics reads), looked up at each use."""

    def __init__(self, s: Services) -> None:
        self.s = s

    async def reserve_login(self, account: str, address: str, now: dt.datetime) -> Reservation:
        return self.s.access.login_throttle.reserve(account, address, now)

    async def login_succeeded(self, attempt: Reservation) -> None:
        self.s.access.login_throttle.succeeded(attempt)

    async def hit_burst(self, limiter: BurstLimiter, key: tuple, limit: int, now: dt.datetime) -> Decision:
        return limiter.hit(key, limit, now)


class Topology(Placement, Protocol):
    limits: Limits

    def actor_is_live(self, device_id: uuid.UUID) -> bool:
        """Whether this process's actor of the device (if it has one) holds its live state: always in
        one process; in a cluster only on the node holding the link (an actor elsewhere is stale)."""
        ...

    def presence_from_row(self, row: dict) -> dict | None:
        """A device's live state when no actor here holds it: None in one process (it is offline), the
        holding node's presence row in a cluster."""
        ...

    async def link_up(self, device_id: uuid.UUID) -> None:
        """Before a device's link is registered here: claim it (a cluster's other nodes let theirs go)."""
        ...

    async def holder(self, device_id: uuid.UUID) -> str | None:
        """The other node holding the device's link, or None (held here, or linked nowhere)."""
        ...

    async def create_rollout(self, row: dict, steps: list) -> dict:
        """Store a new rollout (in a cluster with this node's lease on it, in the same transaction)."""
        ...

    async def hold_rollout(self, rollout_id: uuid.UUID) -> None:
        """Before a rollout's actor starts here: raises HeldElsewhere when another node runs it."""
        ...

    async def start(self, nursery: trio.Nursery, *, serving: bool) -> None:
        """What a start resets, and the background work of this kind of process."""
        ...

    def readiness(self) -> dict[str, Any]:
        """What /readyz adds (counts and names only)."""
        ...

    def metric_families(self) -> Iterable[Any]:
        """What /metrics adds (prometheus_client families)."""
        ...


class SingleNode:
    """One hub process per database: every device linked to the hub is linked here."""

    def __init__(self, s: Services) -> None:
        self.s = s
        self.limits: Limits = LocalLimits(s)

    def tell_elsewhere(self, device_id: uuid.UUID, msg: object) -> None:
        pass  # no other process: a device not linked here is linked nowhere, and its next hello syncs

    def link_epoch(self, device_id: uuid.UUID) -> int | None:
        return None  # presence rows are this process's alone: no epoch fences them

    def rollout_fence(self, rollout_id: uuid.UUID) -> None:
        return None  # rollouts are this process's alone: no lease fences their writes

    def actor_is_live(self, device_id: uuid.UUID) -> bool:
        return True

    def presence_from_row(self, row: dict) -> dict | None:
        return None

    async def link_up(self, device_id: uuid.UUID) -> None:
        pass

    async def holder(self, device_id: uuid.UUID) -> str | None:
        return None

    async def create_rollout(self, row: dict, steps: list) -> dict:
        return await self.s.stores.rollouts.create(row, steps)

    async def hold_rollout(self, rollout_id: uuid.UUID) -> None:
        pass

    async def start(self, nursery: trio.Nursery, *, serving: bool) -> None:
        if not serving:
            return
        s = self.s
        await s.stores.devices.mark_all_offline()  # this process holds no device links yet
        for rollout_id in await s.stores.rollouts.active_ids():  # rollouts interrupted by a stop go on
            await s.rollout_actor(rollout_id)
        await s.tunnels.resume()  # open tunnel sessions: their actors expire them on time (or now)

    def readiness(self) -> dict[str, Any]:
        return {}

    def metric_families(self) -> Iterable[Any]:
        return ()
