"""The objects built once at start and shared by the app, the actors and the device link.

``open_services`` is the one place that brings the process up in order — embedded PostgreSQL (unless
FLEETHUB_DATABASE_URL is set), the storage bridge, migrations, write-behind writers, the actor
supervisor — and takes it down in reverse on exit.
"""

from __future__ import annotations

import contextlib
from functools import partial
import logging
import uuid
import warnings
from pathlib import Path
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from actors.bus import Bus
from actors.device import DeviceActor
from actors.machines import window as window_machine
from actors.rollout import ReloadWindows, RolloutActor
from actors.runtime import Registry, Supervisor
from device_client.shared.clock import Clock, OffsetClock
from device_client.shared.linkcodes import Close, draining_reason
from hub import gc_tuning
from hub.billing.devices import BillingHooks
from hub.billing.state import org_billing
from hub.auth.access import Access
from hub.auth.signing_keys import SIGNING_KEYS_TAG
from hub.events import EventHub
from hub.eventlog import Journal, keep_pruned
from hub.linkhealth import LinkHealth
from hub.metrics import Metrics
from hub.settings import Settings
from storage.behind import WriteBehind
from storage.db import Database
from storage.journal import DiskJournal
from storage.private import secure_data_dir
from storage.devices import CHANGED_CHANNEL as DEVICES_CHANGED
from storage.stores import Stores
from storage.migrate import migrate
from hub.metering import Meter
from hub.tunnels.grants import push_hub_keys
from hub.tunnels.sessions import TunnelService
from hub.topology import SingleNode, Topology

if TYPE_CHECKING:
    from hub.auth.access import Authenticating
    from hub.documents import CachedDocument
    from hub.mcp.endpoint import McpEndpoint
    from hub.mcp.server import McpHost
    from hub.registry.proxy import ProxyHost, RegistryProxy
    from hub.tunnels.sessions import TunnelHost
    from hub.webhooks.worker import Deliverer, Delivering
    from storage.embedded import EmbeddedPostgres

log = logging.getLogger("fleethub")
AUTH_CHANNEL = "fleethub_auth"
SECRET_KEYS_TAG = "secret-keys"  # sent on AUTH_CHANNEL after `fleethub admin rotate-secret-key`


class Rerun:
    """Work run once at a time: asked again while it runs, it runs once more after, so a burst of
    asks (NOTIFYs of key rotations) costs two runs, not a task each."""

    def __init__(self, work: Callable[[], Awaitable[Any]], spawn: Callable[..., bool], name: str) -> None:
        self._work, self._spawn, self._name = work, spawn, name
        self._running = self._again = False

    @property
    def running(self) -> bool:
        return self._running

    def soon(self) -> None:
        if self._running:
            self._again = True
        elif self._spawn(self._run, name=self._name):
            self._running = True

    async def _run(self) -> None:
        try:
            again = True
            while again:
                self._again = False
                await self._work()
                again = self._again
        finally:
            self._running = False


@dataclass
class Link:
    """One device's live WebSocket, as the link handler registers it."""
    device_id: uuid.UUID
    conn_id: str
    cancel_scope: trio.CancelScope
    close_code: int = 1000  # what the link handler closes the socket with (device_client/shared/linkcodes.py)
    close_reason: str = ""

    def close(self, code: int = 1000, reason: str = "") -> None:
        """End the link; the handler closes the socket with ``code`` and ``reason`` (the first close wins)."""
        if not self.cancel_scope.cancel_called:
            self.close_code, self.close_reason = code, reason
        self.cancel_scope.cancel()


