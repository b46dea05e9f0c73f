"""The device agent: keeps one WebSocket to the hub up for as long as the device runs.

A link lives through: connect (``Authorization: Bearer <token>``) → ``hello`` → ``welcome`` →
heartbeats and commands until the socket drops → reconnect with full-jitter exponential backoff.
Commands are answered by verb handlers (``Agent.register``); replies are remembered by command id so
a command the hub sends twice runs once (commands.py). A reboot is a boot: the agent stops the
workload, persists the reason, closes the link and either restarts its session in process
(simulation) or re-executes itself.

The agent is also where the device's parts meet: secret files (files.py), the workload
(workload.py) and configuration versions (configs.py) register their verbs, hello fields and
boot/link/shutdown hooks here. Run it with ``fleethub agent`` (hub/cli.py).
"""

from __future__ import annotations

import base64
import functools
import logging
import math
import os
import platform
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncContextManager, Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError, open_websocket_url

from . import protocol
from .clock import Clock, rfc3339
from . import linkctl
from .linkcodes import SUPERSEDED_BACKOFF, Close
from .commands import CommandError, CommandTable, Handler, Hook, Hooks, current_command
from .configs import ConfigManager
from .files import SecretFileStore
from .backoff import Backoff
from .link import CommandReceived, DeviceSide, HeartbeatDue, Ignored, LinkFailed
from .link.deviceside import MIN_HEARTBEAT  # noqa: F401  (kept importable from here)
from .linkframes import FrameGuard
from .memtest import MemtestConfig
from .memtest import attach as attach_memtest
from .registry_proxy import RegistryProxy
from .telemetry import Telemetry
from .state import DeviceStore
from .tunnel import attach as attach_tunnel
from .workload import RunAs, Workload

log = logging.getLogger("fleethub.agent")

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


# trio-websocket's reason when our end closes with 1009 because the hub's frame was over
# max_message_size; the hub's own 1009 reasons say "over the limit of N bytes" (or nothing).
_OUR_TOO_BIG = "Exceeded maximum message size"


def _we_refused(reason: str | None) -> bool:
    return bool(reason) and reason.startswith(_OUR_TOO_BIG)  # type: ignore[union-attr]


class _LinkLost(Exception):
    """The hub answered, but not with a usable link (no welcome, wrong first frame)."""


# What ends one link and sends the agent into backoff. Anything else is a bug in the agent: it
# propagates, and the process supervisor (or the sim's nursery) sees it.
_LINK_ERRORS = (HandshakeError, ConnectionClosed, OSError, trio.BrokenResourceError,
                trio.ClosedResourceError, protocol.ProtocolError, _LinkLost)


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


