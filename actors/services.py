"""What an actor may use of the process it runs in: the ports, declared here so actors need no hub.

The hub's ``Services`` (hub/services.py) provides them; the actor tests pass smaller stand-ins. An
actor reaches another actor only through ``registry``/``device_actor`` and a message, and storage only
through the repositories below. What the rest of the hub does with device events (billing) is a hook
passed to the DeviceActor (``DeviceHooks`` in actors/device.py), not something actors import.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import trio

    from actors.bus import Bus
    from actors.runtime import Actor, Registry
    from device_client.shared.clock import Clock
    from storage.behind import WriteBehind
    from storage.configs import Configurations
    from storage.devices import Devices
    from storage.memtests import MemoryTests
    from storage.rollouts import Rollouts
    from storage.secrets import SecretFiles
    from storage.windows import UpdateWindows


class Publisher(Protocol):
    def publish(self, topic: tuple[str, Any], event: dict[str, Any]) -> None: ...


class Services(Protocol):
    settings: Any            # heartbeat/reboot/command timeouts (hub/settings.py)
    clock: "Clock"
    bus: "Bus"
    registry: "Registry"
    events: Publisher        # the event hub the SSE streams read
    journal: Any             # record(org_id, event): appended to the event log, then published (hub/eventlog.py)
    presence: "WriteBehind"  # device presence rows, written behind
    links: dict[uuid.UUID, Any]  # the device links this process holds (conn_id, close())
    meter: Any               # device_seen(org, device, day); add(org, product, quantity, day=)
    devices: "Devices"
    configs: "Configurations"
    secrets: "SecretFiles"
    secret_box: Any          # opens secret-file contents right before they are sent
    delivery_slots: "trio.CapacityLimiter"
    rollouts: "Rollouts"
    windows: "UpdateWindows"
    memtests: "MemoryTests"
    tunnels: Any             # the tunnel sessions' repository, metering and audit (hub/tunnels/sessions.py)
    clustered: bool          # one node of several: a device may be linked to another process
    # a tell for a device linked to another node (hub/cluster/tells.py); None on a single node
    forward_tell: Callable[[uuid.UUID, object], None] | None
    # cluster only, empty on a single node: device -> the link epoch this node claimed
    # (hub/cluster/presence.py); rollout -> the lease this node holds on it (hub/cluster/leases.py)
    link_epochs: dict[uuid.UUID, int]
    rollout_fences: dict[uuid.UUID, Any]
    window_changes: int      # update windows changed in this process (actors/rollout.py)
    link_health: Any         # protocol_error(device, what, now): the diagnosis's count (hub/linkhealth.py)

    async def device_actor(self, device_id: uuid.UUID) -> "Actor": ...
