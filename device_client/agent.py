"""The device agent: keeps one WebSocket to the hub up for as long as the device runs.

A link lives through: connect (``Authorization: Bearer <token>``) → ``hello`` → ``welcome`` →
heartbeats and commands until the socket drops → reconnect with full-jitter exponential backoff
(the link's methods: agentlink.py, around the protocol of device_client/link/). Commands are answered by verb handlers (``Agent.register``); replies are remembered by command id so
a command the hub sends twice runs once (commands.py). A reboot is a boot: the agent stops the
workload, persists the reason, closes the link and either restarts its session in process
(simulation) or re-executes itself.

The agent is also where the device's parts meet: secret files (files.py), the workload
(workload.py) and configuration versions (configs.py) register their verbs, hello fields and
boot/link/shutdown hooks here. Run it with ``fleethub agent`` (hub/cli.py).

Tunnels are the one part passed in: their engine needs webrtc, a layer above this package, so the
launcher gives it as ``tunnel_engine`` (``webrtc.device_tunnel.attach``) with the device's
``TunnelConfig`` (tunnel.py). An agent built without one has no tunnels and says so: no
``capabilities.tunnel``, no ``tunnelTargets`` in its hello (the hub refuses every target with 404
target_not_configured before it asks) and no tunnel verbs (unknown_command, which the hub answers
as 409 device_unsupported).
"""

from __future__ import annotations

import base64
import functools
import logging
import os
import platform
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncContextManager, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

import trio
from trio_websocket import open_websocket_url

from . import protocol
from .clock import Clock, rfc3339
from . import linkctl
from .linkcodes import SUPERSEDED_BACKOFF
from .commands import CommandError, CommandTable, Handler, Hook, Hooks, current_command
from .configs import ConfigManager
from .files import SecretFileStore
from .backoff import Backoff
from .agentlink import _LINK_ERRORS, LinkShell
from .link.deviceside import MIN_HEARTBEAT  # noqa: F401  (kept importable from here)
from .linkframes import FrameGuard
from .memtest import MemtestConfig
from .memtest import attach as attach_memtest
from .registry_proxy import RegistryProxy
from .telemetry import Telemetry
from .state import DeviceStore
from .tunnel import TunnelConfig
from .workload import RunAs, Workload

log = logging.getLogger("fleethub.agent")

# (agent, its TunnelConfig or None) -> what becomes agent.tunnel; webrtc/device_tunnel.py ``attach``
TunnelEngine = Callable[["Agent", "TunnelConfig | None"], Any]

REBOOT_PAUSE = 0.2  # seconds "powered off" during an in-process reboot
_BOOT_REASON = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def _agent_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleethub")
    except PackageNotFoundError:  # running from a source tree
        return "0.1.0"


AGENT_VERSION = _agent_version()


@functools.cache
def _default_firmware() -> str:
    try:
        return platform.freedesktop_os_release()["PRETTY_NAME"]
    except (OSError, KeyError):
        return platform.platform()


@dataclass(frozen=True)
class AgentStatistics:
    device_id: str | None
    connected: bool
    boot_count: int
    boot_reason: str | None
    links: int  # welcomes received
    link_failures: int  # connects or links that ended in an error
    heartbeats_sent: int
    commands_handled: int  # replies sent, duplicates included
    duplicate_commands: int
    last_error: str | None


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