class Agent:
    def __init__(self, hub_url: str, token: str, data_dir: Path, *, clock: Clock | None = None,
                 facts: dict[str, Any] | None = None, reboot_mode: str = "restart",
                 backoff_initial: float = 0.5, backoff_max: float = 30.0,
                 connect_limiter: trio.CapacityLimiter | None = None, connect_timeout: float = 10.0,
                 handshake_timeout: float = 10.0, ssl_context: Any = None,
                 rng: random.Random | None = None, ignore_owner: bool | None = None,
                 tunnel: Any = None, memtest: MemtestConfig | None = None,
                 workload_user: RunAs | None = None, owner_for_all_files: tuple[int, int] | None = None,
                 max_frame_bytes: int = protocol.MAX_FRAME_BYTES,
                 superseded_backoff: float = SUPERSEDED_BACKOFF,
                 connector: Callable[[list[tuple[bytes, bytes]]], AsyncContextManager[Any]] | None = None) -> None:
        if reboot_mode not in ("restart", "exec"):
            raise ValueError(f"reboot_mode must be 'restart' or 'exec', got {reboot_mode!r}")
        self.hub_url = hub_url
        self.link_url = link_url(hub_url)
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
        self.tunnel = attach_tunnel(self, tunnel)  # tunnel: a tunnel.TunnelConfig (None: no targets)
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

    def _after_close(self, delay: float) -> float:
        """How long to stay away after the hub closed the link with ``_closed_with`` (docs/device-protocol.md,
        close codes): superseded means another holder of our token took over, and coming straight back
        would knock it off in a loop; a revoked token or an unknown version will not work sooner."""
        code, self._closed_with = self._closed_with, None
        if code == Close.SUPERSEDED:
            log.warning("%s: another connection with this device's token took over (4001); staying away "
                        "%.0f s. If this repeats, two devices share one token.", self._who(), self._superseded_backoff)
            return self._superseded_backoff + delay
        if code in (Close.CREDENTIAL_REVOKED, Close.UNKNOWN_VERSION):
            return max(delay, self._backoff.maximum)
        return delay

    async def _connect_once(self) -> bool:
        self._link_welcomed = False
        self._link_error = None
        try:
            if self._limiter is not None:
                # bounds simultaneous handshakes, so 15,000 agents (or one hub restart) do not
                # open 15,000 TCP connections in the same millisecond
                await self._limiter.acquire_on_behalf_of(self)
                self._limiter_held = True
            async with self._open_link() as ws:
                with trio.CancelScope() as self._scope:
                    if self._reboot_reason is None:
                        await self._session(ws)
                self._scope = None
                if self._reconnect_after is not None:
                    await ws.aclose(1001, "drained by the hub")  # 1001: going away
                if self._reboot_reason is not None:
                    await self._persist_reboot()
                    await ws.aclose(1012, "rebooting")  # 1012: service restart
        except ConnectionRejected as exc:
            self._link_failed(exc)
            if exc.status_code in (401, 403):
                log.warning("%s: the hub refused the device token (HTTP %d) at %s; check the "
                            "token or the device's registration. Retrying with backoff.",
                            self._who(), exc.status_code, self.link_url)
            else:
                log.warning("%s: the hub refused the link (HTTP %d)", self._who(), exc.status_code)
        except _LINK_ERRORS as exc:
            log.log(logging.INFO if self._link_welcomed else logging.WARNING, "%s: link %s: %s",
                    self._who(), "lost" if self._link_welcomed else "failed", self._link_failed(exc))
            if isinstance(exc, ConnectionClosed):
                self._closed_with = exc.reason.code
                if exc.reason.code != protocol.CLOSE_TOO_BIG and exc.reason.reason:
                    log.warning("%s: the hub closed the link (%d): %s", self._who(), exc.reason.code, exc.reason.reason)
            if isinstance(exc, ConnectionClosed) and exc.reason.code == protocol.CLOSE_TOO_BIG:
                if _we_refused(exc.reason.reason):
                    # our own end closed: the hub sent a frame over our limit. Nothing of ours was
                    # refused, so nothing is trimmed, dropped or learned.
                    log.warning("%s: the hub sent a frame over this agent's limit of %d bytes; link closed "
                                "(1009)", self._who(), protocol.MAX_FRAME_BYTES)
                else:
                    # the hub refused a frame as too big: trim or drop it before coming back, never resend it
                    self.frames.refused_by_hub(exc.reason.reason or "")
        finally:
            self._release_limiter()
            self._scope = None
            self._ws = None
            self.connected = False
            if self._connected_event.is_set():
                self._connected_event = trio.Event()
        return self._link_welcomed

    def _open_link(self) -> AsyncContextManager[Any]:
        if self._connector is not None:  # a test's in-memory hub (tests/device_client/device_fakehub.py)
            return self._connector(self._auth)
        return open_websocket_url(self.link_url, self._ssl_context, extra_headers=self._auth,
                                  max_message_size=protocol.MAX_FRAME_BYTES, connect_timeout=self._connect_timeout,
                                  disconnect_timeout=5)

    async def _session(self, ws: Any) -> None:
        await ws.send_message(self.frames.encode_hello(self._hello()))
        side = DeviceSide(trio.current_time(), handshake_timeout=self._handshake_timeout)
        try:
            [first] = await self._feed(ws, side)
            if isinstance(first, LinkFailed):
                raise _LinkLost(first.why)
            welcome = first.welcome  # type: ignore[attr-defined]
            self.device_id = welcome.deviceId
            self.hub_keys = dict(welcome.hubKeys)
            self.frames.linked(welcome.maxFrameBytes)
            self._ws = ws
            self.connected = True
            self._link_welcomed = True
            self._stats["links"] += 1
            self._connected_event.set()
            self._release_limiter()
            if self._on_first_welcome is not None:
                self._on_first_welcome, started = None, self._on_first_welcome
                started()
            log.info("%s: linked to %s (boot reason %s)", self._who(), self.link_url, self.boot_reason)
            refusals = self.frames.take_report()
            if refusals:  # what the hub or the agent refused as too big since the last link
                await self.send_event("link.refused", {"refusals": refusals})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.hooks.run, self.hooks.link, self._who())
                await self._guard(nursery.cancel_scope, self._drive, ws, side, nursery)
        finally:
            side.closed()
        if self._link_error is not None:
            raise self._link_error

    async def _feed(self, ws: Any, side: DeviceSide) -> list[object]:
        """One turn of the IO shell: read a frame (or wait out the side's deadline) and feed it."""
        deadline = side.deadline()
        message = None
        with trio.move_on_at(math.inf if deadline is None else deadline):
            message = await ws.get_message()  # trio-websocket queues messages: a cancel loses none
        now = trio.current_time()
        return side.tick(now) if message is None else side.receive(message, now)

    async def _guard(self, scope: trio.CancelScope, fn: Callable[..., Awaitable[None]],
                     *args: Any) -> None:
        # Turns the end of the link into one error instead of an ExceptionGroup of them.
        try:
            await fn(*args)
        except _LINK_ERRORS as exc:
            if self._link_error is None:
                self._link_error = exc
            scope.cancel()

    async def _drive(self, ws: Any, side: DeviceSide, nursery: trio.Nursery) -> None:
        while True:
            for event in await self._feed(ws, side):
                if isinstance(event, CommandReceived):
                    # each command in its own task: a slow handler must not delay a ping
                    nursery.start_soon(self._guard, nursery.cancel_scope, self.commands.dispatch, event.command,
                                       functools.partial(self._send_reply, ws), self.device_id, self._who())
                elif isinstance(event, HeartbeatDue):
                    payload = {"deviceClock": rfc3339(self.clock.now()), "uptime": round(self.uptime(), 3)}
                    await ws.send_message(side.heartbeat(payload, trio.current_time()))
                    self._stats["heartbeats_sent"] += 1
                elif isinstance(event, Ignored):
                    log.log(logging.WARNING if event.undecodable else logging.DEBUG, "%s: ignoring %s",
                            self._who(), event.why)

    async def _send_reply(self, ws: Any, reply: protocol.Reply) -> None:
        text, sent = self.frames.encode_reply(reply)
        if sent is not reply:  # too big: a repeated command gets the too_large answer, not the original
            self.commands.remember(reply.id, sent)
        await ws.send_message(text)

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

    def _link_failed(self, exc: BaseException) -> str:
        # trio-websocket wraps the OSError that says what went wrong ("connection refused")
        described = f"{exc!r}: {exc.__cause__}" if exc.__cause__ else repr(exc)
        self._stats["link_failures"] += 1
        self._last_error = described
        return described

    def _release_limiter(self) -> None:
        if self._limiter_held:
            self._limiter_held = False
            self._limiter.release_on_behalf_of(self)  # type: ignore[union-attr]

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
        return {"rebooting": True}

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

    async def _persist_reboot(self) -> None:
        if self._reboot_persisted or self._reboot_reason is None:
            return
        reply = self.commands.stored(self._reboot_command or "")
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
