"""What an agent is told at its start: ``AgentConfig``, one frozen value ``Agent(config)`` takes.

The options are the device's (its hub, token and data directory; how it reboots; its tunnels, memory
tester and workload account) and the link's (backoff, timeouts, frame limit). A few fields are
collaborators rather than options, passed in so that the launcher or a test decides them: the clock,
the random source of the backoff, a limiter shared by many simulated agents, an in-memory connector
and the tunnel engine (webrtc sits above device_client, so the launcher hands it in). Every default
here is the one the agent's constructor had.

Everything is checked when the config is made, so a typo in a hub URL fails at start and not at the
first failover. The token is left out of the repr: a config may be logged, a secret may not.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncContextManager, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

from .shared import protocol
from .shared.clock import Clock
from .shared.linkcodes import SUPERSEDED_BACKOFF
from .shared.paths import PLATFORM_DIR

if TYPE_CHECKING:  # types only: the config module loads none of the parts
    import trio

    from .context import DeviceContext
    from .memtest.tester import MemtestConfig
    from .tunnel import TunnelConfig
    from .workload_account import RunAs
    from .engine.base import Engine

# (the device's context, its TunnelConfig or None) -> the tunnel part; webrtc/device_tunnel.py ``attach``
TunnelEngine = Callable[["DeviceContext", "TunnelConfig | None"], Any]
# (the link's headers) -> async context manager of a trio-websocket connection (tests' in-memory hub)
Connector = Callable[[list[tuple[bytes, bytes]]], AsyncContextManager[Any]]

REBOOT_MODES = ("restart", "exec")


def link_url(hub_url: str) -> str:
    """``http://host:port`` → ``ws://host:port/v1/device/link`` (https → wss)."""
    parts = urlsplit(hub_url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(f"hub URL must be http(s)://host[:port], got {hub_url!r}")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + protocol.LINK_PATH, "", ""))


def hub_urls(hub_url: str | Sequence[str]) -> list[str]:
    """The hub URLs an agent may link to: one, a list, or a comma-separated string (several nodes of
    a cluster, docs/cluster.md); each checked now, so a typo fails at start and not at failover."""
    urls = [u.strip() for u in (hub_url.split(",") if isinstance(hub_url, str) else hub_url) if u.strip()]
    if not urls:
        raise ValueError("at least one hub URL is needed")
    for url in urls:
        link_url(url)
    return urls


def _checked_root(root: Path, data_dir: Path) -> Path:
    """A device root must be absolute, and the data dir (keys, tokens' state, manifests) must not lie
    in the part of it the hub writes or the workload owns: the platform directory."""
    if not root.is_absolute():
        raise ValueError(f"the device root must be an absolute path, got {str(root)!r}")
    platform = root / PLATFORM_DIR.lstrip("/")
    data = Path(os.path.abspath(data_dir))
    if data == platform or platform in data.parents:
        raise ValueError(f"the data dir {data} is inside the device's platform directory {platform}, where "
                         "the hub delivers files and the workload keeps its volumes: put it elsewhere "
                         "(docs/agent.md uses /var/lib/fleethub-agent)")
    return root


@dataclass(frozen=True)
class AgentConfig:
    hub_url: str | Sequence[str]  # one URL, several (a cluster's nodes) or a comma-separated string
    token: str = field(repr=False)
    data_dir: Path
    # where device paths land: None is <data_dir>/root, a sandbox for trying the agent out (and every
    # simulated device); "/" on a device in service, so /etc/app/key is the real /etc/app/key
    device_root: Path | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)  # firmware, architecture (hello); tags
    reboot_mode: str = "restart"  # restart: a new session in process (simulation); exec: re-execute
    # ---- the link ----
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    superseded_backoff: float = SUPERSEDED_BACKOFF  # seconds away after a 4001 (docs/device-protocol.md)
    connect_timeout: float = 10.0
    handshake_timeout: float = 10.0  # from the hello to the welcome
    max_frame_bytes: int = protocol.MAX_FRAME_BYTES
    ssl_context: Any = None
    # ---- the device's parts ----
    tunnel: TunnelConfig | None = None  # the targets; None: none configured
    memtest: MemtestConfig | None = None  # None: simulated defaults
    workload_user: RunAs | None = None  # the account the workload runs as; None: ours
    container_engine: Engine | None = None  # None: versions with containers are rejected (containers.py)
    image_budget: int = 2 << 30  # bytes of images kept, unused ones pruned oldest first past it
    registry_proxy: str = "fallback"  # off, fallback, always: when pulls go through the hub (pullroute.py)
    owner_for_all_files: tuple[int, int] | None = None  # a simulated device gives every file to one account
    ignore_owner: bool | None = None  # None: FLEETHUB_AGENT_IGNORE_OWNER decides (files.py)
    # ---- collaborators the launcher or a test passes in ----
    clock: Clock | None = None
    rng: random.Random | None = None  # the backoff's jitter
    connect_limiter: trio.CapacityLimiter | None = None  # bounds simultaneous handshakes of many agents
    connector: Connector | None = None  # None: a WebSocket to the hub's URL
    tunnel_engine: TunnelEngine | None = None  # None: no tunnels at all (device_client/agent.py)

    def __post_init__(self) -> None:
        if self.reboot_mode not in REBOOT_MODES:
            raise ValueError(f"reboot_mode must be 'restart' or 'exec', got {self.reboot_mode!r}")
        if self.tunnel is not None and self.tunnel_engine is None:
            # a wiring mistake: the targets would be configured and silently never served
            raise ValueError("a tunnel configuration needs a tunnel engine (tunnel_engine="
                             "webrtc.device_tunnel.attach)")
        hub_urls(self.hub_url)
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.device_root is not None:
            object.__setattr__(self, "device_root", _checked_root(Path(self.device_root), self.data_dir))
        object.__setattr__(self, "facts", dict(self.facts))  # a copy: the caller's dict may change later

    @property
    def hub_urls(self) -> list[str]:
        return hub_urls(self.hub_url)