class Agent(LinkShell):
    def __init__(self, hub_url: str | Sequence[str], token: str, data_dir: Path, *, clock: Clock | None = None,
                 facts: dict[str, Any] | None = None, reboot_mode: str = "restart",
                 backoff_initial: float = 0.5, backoff_max: float = 30.0,
                 connect_limiter: trio.CapacityLimiter | None = None, connect_timeout: float = 10.0,
                 handshake_timeout: float = 10.0, ssl_context: Any = None,
                 rng: random.Random | None = None, ignore_owner: bool | None = None,
                 tunnel: TunnelConfig | None = None, tunnel_engine: TunnelEngine | None = None,
                 memtest: MemtestConfig | None = None,
                 workload_user: RunAs | None = None, owner_for_all_files: tuple[int, int] | None = None,
                 max_frame_bytes: int = protocol.MAX_FRAME_BYTES,
                 superseded_backoff: float = SUPERSEDED_BACKOFF,
                 connector: Callable[[list[tuple[bytes, bytes]]], AsyncContextManager[Any]] | None = None) -> None:
        if reboot_mode not in ("restart", "exec"):
            raise ValueError(f"reboot_mode must be 'restart' or 'exec', got {reboot_mode!r}")
        if tunnel is not None and tunnel_engine is None:
            # a wiring mistake: the targets would be configured and silently never served
            raise ValueError("a tunnel configuration needs a tunnel engine (tunnel_engine="
                             "webrtc.device_tunnel.attach)")
        # Several URLs (nodes of a cluster): a link that fails before its welcome moves on to the next,
        # so the devices of a node that died come back through the others (``_fail_over``).
        self.hub_urls = hub_urls(hub_url)
        self.hub_url = self.hub_urls[0]
        self.link_url = link_url(self.hub_url)
        self.data_dir = Path(data_dir)
        self.store = DeviceStore(self.data_dir)
        self.root = self.store.root  # the device's filesystem for files the hub delivers
        self.clock = clock or Clock()
        self.facts = dict(facts or {})  # firmware, architecture, tags; tags have no hello field yet
        self.reboot_mode = reboot_mode
        self.capabilities = protocol.Capabilities(
            memoryTest=protocol.MemoryTestCapabilities(
                online=False, offline=False,
                offlineReason="memory tests are not installed on this agent yet"),
            reboot=True)
        self.device_id: str | None = None
        self.hub_keys: dict[str, str] = {}  # welcome.hubKeys: kid -> public key that signs tunnel grants
        self.nursery: trio.Nursery | None = None  # lives as long as run(): for work that outlives a link
        self.connected = False
        self.boot_count = 0
        self.boot_reason: str | None = None
        self.signing_key = None  # nacl SigningKey, loaded at boot
        self._auth = [(protocol.TOKEN_HEADER.lower().encode(), b"Bearer " + token.encode())]
        self.commands = CommandTable(on_idle=self._commands_answered)
        self.commands.register("ping", self._ping)
        self.commands.register("reboot", self._reboot)
        linkctl.attach(self)  # link.drain, link.keys
        self._reconnect_after: float | None = None  # set by link.drain: leave the link, come back then
        self.notices = 0  # link.notice commands: the hub refused something this device sent
        self.hooks = Hooks()
        self.frames = FrameGuard(self.data_dir, self.clock, max_frame_bytes)  # the link's frame limit
        self._backoff = Backoff(backoff_initial, backoff_max, rng)
        self._superseded_backoff = superseded_backoff
        self._closed_with: int | None = None  # the close code that ended the last link, if the hub sent one
        self._closed_reason: str | None = None  # and its reason (4004 states the drain window in it)
        self._limiter = connect_limiter
        self._limiter_held = False
        self._connect_timeout = connect_timeout
        self._handshake_timeout = handshake_timeout
        self._ssl_context = ssl_context
        # connector(headers) -> async context manager of a trio-websocket connection; None: the hub's URL
        self._connector = connector
        self._ws: Any = None
        self._scope: trio.CancelScope | None = None  # what a reboot request cancels
        self._connected_event = trio.Event()
        self._reboot_reason: str | None = None
        self._reboot_command: str | None = None
        self._reboot_persisted = False
        self._booted_at = 0.0
        self._link_welcomed = False
        self._link_error: BaseException | None = None
        self._on_first_welcome: Callable[[], None] | None = None
        self._stats = dict(links=0, link_failures=0, heartbeats_sent=0)
        self._last_error: str | None = None
        # the device's parts; the order of attach is the order of their boot hooks
        # workload_user: the account the workload runs as (None: ours); owner_for_all_files: a
        # simulated device gives every delivered file to that one account (device_client/sim.py)
        self.files = SecretFileStore(self.data_dir, self.root, ignore_owner=ignore_owner,
                                     owner_for_all=owner_for_all_files)
        self.workload = Workload(self.data_dir, self.root, run_as=workload_user)
        self.configs = ConfigManager(self.data_dir, self.files, self.workload, device_id=lambda: self.device_id)
        self.files.attach(self)
        # before the configuration: a test boot holds the workload before its boot hook starts it
        self.memtest = attach_memtest(self, memtest)  # memtest: a MemtestConfig (None: simulated defaults)
        self.configs.attach(self)  # and the workload: its health events, its stop at shutdown
        # tunnel: a tunnel.TunnelConfig (None: no targets); no tunnel_engine: no tunnels (module docstring)
        self.tunnel = tunnel_engine(self, tunnel) if tunnel_engine is not None else None
        self.telemetry = Telemetry(self.data_dir).attach(self)  # billing: telemetry.set, telemetry events
        self.registry_proxy = RegistryProxy(self.data_dir).attach(self)  # billing: registry.bytes reports

    # ---- the API other device modules use ----

    def register(self, verb: str, handler: Handler, *, replace: bool = False) -> None:
        """Answer commands ``cmd.<id>.<verb>`` with ``await handler(payload)`` (a dict, or None).

        Two modules claiming one verb is a wiring mistake, so that raises unless ``replace``."""
        self.commands.register(verb, handler, replace=replace)

    def add_hello_provider(self, provider: Callable[[], dict[str, Any]]) -> None:
        """``provider()`` returns hello fields (e.g. secretFileDigests) merged into every hello."""
        self.hooks.hello.append(provider)

    def add_boot_hook(self, hook: Hook) -> None:  # see commands.Hooks for when each kind runs
        self.hooks.boot.append(hook)

    def add_link_hook(self, hook: Hook) -> None:
        self.hooks.link.append(hook)

    def add_shutdown_hook(self, hook: Hook) -> None:
        self.hooks.shutdown.append(hook)

    def request_reconnect(self, after: float, url: str | None = None) -> None:
        """Leave the link once the replies being worked on are sent, and reconnect at a random moment
        within ``after`` seconds — to ``url`` when given (ValueError if it is not a hub URL)."""
        if url is not None:
            self.link_url, self.hub_url = link_url(url), url
        self._reconnect_after = after  # _commands_answered ends the link after this command's reply

    def _fail_over(self) -> None:
        """After a link that never got its welcome: the next hub URL of the list, in turn (the same one
        again when there is only one; a drain's successor URL stays until it fails too)."""
        if len(self.hub_urls) < 2:
            return
        current = self.hub_urls.index(self.hub_url) if self.hub_url in self.hub_urls else -1
        self.hub_url = self.hub_urls[(current + 1) % len(self.hub_urls)]
        self.link_url = link_url(self.hub_url)
        log.info("%s: trying the next hub, %s", self._who(), self.hub_url)

    def request_reboot(self, reason: str = "reboot") -> None:
        """Reboot once the replies being worked on are sent; the next hello reports ``reason``."""
        if self._reboot_reason is None:
            self._reboot_reason = reason
            self._reboot_command = current_command()
        if self.commands.inflight == 0 and self._scope is not None:
            self._scope.cancel()

    async def send_event(self, kind: str, payload: dict[str, Any] | None = None) -> bool:
        """Send an event now; False when there is no link (the next hello carries the state)."""
        ws = self._ws
        if ws is None:
            return False
        text = self.frames.encode_event(kind, payload or {})
        if text is None:
            return True  # too big even trimmed: dropped and recorded (linkframes.py), never to be resent
        try:
            await ws.send_message(text)
        except _LINK_ERRORS:
            return False
        return True

    def device_auth(self) -> dict[str, str]:
        """The device's credential for the hub's device HTTP endpoints (memory-test page maps)."""
        return {k.decode(): v.decode() for k, v in self._auth}

    @property
    def ssl_context(self) -> Any:
        return self._ssl_context

    async def wait_connected(self) -> None:
        await self._connected_event.wait()

    @property
    def public_key_b64(self) -> str | None:
        if self.signing_key is None:
            return None
        return base64.b64encode(bytes(self.signing_key.verify_key)).decode()

    def uptime(self) -> float:
        return self.clock.monotonic() - self._booted_at

    def statistics(self) -> AgentStatistics:
        return AgentStatistics(device_id=self.device_id, connected=self.connected,
                               boot_count=self.boot_count, boot_reason=self.boot_reason,
                               last_error=self._last_error,
                               commands_handled=self.commands.handled,
                               duplicate_commands=self.commands.duplicates, **self._stats)

    # ---- the link ----

    async def run(self, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
        """Run forever; ``task_status.started(self)`` after the first welcome."""
        try:
            async with trio.open_nursery() as nursery:
                self.workload.nursery = self.nursery = nursery  # supervises the workload's processes
                await self._boot()
                self._on_first_welcome = functools.partial(task_status.started, self)
                while True:
                    if self._reboot_reason is not None:
                        await self._restart()
                        continue
                    welcomed = await self._connect_once()
                    if self._reboot_reason is not None:
                        continue
                    if welcomed:
                        self._backoff.reset()
                    else:
                        self._fail_over()
                    delay = self._backoff.next_delay()
                    if self._reconnect_after is not None:
                        # drained by the hub: spread the reconnects over the window it gave
                        delay, self._reconnect_after = self._backoff.within(self._reconnect_after), None
                    else:
                        delay = self._after_close(delay)
                    log.debug("%s: reconnecting in %.2fs", self._who(), delay)
                    with trio.CancelScope() as self._scope:
                        await trio.sleep(delay)
                    self._scope = None
        finally:
            self.workload.nursery = self.nursery = None
            with trio.CancelScope(shield=True):
                await self.hooks.run(self.hooks.shutdown, self._who())

    def _open_link(self) -> AsyncContextManager[Any]:
        # here, not in agentlink.py: tests replace this module's open_websocket_url
        if self._connector is not None:  # a test's in-memory hub (tests/device_client/device_fakehub.py)
            return self._connector(self._auth)
        return open_websocket_url(self.link_url, self._ssl_context, extra_headers=self._auth,
                                  max_message_size=protocol.MAX_FRAME_BYTES, connect_timeout=self._connect_timeout,
                                  disconnect_timeout=5)

    def _hello(self) -> dict[str, Any]:
        fields: dict[str, Any] = dict(
            agentVersion=AGENT_VERSION,
            firmware=str(self.facts.get("firmware") or _default_firmware())[:protocol.FACT_MAX],
            architecture=str(self.facts.get("architecture") or platform.machine())[:protocol.FACT_MAX],
            capabilities=self.capabilities,
            bootReason=self.boot_reason or "power_on",
            deviceClock=rfc3339(self.clock.now()),
            tunnelPublicKey=self.public_key_b64,
        )
        return {**fields, **self.hooks.hello_fields()}

    def _who(self) -> str:
        return f"device {self.device_id}" if self.device_id else f"agent {self.data_dir.name}"

    # ---- commands ----

    def _commands_answered(self) -> None:
        # a requested reboot waits until every reply being worked on has been sent
        if (self._reboot_reason is not None or self._reconnect_after is not None) and self._scope is not None:
            self._scope.cancel()

    async def _ping(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"pong": True, "deviceClock": rfc3339(self.clock.now())}

    async def _reboot(self, payload: dict[str, Any]) -> dict[str, Any]:
        reason = payload.get("reason", "reboot")
        if not isinstance(reason, str) or not _BOOT_REASON.match(reason):
            raise CommandError("invalid_payload", "reason must be a short snake_case word")
        self.request_reboot(reason)
        result = {"rebooting": True}
        # Stored before the reply leaves (docs/device-protocol.md, "Reboot"): a device that loses power
        # between its reply and the restart still boots with this reason, and answers the hub's resend
        # of this command from what it stored instead of rebooting twice.
        await self._persist_reboot(protocol.Reply(id=self._reboot_command, ok=True, payload=result)
                                   if self._reboot_command else None)
        return result

    # ---- boots ----

    async def _boot(self) -> None:
        self._booted_at = self.clock.monotonic()
        boot = await trio.to_thread.run_sync(self.store.boot)
        self.signing_key, self.boot_reason, self.boot_count = boot.key, boot.reason, boot.count
        self._reboot_reason, self._reboot_command, self._reboot_persisted = None, None, False
        # a boot forgets what was in memory, except the reply to the reboot command itself: a hub
        # that resends it after the reconnect must not reboot the device a second time
        self.commands.forget()
        if boot.reboot_reply:
            self.commands.remember(boot.reboot_reply["commandId"],
                                   protocol.Reply.model_validate(boot.reboot_reply["reply"]))
        await self.hooks.run(self.hooks.boot, self._who())

    async def _persist_reboot(self, reply: protocol.Reply | None = None) -> None:
        if self._reboot_persisted or self._reboot_reason is None:
            return
        reply = reply or self.commands.stored(self._reboot_command or "")
        try:
            await trio.to_thread.run_sync(
                self.store.prepare_reboot, self._reboot_reason, self._reboot_command,
                reply.model_dump(exclude_none=True) if reply else None)
        except OSError as exc:
            log.error("%s: could not persist the boot reason (%s); the next hello will say "
                      "power_on", self._who(), exc)
        self._reboot_persisted = True

    async def _restart(self) -> None:
        await self._persist_reboot()
        log.warning("%s: rebooting (%s)", self._who(), self._reboot_reason)
        with trio.CancelScope(shield=True):  # a reboot powers the workload off first
            await self.hooks.run(self.hooks.shutdown, self._who())
        if self.reboot_mode == "exec":
            for handler in logging.getLogger().handlers:
                handler.flush()
            # orig_argv keeps "-m hub.cli" (or the fleethub script); sys.argv would have lost the -m
            os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
        await trio.sleep(REBOOT_PAUSE)
        await self._boot()
        self._backoff.reset()
