"""/metrics: every metric of the hub, defined here, exposed with ``prometheus_client``.

Each ``Metrics`` (one per ``Services``) has its own ``CollectorRegistry``: never the library's global
default registry, so several hubs in one process (the tests start many) never collide or see each
other's counts. Three kinds of samples go into it:

- instruments this module owns and the request path updates: HTTP requests by method and status, and
  their latency as a histogram (``observe_request``);
- ``_HubCollector``: values read at scrape time from the state that owns them (live links, actors,
  write-behind buffers, the storage crossing and pool-wait histograms kept by storage/db.py, which
  must not import the hub), plus the plain integers below that hub/api/link.py bumps on its hot path;
- the process collector (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
  ``process_open_fds``…), which the benchmarks read instead of /proc.

The hub is one trio thread, so the plain integers need no lock; prometheus_client's own instruments
take theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from device_client.shared import loopwatch

if TYPE_CHECKING:
    from hub.services import Services

# No ``*_created`` series beside each counter and histogram: nothing reads them, they would double the
# page, and they carry the wall-clock time of creation. (A library-wide switch; the hub is its only user.)
prometheus_client.disable_created_metrics()

# Text exposition format 0.0.4, the one generate_latest writes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds from the start of ``_before`` to the end of ``_after`` (hub/app.py): from a cached lookup
# (well under a millisecond) to a slow crossing or an upload (seconds).
CROSSINGS_BUCKETS = (0, 1, 2, 3, 5, 8, 13, 21, 50)
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # ``_total`` is added by the Counter itself.
        self.requests = Counter("fleethub_http_requests", "HTTP requests by method and status.",
                                ["method", "status"], registry=self.registry)
        self.request_seconds = Histogram("fleethub_http_request_duration_seconds",
                                         "Time from the start of a request's handling to its answer.",
                                         ["method"], buckets=REQUEST_BUCKETS, registry=self.registry)
        # By route pattern (bounded: one series per route the app has, "unmatched" for the rest), so
        # "how many storage round trips does a ping cost" is read here, not guessed.
        self.request_crossings = Histogram("fleethub_http_request_storage_crossings",
                                           "Storage crossings made while handling one request, by route.",
                                           ["route"], buckets=CROSSINGS_BUCKETS, registry=self.registry)
        # Each series' child, kept once looked up: ``labels()`` validates and locks on every call, and
        # three of them on every request were more than the counting itself. The keys are bounded as
        # the series are (methods, statuses, routes).
        self._children: dict[tuple, Any] = {}
        self.device_connects = 0
        self.device_rejects = 0
        self.frames_refused = 0  # device frames over the link's limit, closed with 1009 (hub/frames.py)
        self.refused_frames: dict = {}  # device id -> hub.frames.Refusals (the first LABELLED_DEVICES)
        self.device_link_waits = 0  # times a link stopped reading its device until its actor had room
        self.cluster_takeovers = 0  # links closed because another cluster node took the device (hub/cluster/)
        self.cluster_dead_nodes = 0  # silent nodes this node found, whose devices it marked offline
        self._collector = _HubCollector(self)
        self.registry.register(self._collector)
        ProcessCollector(registry=self.registry)

    def frame_refused(self, device_id, frame: str, size: int, at) -> None:
        """The link refused a frame of this device as too big (hub/frames.py)."""
        from hub.frames import LABELLED_DEVICES, Refusals

        entry = self.refused_frames.get(device_id)
        if entry is None:
            entry = Refusals()
            if len(self.refused_frames) < LABELLED_DEVICES:
                self.refused_frames[device_id] = entry
        entry.count += 1
        entry.last_at, entry.last_frame, entry.last_bytes = at, frame, size
        self.frames_refused += 1

    def observe_request(self, method: str, status: int, seconds: float | None = None, *,
                        route: str | None = None, crossings: int | None = None) -> None:
        # The method is the client's text: any other word is "other", or each new one would be a new
        # series (and 15 latency buckets) kept for the life of the process.
        method = method if method in _METHODS else "other"
        children = self._children
        counted = children.get(("requests", method, status))
        if counted is None:
            counted = children[("requests", method, status)] = self.requests.labels(method, str(status))
        counted.inc()
        if seconds is not None:
            timed = children.get(("seconds", method))
            if timed is None:
                timed = children[("seconds", method)] = self.request_seconds.labels(method)
            timed.observe(seconds)
        if crossings is not None:
            crossed = children.get(("crossings", method, route))
            if crossed is None:
                crossed = children[("crossings", method, route)] = self.request_crossings.labels(
                    f"{method} {route}" if route else "unmatched")
            crossed.observe(crossings)

    def render(self, services: "Services") -> str:
        # The collector reads this hub's services at scrape time (Services owns this Metrics).
        self._collector.services = services
        return generate_latest(self.registry).decode()


def _histogram(name: str, help_: str, stats) -> HistogramMetricFamily:
    """A storage/db.py ``CrossingStats`` (cumulative bucket counts) as a Prometheus histogram."""
    buckets = [(floatToGoString(bound), count) for bound, count in zip(stats.bounds, stats.buckets)]
    buckets.append(("+Inf", stats.count))
    return HistogramMetricFamily(name, help_, buckets=buckets, sum_value=stats.total_seconds)


def family(kind, name: str, help_: str, value=None, *, labels: list[str] | None = None, samples=()):
    made = kind(name, help_, value=value, labels=labels) if labels is None else kind(name, help_, labels=labels)
    for label_values, v in samples:
        made.add_metric(label_values, v)
    return made


def _loop_stalls():
    """The event loop's stalls (device_client/shared/loopwatch.py); nothing when the watch is off."""
    watch = loopwatch.current()
    if watch is None:
        return
    stalls = watch.stalls
    yield family(CounterMetricFamily, "fleethub_event_loop_stalls",
                 f"Times the trio thread ran no task for {stalls.threshold:g} s or more (FLEETHUB_LOOP_STALL_SECONDS); "
                 "each is logged with the stack that held it.", stalls.count)
    yield family(CounterMetricFamily, "fleethub_event_loop_stall_seconds",
                 "Seconds the trio thread was held by those stalls.", round(stalls.seconds, 6))
    yield family(GaugeMetricFamily, "fleethub_event_loop_longest_stall_seconds",
                 "The longest stall since the process started.", round(stalls.longest, 6))


