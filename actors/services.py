"""What an actor may use of the process it runs in: the ports, declared here so actors need no hub.

The hub's ``Services`` (hub/services.py) provides them; the actor tests pass smaller stand-ins. An
actor reaches another actor only through ``registry``/``device_actor`` and a message, and storage only
through the repositories below. What the rest of the hub does with device events (billing) is a hook
passed to the DeviceActor (``DeviceHooks`` in actors/device.py), not something actors import.

What the hub provides from its own layer (settings, the meter, the journal, the tunnel sessions, the
link diagnosis) is named by a Protocol of what actors use of it, since actors import nothing of the
hub. mypy checks the actors against this port, and the tests' one stand-in (tests/actors/standin.py)
against it too (tests/actors/test_types.py).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import trio

    from actors.bus import Bus
    from actors.runtime import Actor, Registry
    from device_client.shared.clock import Clock
    from storage.behind import WriteBehind
    from storage.configs import Configurations
    from storage.crypto import SecretBox
    from storage.devices import Devices
    from storage.fleets import Fleets
    from storage.leases import Fence
    from storage.memtests import MemoryTests
    from storage.registry_credentials import RegistryCredentials
    from storage.rollouts import Rollouts
    from storage.secrets import SecretFiles
    from storage.tunnels import Tunnels
    from storage.windows import UpdateWindows


class Publisher(Protocol):
    def publish(self, topic: tuple[str, Any], event: dict[str, Any]) -> None: ...


class Timeouts(Protocol):
    """What actors read of the hub's settings (hub/settings.py ``Settings``)."""

    @property
    def heartbeat_timeout(self) -> float: ...
    @property
    def reboot_timeout(self) -> float: ...
    @property
    def command_timeout(self) -> float: ...
    @property
    def rollout_resend_after(self) -> float: ...


class Journal(Protocol):
    """The event log's writer (hub/eventlog.py ``Journal``): appended, then published."""

    @property
    def enabled(self) -> bool: ...
    def record(self, org_id: uuid.UUID, event: dict[str, Any]) -> None: ...


class DeviceMeter(Protocol):
    """Billing's meter (hub/metering.py ``Meter``): a device active on a day."""

    def device_seen(self, org_id: uuid.UUID, device_id: uuid.UUID, day: dt.date) -> None: ...


class TunnelSessions(Protocol):
    """The tunnel sessions (hub/tunnels/sessions.py ``TunnelService``): their rows, metering, audit."""

    @property
    def store(self) -> "Tunnels": ...
    def meter(self, grown: dict[str, Any] | None) -> None: ...
    def audit_end(self, row: dict[str, Any], operation: str, reason: str) -> None: ...


class LinkDiagnosis(Protocol):
    """The diagnosis's counts per device (hub/linkhealth.py ``LinkHealth``)."""

    def protocol_error(self, device_id: uuid.UUID, what: str, now: dt.datetime) -> None: ...


class Placement(Protocol):
    """Where this process stands among the hub's processes, as far as an actor needs to know: one
    process alone, or one node of a cluster (hub/topology.py chooses, once). An actor never asks which."""

    def tell_elsewhere(self, device_id: uuid.UUID, msg: object) -> None:
        """A tell for a device not linked here: to the node holding its link, at least once
        (hub/cluster/tells.py); nothing in one process, where the device is linked nowhere."""
        ...

    def link_epoch(self, device_id: uuid.UUID) -> int | None:
        """The link epoch this node claimed for the device (its presence writes carry it), or None."""
        ...

    def rollout_fence(self, rollout_id: uuid.UUID) -> "Fence | None":
        """The lease this node holds on the rollout (its writes are fenced by it), or None."""
        ...


class Stores(Protocol):
    """The repositories actors use, of the hub's stores (storage/stores.py ``Stores``)."""

    @property
    def devices(self) -> "Devices": ...
    @property
    def fleets(self) -> "Fleets": ...  # a fleet's registry proxy mode, sent with a version that runs containers
    @property
    def registry_credentials(self) -> "RegistryCredentials": ...  # sealed registry logins, opened for the device's frame
    @property
    def configs(self) -> "Configurations": ...
    @property
    def secrets(self) -> "SecretFiles": ...
    @property
    def secret_box(self) -> "SecretBox": ...  # opens secret-file contents right before they are sent
    @property
    def rollouts(self) -> "Rollouts": ...
    @property
    def windows(self) -> "UpdateWindows": ...
    @property
    def memtests(self) -> "MemoryTests": ...


class Services(Protocol):
    """What an actor may use of its process. Read-only, so that the hub's own types (its Settings,
    EventHub, Journal...) provide them: mypy checks the hub's Services against this port too."""
    @property
    def settings(self) -> Timeouts: ...  # heartbeat/reboot/command timeouts (hub/settings.py)
    @property
    def clock(self) -> "Clock": ...
    @property
    def bus(self) -> "Bus": ...
    @property
    def registry(self) -> "Registry": ...
    @property
    def events(self) -> Publisher: ...  # the event hub the SSE streams read
    @property
    def journal(self) -> Journal: ...  # record(org_id, event): appended to the event log, then published (hub/eventlog.py)
    @property
    def presence(self) -> "WriteBehind": ...  # device presence rows, written behind
    @property
    def links(self) -> dict[uuid.UUID, Any]: ...  # the device links this process holds (conn_id, close())
    @property
    def meter(self) -> DeviceMeter: ...  # device_seen(org, device, day)
    @property
    def delivery_slots(self) -> "trio.CapacityLimiter": ...
    @property
    def tunnels(self) -> TunnelSessions: ...  # the tunnel sessions' repository, metering and audit (hub/tunnels/sessions.py)
    @property
    def topology(self) -> Placement: ...  # tells elsewhere, link epochs, rollout fences (one process or a cluster)
    @property
    def window_changes(self) -> int: ...  # update windows changed in this process (actors/rollout.py)
    @property
    def link_health(self) -> LinkDiagnosis: ...  # protocol_error(device, what, now): the diagnosis's count (hub/linkhealth.py)
    @property
    def stores(self) -> Stores: ...  # the repositories (storage/stores.py)

    async def device_actor(self, device_id: uuid.UUID) -> "Actor": ...