@dataclass
class Services:
    """The composition root's product: what the app, the device link and the actors share.

    Given: the process's settings, clock, database and runtime. Built here (``__post_init__``): the
    three components (``stores``, ``access``, ``topology``), the outboxes, and the tunnel sessions and
    billing hooks. Set later by who makes them: the app's parts and the embedded PostgreSQL.
    """
    # the process
    settings: Settings
    clock: Clock
    db: Database
    nursery: trio.Nursery
    supervisor: Supervisor
    registry: Registry
    node_id: str = ""  # this process's name (in a cluster, its node's: hub/cluster/node.py)
    bus: Bus = field(default_factory=Bus)
    events: EventHub = field(default_factory=EventHub)
    metrics: Metrics = field(default_factory=Metrics)
    draining: bool = False  # set by drain(): /readyz answers 503 so balancers stop sending work
    stopping: bool = False  # set as open_services begins to close: spawn() starts nothing more
    # the device links this process holds, and their diagnosis (takeovers, protocol errors)
    links: dict[uuid.UUID, Link] = field(default_factory=dict)
    link_health: LinkHealth = field(default_factory=LinkHealth)
    # How many update windows changed in this process: a RolloutActor still starting (not in the
    # registry, so fleet_changed cannot tell it) compares it after its start (actors/rollout.py).
    window_changes: int = 0
    # the components
    stores: Stores = field(init=False)      # every repository (storage/stores.py)
    access: Access = field(init=False)      # credential cache, signing keys, throttles (hub/auth/access.py)
    topology: Topology = field(init=False)  # one process, or a cluster node (hub/topology.py)
    # the outboxes: writes that wait out a PostgreSQL outage (storage/behind.py)
    presence: WriteBehind = field(init=False)
    audit_log: WriteBehind = field(init=False)
    meter: Meter = field(init=False)
    journal: Journal = field(init=False)  # the event log's writer, then the event hub (hub/eventlog.py)
    # what devices and their links use beside the actors
    tunnels: TunnelService = field(init=False)
    device_hooks: BillingHooks = field(init=False)  # what billing does with each device's link and events
    # Storage work of delivery jobs (actors/device_delivery.py) never takes more than this many of the
    # pool's connections at once; the rest stay free for API requests.
    delivery_slots: trio.CapacityLimiter = field(init=False)
    # set by who makes them
    deliverer: "Deliverer | None" = None  # hub/webhooks/worker.py, while this process delivers webhooks
    # The HTTP app's view functions by endpoint (hub/app.py sets it): authentication finds the view a
    # request was routed to without a read through Quart's current_app proxy.
    http_views: dict | None = None
    mcp: "McpEndpoint | None" = None  # hub/mcp/endpoint.py, set by the app (hub/app.py)
    # GET /v1/device/protocol.json's document, built once off the loop (hub/documents.py; set by hub/app.py)
    protocol_document: "CachedDocument | None" = None
    registry_proxy: "RegistryProxy | None" = None  # hub/registry/, made at its first request
    embedded_pg: "EmbeddedPostgres | None" = None  # when this process started its own PostgreSQL
    key_push: "Rerun" = field(init=False, repr=False)  # link.keys pushes after a signing-key rotation

    def __post_init__(self) -> None:
        self.stores = Stores.open(self.db, self.settings.data_dir)
        self.access = Access.open(self.settings.data_dir)
        self.presence = WriteBehind(self.stores.devices.write_presence, interval=0.5, name="presence rows")
        # audit rows PostgreSQL has not confirmed in time are fsync'd here before the answer (storage/journal.py)
        self.audit_log = WriteBehind(self.stores.audit.write_many, interval=1.0, name="audit events",
                                     journal=DiskJournal(self.settings.data_dir / "journal", "audit")
                                     if self.settings.audit_durable else None)
        self.meter = Meter(self.stores.usage)
        self.journal = Journal(self.stores.event_log, self.events, enabled=self.settings.event_log)
        self.delivery_slots = trio.CapacityLimiter(max(1, self.settings.db_pool_max - 4))
        self.tunnels = TunnelService(self)
        self.device_hooks = BillingHooks(self.bus, self.settings.command_timeout, partial(org_billing, self))
        # open_services makes a cluster node's ClusterNode (hub/cluster/topology.py) once its bus is up
        self.topology = SingleNode(self)
        self.key_push = Rerun(partial(push_hub_keys, self), self.spawn, "push hub keys")

    async def drain(self, timeout: float = 5.0) -> int:
        """Graceful shutdown, first step: readiness turns false and every connected device is told to
        leave and reconnect within the drain window. Returns how many devices acknowledged."""
        self.draining = True
        payload: dict[str, Any] = {"reconnectAfter": self.settings.drain_window}
        if self.settings.successor_url:
            payload["url"] = self.settings.successor_url
        acknowledged = 0
        leaving: set[uuid.UUID] = set()

        async def tell(device_id: uuid.UUID) -> None:
            nonlocal acknowledged
            try:
                await self.bus.request(f"cmd.{device_id}.link.drain", payload, timeout=timeout)
                acknowledged += 1
                leaving.add(device_id)
            except Exception as exc:  # noqa: BLE001 — a device that cannot be told just loses its link
                log.info("device %s was not drained: %s", device_id, type(exc).__name__)

        with trio.move_on_after(timeout + 1):
            async with trio.open_nursery() as nursery:
                for device_id in list(self.links):
                    nursery.start_soon(tell, device_id)
        # devices that did not leave on link.drain (an agent without it, or one that did not answer) are
        # told the same by the close code
        for device_id, link in list(self.links.items()):
            if device_id not in leaving:
                link.close(Close.DRAINING, draining_reason(self.settings.drain_window))
        return acknowledged

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> bool:
        """Start background work in the services nursery from a callback (a NOTIFY handler, a sync
        hook). Once shutdown has begun the nursery is cancelled, then closed to new tasks, where
        ``start_soon`` raises — from a ``run_sync_soon`` callback that ends the whole trio run — so
        the work is dropped (it would have been cancelled at once anyway). Returns whether it started."""
        if not self.stopping:
            try:
                self.nursery.start_soon(fn, *args, name=name)
                return True
            except RuntimeError:  # closed to new arrivals: shutdown, whoever began it
                pass
        log.info("shutting down: %s not started", name or getattr(fn, "__name__", "background work"))
        return False

    def on_notify(self, tag: str) -> None:
        if tag == SECRET_KEYS_TAG:
            self.stores.secret_box.reload()  # a rotation beside us: seal under the new key from now on
        elif tag == SIGNING_KEYS_TAG:
            self.access.signing_keys.reload()  # sign with the new key from now on, still verify the old ones
            self.key_push.soon()  # connected devices learn the new grant key
        else:
            self.access.auth_cache.forget(tag)

    async def invalidate(self, *tags: str) -> None:
        """Make an access change take effect now: forget cached lookups with these tags here, and
        tell every other process on the database (PostgreSQL NOTIFY) to forget them too."""
        for tag in tags:
            self.access.auth_cache.forget(tag)
            await self.db.execute("SELECT pg_notify($1, $2)", AUTH_CHANNEL, tag)

    def forget_cached(self) -> None:
        """Notifications may have been missed (a LISTEN connection was re-opened): what they would
        have evicted goes now."""
        self.access.auth_cache.clear()
        self.stores.devices.forget_all()

    def device_live(self, row: dict) -> dict | None:
        """The device's live state from its actor, when this process's actor is the live one: always
        in one process; in a cluster only on the node holding the link (an actor elsewhere is stale,
        and there the presence row, which the holding node writes, says it). None: no live state."""
        actor = self.registry.lookup(("device", row["id"]))
        if isinstance(actor, DeviceActor) and actor.machine is not None and self.topology.actor_is_live(row["id"]):
            return actor.live()
        return None

    async def device_actor(self, device_id: uuid.UUID) -> DeviceActor:
        return await self.registry.get(("device", device_id),
                                       lambda: DeviceActor(device_id, self, self.device_hooks))

    def fleet_changed(self, fleet_id: uuid.UUID) -> None:
        """A fleet's update window changed: the rollouts running on it re-read their windows. (A fleet
        has no actor: its window and its one active rollout live in storage — docs/architecture.md.)"""
        self.window_changes += 1
        for actor in self.registry.actors():
            if isinstance(actor, RolloutActor) and fleet_id in actor.row.get("fleet_ids", ()):
                actor.tell(ReloadWindows())

    async def rollout_actor(self, rollout_id: uuid.UUID) -> RolloutActor:
        await self.topology.hold_rollout(rollout_id)  # HeldElsewhere (409) when another node runs it
        return await self.registry.get(("rollout", rollout_id), lambda: RolloutActor(rollout_id, self))


