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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from actors.bus import Bus
from actors.device import DeviceActor
from actors.rollout import ReloadWindows, RolloutActor
from actors.runtime import Registry, Supervisor
from device_client.shared.clock import Clock, OffsetClock
from device_client.shared.linkcodes import Close, draining_reason
from hub import gc_tuning
from hub.auth.cache import AuthCache
from hub.billing.devices import BillingHooks
from hub.auth.oauth import TokenSigner
from hub.auth.signing_keys import SIGNING_KEYS_TAG, SigningKeys
from hub.auth.ratelimit import BurstLimiter, RateLimiter
from hub.auth.sessions import LoginThrottle
from hub.events import EventHub
from hub.eventlog import Journal, keep_pruned
from hub.linkhealth import LinkHealth
from hub.metrics import Metrics
from hub.settings import Settings
from storage.audit import Audit
from storage.behind import WriteBehind
from storage.db import Database
from storage.journal import DiskJournal
from storage.private import secure_data_dir
from storage.devices import CHANGED_CHANNEL as DEVICES_CHANGED, Devices
from storage.events import EventLog
from storage.webhooks import Webhooks
from storage.configs import Configurations
from storage.crypto import SecretBox
from storage.fleets import Fleets
from storage.identity import Identity
from storage.memtests import MemoryTests
from storage.migrate import migrate
from storage.orgs import Orgs
from storage.leases import RolloutLeases
from storage.nodes import ClusterNodes
from storage.rollouts import Rollouts
from storage.rowcache import RowCache
from storage.windows import UpdateWindows
from storage.registry_credentials import RegistryCredentials
from storage.secrets import SecretFiles
from storage.tokens import Tokens
from storage.usage import Usage
from storage.billing import Billing
from hub.metering import Meter
from hub.tunnels.grants import push_hub_keys
from hub.tunnels.sessions import TunnelService
from hub.topology import SingleNode, Topology
from storage.assistant import AssistantStore

