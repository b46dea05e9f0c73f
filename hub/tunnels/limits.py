"""An organisation's tunnel entitlement with the defaults applied, and the limit checks (pure).

An organisation without a tunnel_entitlements row was never entitled: sessions are disabled. A row
with NULL in a limit column takes the default below. Limits, as the spec's error table names them:

    max_sessions             open sessions in the organisation     429 too_many_sessions
    max_sessions_per_device  open sessions on one device           429 device_busy
    bandwidth_bps            bytes per second, each direction      429 limit_exceeded if asked for more
    max_session_seconds      total length of one session, renewals included
                                                                   429 limit_exceeded if asked for more

Defaults: 10 sessions per organisation, 2 per device, 50 MB/s (400 Mbit/s: the product path's aim
of 25 MB/s for scp must fit under it with room; the former 12.5 MB/s default was what an operator's
scp measured, 11-12 MB/s, bench/tunnel_product.py), 12 hours (AWS Secure Tunneling's cap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hub.errors import ClientError

DEFAULTS = {"max_sessions": 10, "max_sessions_per_device": 2, "bandwidth_bps": 50_000_000,
            "max_session_seconds": 12 * 3600}


class LimitHit(ClientError):
    """A tunnel limit was reached."""
    status = 429
    code = "limit_exceeded"


@dataclass(frozen=True)
class Entitlement:
    enabled: bool
    relay_allowed: bool
    max_sessions: int
    max_sessions_per_device: int
    bandwidth_bps: int
    max_session_seconds: int

    @classmethod
    def of(cls, row: dict[str, Any] | None) -> "Entitlement":
        row = row or {}
        return cls(enabled=bool(row.get("enabled", False)), relay_allowed=bool(row.get("relay_allowed", False)),
                   **{name: row.get(name) or default for name, default in DEFAULTS.items()})

    def view(self) -> dict[str, Any]:
        return {"sessions_enabled": self.enabled, "relay_allowed": self.relay_allowed,
                "limits": {"max_sessions": self.max_sessions,
                           "max_sessions_per_device": self.max_sessions_per_device,
                           "bandwidth_bps": self.bandwidth_bps,
                           "max_session_seconds": self.max_session_seconds},
                "defaults": dict(DEFAULTS)}

    def granted(self, bandwidth_bps: int | None, duration_seconds: int | None) -> tuple[int, int]:
        """What a session may have: the asked bandwidth and length, or the limits when not asked;
        asking for more than a limit is 429 limit_exceeded."""
        if bandwidth_bps is not None and bandwidth_bps > self.bandwidth_bps:
            raise LimitHit(f"bandwidth_bps {bandwidth_bps} is over the limit {self.bandwidth_bps}",
                           details={"limit": "bandwidth_bps", "max": self.bandwidth_bps})
        if duration_seconds is not None and duration_seconds > self.max_session_seconds:
            raise LimitHit(f"duration_seconds {duration_seconds} is over the limit {self.max_session_seconds}",
                           details={"limit": "max_session_seconds", "max": self.max_session_seconds})
        return bandwidth_bps or self.bandwidth_bps, duration_seconds or self.max_session_seconds


def slot_refused(which: str, ent: Entitlement) -> LimitHit:
    """The error for a limit storage reported reached while opening (storage/tunnels.py)."""
    if which == "too_many_sessions":
        return LimitHit(f"the organisation has {ent.max_sessions} open tunnel sessions, its limit",
                        code="too_many_sessions", details={"limit": "max_sessions", "max": ent.max_sessions})
    return LimitHit(f"the device has {ent.max_sessions_per_device} open tunnel sessions, its limit",
                    code="device_busy",
                    details={"limit": "max_sessions_per_device", "max": ent.max_sessions_per_device})
