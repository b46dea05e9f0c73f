"""FLEETHUB_* settings, read once at start into a frozen object (tests build their own)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


def _urls(name: str) -> tuple[str, ...]:
    """A comma-separated list of URLs (turn:host:port?transport=udp, stun:host:port)."""
    return tuple(u.strip() for u in os.environ.get(name, "").split(",") if u.strip())


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path(".fleethub")
    database_url: str | None = None  # None: start the embedded PostgreSQL in data_dir/pg
    host: str = "127.0.0.1"
    port: int = 8080
    # Devices send a heartbeat this often; one missed by 3 intervals marks the device offline.
    heartbeat_interval: float = 30.0
    # How long a REST call waits for a device to answer a command before 504 device_timeout.
    command_timeout: float = 10.0
    # A rebooting device that has not come back after this long is offline.
    reboot_timeout: float = 300.0
    # A rollout sends its version again to a device that shows no sign of it after this long (issue 38).
    rollout_resend_after: float = 15.0
    log_level: str = "INFO"
    db_pool_max: int = 10
    # Bounds on every storage call (storage/db.py), so that a database that does not answer (down,
    # frozen, unreachable) costs a request 503 database_unavailable within seconds, not a hang:
    # opening a connection; one statement, enforced by PostgreSQL (statement_timeout); and the whole
    # call (waiting for a pooled connection, its statements, the commit), enforced by the hub, which
    # then drops the connection. Migrations are not bounded.
    db_connect_timeout: float = 3.0
    db_statement_timeout: float = 4.0
    db_call_timeout: float = 4.5
    # An API call's answer waits until its audit row is written (storage/behind.py append_written), at
    # most db_call_timeout, so a process killed right after answering loses no row (docs/cluster.md).
    # Off: written behind, up to a second after the answer (what bench/audit_durability.py compares).
    audit_durable: bool = True
    # How long that answer waits for PostgreSQL before it takes the row's fsync to the local journal
    # instead (storage/journal.py; a frozen database then costs an answer this, not the call bound).
    audit_journal_after: float = 1.0
    # TLS: with both set the hub serves HTTPS (HTTP/1.1 and HTTP/2) on port and HTTP/3 over QUIC on
    # quic_port (UDP; default the same number as port).
    certfile: Path | None = None
    keyfile: Path | None = None
    quic_port: int | None = None
    # The assistant (docs/assistant.md): off answers 503; on with no upstream uses the built-in
    # responder. Prices are USD per million tokens, for the staff cost view only.
    assistant_enabled: bool = True
    assistant_upstream: str | None = None
    assistant_key: str | None = field(default=None, repr=False)
    assistant_model: str | None = None
    assistant_timeout: float = 60.0
    assistant_monthly_tokens: int = 2_000_000
    assistant_daily_user_tokens: int = 200_000
    assistant_price_prompt: float = 0.0
    assistant_price_completion: float = 0.0
    # Tunnels (hub/tunnels/): off answers 503 on /v1/cli/tunnel/*. A grant is good for
    # tunnel_grant_seconds; the CLI renews before then. TURN credentials are handed out only when
    # both turn_urls and turn_secret are set (coturn --use-auth-secret --static-auth-secret=...).
    tunnels_enabled: bool = True
    tunnel_grant_seconds: float = 600.0
    stun_urls: tuple[str, ...] = ()
    turn_urls: tuple[str, ...] = ()
    turn_secret: str | None = field(default=None, repr=False)
    # Graceful shutdown: devices are told to reconnect within drain_window seconds, to successor_url
    # when it names another hub (else the same URL, which a restarted hub or a balancer answers).
    drain_window: float = 10.0
    successor_url: str | None = None
    # A cluster (docs/cluster.md): with a NATS URL (and a shared database_url) this process is one node
    # of several; node_id names it (generated when unset). Without it: one process, the in-process bus.
    nats_url: str | None = None
    node_id: str | None = None
    # A node renews its rollout leases every third of this; a dead node's rollouts move after it.
    rollout_lease_seconds: float = 10.0
    # A node renews its liveness row every third of this; a node silent longer is dead and the devices
    # whose link it held are marked offline (hub/cluster/nodes.py).
    node_lease_seconds: float = 10.0
    # Registries (host[:port]) the hub may ask for image manifests whatever address they have; any other
    # registry must resolve to public addresses only (hub/images.py, docs/containers.md).
    registries: tuple[str, ...] = ()
    # How many reverse proxies stand in front of the hub: the client's address and scheme are then taken
    # from the X-Forwarded-For/-Proto entry the outermost of them wrote (hub/proxied.py). 0: none, the
    # peer is the client (a client could write those headers itself).
    trusted_proxy_hops: int = 0
    # The registry proxy's disk budget (hub/registry/cache.py), under data_dir/registry-cache.
    registry_cache_mib: int = 10240
    # Seconds added to this process's wall clock: the fault suite's clock skew between nodes
    # (tests/cluster/faults/). Never set in production; a node logs a warning when it is.
    test_clock_offset: float = 0.0
    # The event log (docs/events.md): off only to measure what it costs (no cursors, no replay, no
    # webhooks). Events older than event_retention_days are pruned. Webhook endpoints may be private
    # or loopback addresses only when webhooks_allow_private is set (tests, a closed network).
    event_log: bool = True
    event_retention_days: float = 7.0
    webhooks_allow_private: bool = False
    # How long a node's lease on a webhook endpoint lasts unless renewed (every third of it): a killed
    # node's endpoints move to another node within it (hub/webhooks/worker.py).
    webhook_lease_seconds: float = 30.0
    extra: dict = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.certfile is not None and self.keyfile is not None

    @property
    def heartbeat_timeout(self) -> float:
        return 3 * self.heartbeat_interval

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        values = dict(
            data_dir=Path(os.environ.get("FLEETHUB_DATA_DIR", ".fleethub")),
            database_url=os.environ.get("FLEETHUB_DATABASE_URL") or None,
            host=os.environ.get("FLEETHUB_HOST", "127.0.0.1"),
            port=int(os.environ.get("FLEETHUB_PORT", "8080")),
            heartbeat_interval=_float("FLEETHUB_HEARTBEAT_INTERVAL", 30.0),
            command_timeout=_float("FLEETHUB_COMMAND_TIMEOUT", 10.0),
            reboot_timeout=_float("FLEETHUB_REBOOT_TIMEOUT", 300.0),
            rollout_resend_after=_float("FLEETHUB_ROLLOUT_RESEND_AFTER", 15.0),
            log_level=os.environ.get("FLEETHUB_LOG_LEVEL", "INFO"),
            db_pool_max=int(os.environ.get("FLEETHUB_DB_POOL_MAX", "10")),
            db_connect_timeout=_float("FLEETHUB_DB_CONNECT_TIMEOUT", 3.0),
            db_statement_timeout=_float("FLEETHUB_DB_STATEMENT_TIMEOUT", 4.0),
            db_call_timeout=_float("FLEETHUB_DB_CALL_TIMEOUT", 4.5),
            audit_durable=os.environ.get("FLEETHUB_AUDIT_DURABLE", "on").lower() not in ("off", "0", "false", "no"),
            audit_journal_after=_float("FLEETHUB_AUDIT_JOURNAL_AFTER", 1.0),
            drain_window=_float("FLEETHUB_DRAIN_WINDOW", 10.0),
            successor_url=os.environ.get("FLEETHUB_SUCCESSOR_URL") or None,
            nats_url=os.environ.get("FLEETHUB_NATS_URL") or None,
            node_id=os.environ.get("FLEETHUB_NODE_ID") or None,
            rollout_lease_seconds=_float("FLEETHUB_ROLLOUT_LEASE_SECONDS", 10.0),
            node_lease_seconds=_float("FLEETHUB_NODE_LEASE_SECONDS", 10.0),
            event_log=os.environ.get("FLEETHUB_EVENT_LOG", "1").lower() not in ("off", "0", "false", "no"),
            event_retention_days=_float("FLEETHUB_EVENT_RETENTION_DAYS", 7.0),
            webhooks_allow_private=os.environ.get("FLEETHUB_WEBHOOKS_ALLOW_PRIVATE", "0").lower()
            in ("1", "true", "yes", "on"),
            webhook_lease_seconds=_float("FLEETHUB_WEBHOOK_LEASE_SECONDS", 30.0),
            trusted_proxy_hops=int(os.environ.get("FLEETHUB_TRUSTED_PROXY_HOPS", "0")),
            certfile=Path(os.environ["FLEETHUB_CERTFILE"]) if os.environ.get("FLEETHUB_CERTFILE") else None,
            keyfile=Path(os.environ["FLEETHUB_KEYFILE"]) if os.environ.get("FLEETHUB_KEYFILE") else None,
            quic_port=int(os.environ["FLEETHUB_QUIC_PORT"]) if os.environ.get("FLEETHUB_QUIC_PORT") else None,
            assistant_enabled=os.environ.get("FLEETHUB_ASSISTANT", "on").lower() not in ("off", "0", "false", "no"),
            assistant_upstream=os.environ.get("FLEETHUB_ASSISTANT_UPSTREAM") or None,
            assistant_key=os.environ.get("FLEETHUB_ASSISTANT_KEY") or None,
            assistant_model=os.environ.get("FLEETHUB_ASSISTANT_MODEL") or None,
            assistant_timeout=_float("FLEETHUB_ASSISTANT_TIMEOUT", 60.0),
            assistant_monthly_tokens=int(os.environ.get("FLEETHUB_ASSISTANT_MONTHLY_TOKENS", "2000000")),
            assistant_daily_user_tokens=int(os.environ.get("FLEETHUB_ASSISTANT_DAILY_USER_TOKENS", "200000")),
            assistant_price_prompt=_float("FLEETHUB_ASSISTANT_PRICE_PROMPT", 0.0),
            assistant_price_completion=_float("FLEETHUB_ASSISTANT_PRICE_COMPLETION", 0.0),
        )
        values.update(
            tunnels_enabled=os.environ.get("FLEETHUB_TUNNELS", "on").lower() not in ("off", "0", "false", "no"),
            tunnel_grant_seconds=_float("FLEETHUB_TUNNEL_GRANT_SECONDS", 600.0),
            stun_urls=_urls("FLEETHUB_STUN_URLS"),
            turn_urls=_urls("FLEETHUB_TURN_URLS") or _urls("FLEETHUB_TURN_URL"),
            turn_secret=os.environ.get("FLEETHUB_TURN_SECRET") or None,
            registries=tuple(r.strip() for r in os.environ.get("FLEETHUB_REGISTRIES", "").split(",") if r.strip()),
            registry_cache_mib=int(os.environ.get("FLEETHUB_REGISTRY_CACHE_MIB", "10240")),
            test_clock_offset=_float("FLEETHUB_TEST_CLOCK_OFFSET", 0.0),
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