log = logging.getLogger("fleethub")
AUTH_CHANNEL = "fleethub_auth"
SECRET_KEYS_TAG = "secret-keys"  # sent on AUTH_CHANNEL after `fleethub admin rotate-secret-key`


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
    settings: Settings
    clock: Clock
    db: Database
    nursery: trio.Nursery
    supervisor: Supervisor
    registry: Registry
    bus: Bus = field(default_factory=Bus)
    events: EventHub = field(default_factory=EventHub)
    metrics: Metrics = field(default_factory=Metrics)
    links: dict[uuid.UUID, Link] = field(default_factory=dict)
    draining: bool = False  # set by drain(): /readyz answers 503 so balancers stop sending work
    stopping: bool = False  # set as open_services begins to close: spawn() starts nothing more
    _pushing_keys: bool = field(default=False, repr=False)  # a link.keys push runs (_push_keys_soon)
    _push_keys_again: bool = field(default=False, repr=False)
    link_health: LinkHealth = field(default_factory=LinkHealth)  # takeovers, protocol errors (diagnosis)
    node_id: str = ""  # this process's name (in a cluster, its node's: hub/cluster/node.py)
    # How many update windows changed in this process: a RolloutActor still starting (not in the
    # registry, so fleet_changed cannot tell it) compares it after its start (actors/rollout.py).
    window_changes: int = 0

    def __post_init__(self) -> None:
        self.orgs = Orgs(self.db)
        self.tokens = Tokens(self.db)
        self.devices = Devices(self.db, RowCache())
        self.fleets = Fleets(self.db)
        self.audit = Audit(self.db)
        self.identity = Identity(self.db)
        self.configs = Configurations(self.db, self.devices.cache)
        self.secrets = SecretFiles(self.db)
        self.registry_credentials = RegistryCredentials(self.db)
        self.rollouts = Rollouts(self.db, self.devices.cache)
        self.rollout_leases = RolloutLeases(self.db)
        self.cluster_nodes = ClusterNodes(self.db)
        self.windows = UpdateWindows(self.db)
        self.memtests = MemoryTests(self.db, self.devices.cache)
        self.secret_box = SecretBox.from_data_dir(self.settings.data_dir)
        self.auth_cache = AuthCache()
        self.rate_limiter = RateLimiter()
        self.token_limiter = BurstLimiter(window=60)  # POST /v1/oauth/token, per address and client id
        self.upload_limiter = BurstLimiter(window=60)  # a device's page-map uploads (hub/api/pagemaps.py)
        # One ring for access tokens, tunnel tokens and grants: a rotation reloads all three.
        self.signing_keys = SigningKeys.from_data_dir(self.settings.data_dir)
        self.token_signer = TokenSigner(self.signing_keys)
        self.login_throttle = LoginThrottle()
        self.presence = WriteBehind(self.devices.write_presence, interval=0.5, name="presence rows")
        # audit rows PostgreSQL has not confirmed in time are fsync'd here before the answer (storage/journal.py)
        self.audit_log = WriteBehind(self.audit.write_many, interval=1.0, name="audit events",
                                     journal=DiskJournal(self.settings.data_dir / "journal", "audit")
                                     if self.settings.audit_durable else None)
        self.event_log = EventLog(self.db)
        self.journal = Journal(self.event_log, self.events, enabled=self.settings.event_log)
        self.webhooks = Webhooks(self.db)
        self.deliverer: Any = None  # hub/webhooks/worker.py, while this process delivers webhooks
        # The HTTP app's view functions by endpoint (hub/app.py sets it): authentication finds the
        # view a request was routed to without a read through Quart's current_app proxy.
        self.http_views: dict | None = None
        self.registry_proxy: Any = None  # hub/registry/, made at its first request
        self.usage = Usage(self.db)
        self.billing = Billing(self.db)
        # Storage work of delivery jobs (actors/device_delivery.py) never takes more than this many of the
        # pool's connections at once; the rest stay free for API requests.
        self.delivery_slots = trio.CapacityLimiter(max(1, self.settings.db_pool_max - 4))
        self.meter = Meter(self.usage)
        self.tunnels = TunnelService(self)
        self.device_hooks = BillingHooks(self)  # what billing does with each device's link and events
        self.assistant_store = AssistantStore(self.db)
        self.mcp: Any = None  # hub/mcp/endpoint.py, set by the app (hub/app.py)
        self.embedded_pg: Any = None  # storage/embedded.py, when this process started its own PostgreSQL
        # One hub process, or one node of a cluster (hub/topology.py): open_services makes a cluster
        # node's ClusterNode (hub/cluster/topology.py) once its bus is up.
        self.topology: Topology = SingleNode(self)

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
            self.secret_box.reload()  # a rotation beside us: seal under the new key from now on
        elif tag == SIGNING_KEYS_TAG:
            self.signing_keys.reload()  # sign with the new key from now on, still verify the old ones
            self._push_keys_soon()  # connected devices learn the new grant key
        else:
            self.auth_cache.forget(tag)

    def _push_keys_soon(self) -> None:
        """One key push at a time: rotations heard while one runs are pushed once more after it, so a
        burst of NOTIFYs costs two pushes, not a task each."""
        if self._pushing_keys:
            self._push_keys_again = True
        elif self.spawn(self._push_keys, name="push hub keys"):
            self._pushing_keys = True

    async def _push_keys(self) -> None:
        try:
            again = True
            while again:
                self._push_keys_again = False
                await push_hub_keys(self)
                again = self._push_keys_again
        finally:
            self._pushing_keys = False

    async def invalidate(self, *tags: str) -> None:
        """Make an access change take effect now: forget cached lookups with these tags here, and
        tell every other process on the database (PostgreSQL NOTIFY) to forget them too."""
        for tag in tags:
            self.auth_cache.forget(tag)
            await self.db.execute("SELECT pg_notify($1, $2)", AUTH_CHANNEL, tag)

    def forget_cached(self) -> None:
        """Notifications may have been missed (a LISTEN connection was re-opened): what they would
        have evicted goes now."""
        self.auth_cache.clear()
        self.devices.forget_all()

    def device_live(self, row: dict) -> dict | None:
        """The device's live state from its actor, when this process's actor is the live one: always
        in one process; in a cluster only on the node holding the link (an actor elsewhere is stale,
        and there the presence row, which the holding node writes, says it). None: no live state."""
        actor = self.registry.lookup(("device", row["id"]))
        if actor is not None and actor.machine is not None and self.topology.actor_is_live(row["id"]):
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


def start_embedded(data_dir) -> Any:
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
            async with trio.open_nursery() as nursery:
                supervisor = Supervisor(nursery)
                services = Services(settings=settings, clock=clock, db=db, nursery=nursery,
                                    supervisor=supervisor, registry=Registry(supervisor), node_id=node)
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