def start_embedded(data_dir: Path) -> "EmbeddedPostgres":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR on import
        from storage.embedded import EmbeddedPostgres
    pg = EmbeddedPostgres(data_dir / "pg")
    pg.start()
    return pg


@contextlib.asynccontextmanager
async def open_services(settings: Settings, clock: Clock | None = None, *,
                        serving: bool = True) -> AsyncIterator[Services]:
    """``serving=False`` is for tools (``fleethub admin``) that share storage with a running hub.
    With ``settings.nats_url`` the process joins a cluster: its bus is NATS (hub/cluster/node.py)."""
    from hub.cluster.node import node_id, open_cluster_bus
    node = node_id(settings)
    async with open_cluster_bus(settings, node) as cluster_bus:
        async with _open_services(settings, clock, serving=serving, bus=cluster_bus, node=node) as services:
            yield services


@contextlib.asynccontextmanager
async def _open_services(settings: Settings, clock: Clock | None, *, serving: bool, bus: Any,
                         node: str) -> AsyncIterator[Services]:
    if clock is None and settings.test_clock_offset:
        log.warning("FLEETHUB_TEST_CLOCK_OFFSET: this node's clock runs %+.3f s off (a fault test's skew)",
                    settings.test_clock_offset)
        clock = OffsetClock(settings.test_clock_offset)
    clock = clock or Clock()
    pg = None
    dsn = settings.database_url
    secure_data_dir(settings.data_dir)  # keys live here: nobody else lists or reads it
    if dsn is None:
        pg = await trio.to_thread.run_sync(start_embedded, settings.data_dir)
        dsn = pg.dsn
        log.info("embedded PostgreSQL on 127.0.0.1:%d, data in %s", pg.port, pg.data_dir)
    try:
        db = Database(dsn, max_size=settings.db_pool_max, connect_timeout=settings.db_connect_timeout,
                      statement_timeout=settings.db_statement_timeout, call_timeout=settings.db_call_timeout,
                      application_name=f"fleethub {node}"[:63])
        await db.open()
        try:
            applied = await migrate(db)
            if applied:
                log.info("applied migrations: %s", ", ".join(applied))
            # what the first update window checked would otherwise read from disk on the loop
            await trio.to_thread.run_sync(window_machine.zone_names)
            async with trio.open_nursery() as nursery:
                supervisor = Supervisor(nursery)
                # a cluster node's bus is NATS from the start: what is built with the bus (the billing
                # hooks' telemetry.set) reaches a device on any node
                services = Services(settings=settings, clock=clock, db=db, nursery=nursery,
                                    supervisor=supervisor, registry=Registry(supervisor), node_id=node,
                                    **({} if bus is None else {"bus": bus}))
                if bus is not None:
                    from hub.cluster.topology import ClusterNode
                    services.topology = ClusterNode(services, bus)
                services.embedded_pg = pg
                await db.listen(AUTH_CHANNEL, services.on_notify)
                # a device deleted or moved, by any process (migration 0017's trigger)
                await db.listen(DEVICES_CHANGED, services.stores.devices.changed)
                # After PostgreSQL restarts, invalidations sent meanwhile were missed: start cold.
                await nursery.start(partial(db.keep_listening, services.forget_cached))
                await nursery.start(services.presence.run)
                await nursery.start(services.stores.devices.cache.keep_purged)  # expired rows leave when idle too
                await nursery.start(services.audit_log.run)
                await nursery.start(services.journal.run)
                if serving and settings.event_log:
                    await nursery.start(keep_pruned, services.stores.event_log, services.clock,
                                        settings.event_retention_days)
                    from hub.webhooks.worker import Deliverer
                    services.deliverer = Deliverer(services, lease_seconds=settings.webhook_lease_seconds)
                    await nursery.start(services.deliverer.run)
                await nursery.start(services.access.auth_cache.keep_fresh)  # credentials refreshed before expiry
                await nursery.start(services.meter.run)
                if serving:
                    await nursery.start(gc_tuning.run)
                # what a start resets (devices left online), and the background work of one hub
                # process (interrupted rollouts, open tunnels) or of a cluster node (leases, liveness)
                await services.topology.start(nursery, serving=serving)
                try:
                    yield services
                finally:
                    services.stopping = True  # before the nursery is cancelled, then closed
                    nursery.cancel_scope.cancel()
        finally:
            await db.close()
    finally:
        if pg is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(pg.stop)


if TYPE_CHECKING:
    def _provides_every_port(s: Services) -> None:
        """mypy (tests/actors/test_types.py): the composition root's product is each consumer's port, so
        a consumer typed by what it uses is still given it (the actors' port: ``device_actor`` above)."""
        ports: tuple[Authenticating, Delivering, TunnelHost, ProxyHost, McpHost] = (s, s, s, s, s)
        del ports