class _HubCollector:
    """Values owned elsewhere, read when /metrics is scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.services: "Services | None" = None

    def describe(self):
        return []  # names unknown until the first scrape: nothing to check for clashes at register time

    def collect(self):
        services, m = self.services, self.metrics
        if services is None:
            return
        G, C = GaugeMetricFamily, CounterMetricFamily
        # CounterMetricFamily names are given without ``_total``: it adds the suffix itself.
        yield family(G, "fleethub_connected_devices", "Devices with a live WebSocket link to this process.",
                      len(services.links))
        yield family(C, "fleethub_device_connects", "Device links accepted.", m.device_connects)
        yield from services.topology.metric_families()  # a cluster node's (hub/cluster/topology.py)
        yield family(C, "fleethub_device_rejects", "Device link handshakes refused.", m.device_rejects)
        yield from _loop_stalls()
        reg = services.registry.statistics()
        yield family(G, "fleethub_actors", "Live actors by kind.", labels=["kind"],
                      samples=[([k], n) for k, n in sorted(reg["by_kind"].items())] or [(["none"], 0)])
        sup = services.registry.supervisor.statistics()
        yield family(G, "fleethub_actors_running",
                      "Actors with a task now (handling messages or deadlines, or idle for under a second).",
                      sup["running"])
        yield family(G, "fleethub_actors_parked",
                      "Actors parked now: their state in memory, no task; a message or the shared timer wakes them.",
                      sup["parked"])
        yield family(C, "fleethub_actor_wakes", "Tasks started for parked actors.", sup["wakes"])
        yield family(C, "fleethub_actor_restarts", "Actor restarts by the supervisor.", reg["restarts"])
        yield family(C, "fleethub_actors_given_up",
                      "Actors stopped past their crash budget (then started fresh at their next message).",
                      reg["given_up"])
        yield family(C, "fleethub_actor_storage_waits",
                      "Times an actor found PostgreSQL unreachable and waited to retry (not counted as a crash).",
                      reg["storage_waits"])
        yield family(G, "fleethub_actor_mailbox_depth_max", "Deepest actor mailbox right now.",
                      reg["mailbox_depth_max"])
        db = services.db
        yield _histogram("fleethub_storage_crossing_seconds",
                         "Time of one trio-to-asyncpg crossing, less any wait for a pooled connection.",
                         db.stats)
        yield _histogram("fleethub_storage_pool_wait_seconds",
                         "Time a crossing waited for a pooled connection (a full pool, or a reconnect).",
                         db.pool_wait_stats)
        # Every outbox (storage/behind.py): writes that wait out a PostgreSQL outage, one kind each.
        outboxes = [("presence", services.presence), ("audit", services.audit_log),
                    ("active_device", services.meter.active_writer), ("metering", services.meter.sums),
                    ("tunnel_usage", services.tunnels.unrecorded)]
        yield family(C, "fleethub_write_behind_rows", "Rows written behind.", labels=["kind"],
                      samples=[([k], w.written) for k, w in outboxes])
        yield family(C, "fleethub_write_behind_set_aside",
                      "Rows the database refused on their own (the rest of their batch was written); see the log.",
                      labels=["kind"], samples=[([k], w.set_aside) for k, w in outboxes])
        yield family(C, "fleethub_write_behind_dropped",
                      "Rows dropped because the write-behind buffer was full while the database was away.",
                      labels=["kind"], samples=[([k], w.dropped) for k, w in outboxes])
        yield family(G, "fleethub_write_behind_pending", "Rows waiting to be written behind.", labels=["kind"],
                      samples=[([k], w.pending()) for k, w in outboxes])
        yield family(C, "fleethub_audit_answered_unwritten",
                      "API calls answered with their audit row neither in PostgreSQL nor in the local journal "
                      "(the disk refused it, or the journal is off): those rows are written behind.",
                      services.audit_log.unconfirmed)
        yield family(C, "fleethub_audit_journaled",
                      "API calls whose audit row PostgreSQL had not confirmed in time: answered once the row "
                      "was fsync'd to the local journal (storage/journal.py), written to PostgreSQL after.",
                      services.audit_log.journaled)
        yield family(C, "fleethub_device_link_waits",
                      "Times a device link stopped reading its socket until the device's actor had room "
                      "(back-pressure).", m.device_link_waits)
        yield family(C, "fleethub_device_frames_refused",
                      "Device frames over the link's limit: the link was closed with 1009 and the reason.",
                      m.frames_refused)
        yield family(C, "fleethub_device_frames_refused_by_device",
                      "Device frames over the link's limit, per device (the first 1000 devices that sent one).",
                      labels=["device_id"],
                      samples=[([str(d)], r.count) for d, r in sorted(m.refused_frames.items(), key=str)])
        yield family(G, "fleethub_event_subscribers", "SSE subscribers.", services.events.subscriber_count())
        journal = services.journal  # the event log's writer (hub/eventlog.py)
        yield family(C, "fleethub_event_log_appended", "Device events appended to the event log.", journal.appended)
        yield family(G, "fleethub_event_log_pending", "Device events waiting to be appended to the event log.",
                      journal.pending())
        yield family(C, "fleethub_event_log_dropped",
                      "Device events dropped because the event log's queue was full while PostgreSQL was away.",
                      journal.dropped)
        yield family(C, "fleethub_event_log_set_aside", "Device events PostgreSQL refused on their own; see the log.",
                      journal.set_aside)
        deliverer = services.deliverer  # hub/webhooks/worker.py (None with the event log off)
        yield family(C, "fleethub_webhook_deliveries", "Webhook delivery attempts of this node, by outcome.",
                      labels=["outcome"], samples=[(["delivered"], deliverer.delivered if deliverer else 0),
                                                   (["failed"], deliverer.failed if deliverer else 0)])
        yield family(G, "fleethub_webhook_endpoints_served", "Webhook endpoints whose lease this node holds.",
                      len(deliverer.running) if deliverer else 0)
        throttle = services.access.login_throttle
        yield family(G, "fleethub_login_throttle_keys", "Accounts and addresses the login throttle holds.",
                      len(throttle))
        yield family(C, "fleethub_login_throttle_dropped",
                      "Login-throttle entries forgotten while still live because the table was full.",
                      throttle.dropped)
