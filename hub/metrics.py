"""Prometheus text exposition for /metrics: counters kept here, gauges read from the services."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from storage.db import CROSSING_BUCKETS

if TYPE_CHECKING:
    from hub.services import Services


def _number(value: float) -> str:
    """Exact integers (``:g`` would print 1234567 as 1.23457e+06), floats in full."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Metrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()  # (method, status) -> count
        self.device_connects = 0
        self.device_rejects = 0
        self.frames_refused = 0  # device frames over the link's limit, closed with 1009 (hub/frames.py)
        self.refused_frames: dict = {}  # device id -> hub.frames.Refusals (the first LABELLED_DEVICES)
        self.device_link_waits = 0  # times a link stopped reading its device until its actor had room

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

    def observe_request(self, method: str, status: int) -> None:
        self.requests[(method, status)] += 1

    def render(self, services: "Services") -> str:
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)

        metric("fleethub_connected_devices", "gauge", "Devices with a live WebSocket link to this process.",
               [("", len(services.links))])
        metric("fleethub_device_connects_total", "counter", "Device links accepted.",
               [("", self.device_connects)])
        metric("fleethub_device_rejects_total", "counter", "Device link handshakes refused.",
               [("", self.device_rejects)])
        metric("fleethub_http_requests_total", "counter", "HTTP requests by method and status.",
               [(f'{{method="{m}",status="{s}"}}', n) for (m, s), n in sorted(self.requests.items())])
        reg = services.registry.statistics()
        metric("fleethub_actors", "gauge", "Live actors by kind.",
               [(f'{{kind="{k}"}}', n) for k, n in sorted(reg["by_kind"].items())] or [('{kind="none"}', 0)])
        metric("fleethub_actor_restarts_total", "counter", "Actor restarts by the supervisor.",
               [("", reg["restarts"])])
        metric("fleethub_actor_storage_waits_total", "counter",
               "Times an actor found PostgreSQL unreachable and waited to retry (not counted as a crash).",
               [("", reg["storage_waits"])])
        tunnels = services.tunnels
        metric("fleethub_tunnel_usage_unrecorded", "gauge",
               "Tunnel sessions whose device usage report waits for PostgreSQL to come back.",
               [("", tunnels.usage_unrecorded())])
        metric("fleethub_tunnel_usage_dropped_total", "counter",
               "Tunnel usage reports dropped while PostgreSQL was away (too many sessions waiting).",
               [("", tunnels.usage_dropped)])
        metric("fleethub_actor_mailbox_depth_max", "gauge", "Deepest actor mailbox right now.",
               [("", reg["mailbox_depth_max"])])
        st = services.db.stats
        # The buckets are already cumulative: observe() counts a crossing in every bound it is under.
        samples = [(f'_bucket{{le="{bound:g}"}}', count) for bound, count in zip(CROSSING_BUCKETS, st.buckets)]
        samples += [('_bucket{le="+Inf"}', st.count), ("_sum", st.total_seconds), ("_count", st.count)]
        out.append("# HELP fleethub_storage_crossing_seconds Time of one trio-to-asyncpg crossing.")
        out.append("# TYPE fleethub_storage_crossing_seconds histogram")
        out.extend(f"fleethub_storage_crossing_seconds{suffix} {_number(value)}" for suffix, value in samples)
        writers = [("presence", services.presence), ("audit", services.audit_log),
                   ("active_device", services.meter.active_writer)]
        # Metering sums (hub/metering.py) are batched too; they merge per key, so none is ever dropped.
        batched = writers + [("metering", services.meter)]
        metric("fleethub_write_behind_rows_total", "counter", "Rows written behind.",
               [(f'{{kind="{k}"}}', w.written) for k, w in batched])
        metric("fleethub_write_behind_set_aside_total", "counter",
               "Rows the database refused on their own (the rest of their batch was written); see the log.",
               [(f'{{kind="{k}"}}', w.set_aside) for k, w in batched])
        metric("fleethub_write_behind_dropped_total", "counter",
               "Rows dropped because the write-behind buffer was full while the database was away.",
               [(f'{{kind="{k}"}}', w.dropped) for k, w in writers])
        metric("fleethub_write_behind_pending", "gauge", "Rows waiting to be written behind.",
               [(f'{{kind="{k}"}}', w.pending()) for k, w in batched])
        metric("fleethub_device_link_waits_total", "counter",
               "Times a device link stopped reading its socket until the device's actor had room (back-pressure).",
               [("", self.device_link_waits)])
        metric("fleethub_device_frames_refused_total", "counter",
               "Device frames over the link's limit: the link was closed with 1009 and the reason.",
               [("", self.frames_refused)])
        metric("fleethub_device_frames_refused_by_device_total", "counter",
               "Device frames over the link's limit, per device (the first 1000 devices that sent one).",
               [(f'{{device_id="{d}"}}', r.count) for d, r in sorted(self.refused_frames.items(), key=str)])
        metric("fleethub_event_subscribers", "gauge", "SSE subscribers.", [("", services.events.subscriber_count())])
        throttle = services.login_throttle
        metric("fleethub_login_throttle_keys", "gauge", "Accounts and addresses the login throttle holds.",
               [("", len(throttle))])
        metric("fleethub_login_throttle_dropped_total", "counter",
               "Login-throttle entries forgotten while still live because the table was full.",
               [("", throttle.dropped)])
        return "\n".join(out) + "\n"
