"""The device agent: keeps one WebSocket to the hub up for as long as the device runs.

A link lives through: connect (``Authorization: Bearer <token>``) → ``hello`` → ``welcome`` →
heartbeats and commands until the socket drops → reconnect with full-jitter exponential backoff
(``Link``, agentlink.py, around the protocol of device_client/shared/link/). Commands are answered by verb
handlers the parts register; replies are remembered by command id so a command the hub sends
twice runs once (commands.py). A reboot is a boot: the agent stops the
workload, persists the reason, closes the link and either restarts its session in process
(simulation) or re-executes itself.

The agent is also where the device's parts meet: secret files (files.py), the workload
(workload.py), configuration versions (configs.py), the memory tester (memtest/), telemetry, registry
bytes and the link's own verbs (linkctl.py) each get a ``DeviceContext`` (context.py), never the
agent: through it they register their verbs, hello fields and boot/link/shutdown hooks, send events
and ask for a reboot. Its options come in one ``AgentConfig`` (agentconfig.py). Run it with
``fleethub agent`` (hub/cli.py).

Tunnels are the one part passed in: their engine needs webrtc, a layer above this package, so the
launcher gives it as ``AgentConfig.tunnel_engine`` (``webrtc.device_tunnel.attach``) with the
device's ``TunnelConfig`` (tunnel.py). An agent built without one has no tunnels and says so: no
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
import re
import sys
from dataclasses import dataclass
from typing import Any

import trio

from . import linkctl
from .shared import protocol
from .agentconfig import AgentConfig, TunnelEngine, hub_urls, link_url  # noqa: F401  (importable from here)
from .agentlink import Link
from .shared.clock import Clock, rfc3339
from .commands import CommandError, CommandTable, Hooks, current_command
from .configs import ConfigManager
from .containers import ContainerSet
from .context import DeviceContext
from .files import SecretFileStore
from .shared.link.deviceside import MIN_HEARTBEAT  # noqa: F401  (kept importable from here)
from .linkframes import FrameGuard
from .memtest import attach as attach_memtest
from .pullroute import PullRoute
from .state import DeviceStore
from .sysinfo import SystemSampler
from .telemetry import Telemetry
from .workload import Workload

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


class Agent:
    """One device: its boots and reboots, its ``Link`` and its parts, each part wired through the one
    ``DeviceContext`` (see the module's docstring)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir
        self.store = DeviceStore(self.data_dir)
        # the device's filesystem for files the hub delivers: the real one ("/") on a device in service
        self.root = config.device_root or self.store.root
        self.clock = config.clock or Clock()
        self.capabilities = protocol.Capabilities(
            memoryTest=protocol.MemoryTestCapabilities(
                online=False, offline=False,
                offlineReason="memory tests are not installed on this agent yet"),
            reboot=True)
        self.nursery: trio.Nursery | None = None  # lives as long as run(): for work that outlives a link
        self.boot_count = 0
        self.boot_reason: str | None = None
        self.signing_key = None  # nacl SigningKey, loaded at boot
        self.hooks = Hooks()
        self.commands = CommandTable()
        self.link = Link(config, self.clock, self.commands, hello=self._hello, uptime=self.uptime,
                         on_link=self._linked, who=self._who)
        self.commands.register("ping", self._ping)
        self.commands.register("reboot", self._reboot)
        self._reboot_reason: str | None = None
        self._reboot_command: str | None = None
        self._reboot_persisted = False
        self._booted_at = 0.0
        # the device's parts; the order of attach is the order of their boot hooks
        self.workload = Workload(self.data_dir, self.root, run_as=config.workload_user)
        self.context = device = DeviceContext(
            clock=self.clock, data_dir=self.data_dir, facts=config.facts, capabilities=self.capabilities,
            workload=self.workload, commands=self.commands, hooks=self.hooks, link=self.link,
            request_reboot=self.request_reboot, boot_reason=lambda: self.boot_reason,
            public_key_b64=lambda: self.public_key_b64, nursery=lambda: self.nursery, uptime=self.uptime,
            statistics=self.statistics, who=self._who)
        self.linkctl = linkctl.LinkControl(device)  # link.drain, link.keys, link.notice
        self.files = SecretFileStore(self.data_dir, self.root, ignore_owner=config.ignore_owner,
                                     owner_for_all=config.owner_for_all_files)
        route = PullRoute(config.registry_proxy, lambda: self.link.hub_url, config.token, self.data_dir)
        self.containers = ContainerSet(config.container_engine, self.root, image_budget=config.image_budget,
                                       on_event=device.send_event, route=route) if config.container_engine else None
        self.configs = ConfigManager(self.data_dir, self.files, self.workload, device_id=lambda: device.device_id,
                                     containers=self.containers)
        self.files.attach(device)
        # before the configuration: a test boot holds the workload before its boot hook starts it
        self.memtest = attach_memtest(device, config.memtest)  # None: simulated defaults
        self.configs.attach(device)  # and the workload: its health events, its stop at shutdown
        # no tunnel_engine: no tunnels (module docstring); config.tunnel None: no targets
        engine = config.tunnel_engine
        self.tunnel = engine(device, config.tunnel) if engine is not None else None
        self.system = SystemSampler(self.root)  # the hello's and telemetry's system facts
        # billing: telemetry.set, telemetry events
        self.telemetry = Telemetry(self.data_dir, system=self.system.sample).attach(device)

    # ---- what launchers and tests read ----

    @property
    def device_id(self) -> str | None:
        return self.link.device_id

    @property
    def connected(self) -> bool:
        return self.link.connected

    @property
    def hub_url(self) -> str:
        return self.link.hub_url

    @property
    def hub_keys(self) -> dict[str, str]:
        return self.link.hub_keys

    @property
    def frames(self) -> FrameGuard:
        return self.link.frames

    async def wait_connected(self) -> None:
        await self.link.wait_connected()

    async def send_event(self, kind: str, payload: dict[str, Any] | None = None) -> bool:
        return await self.link.send_event(kind, payload)

    @property
    def public_key_b64(self) -> str | None:
        if self.signing_key is None:
            return None
        return base64.b64encode(bytes(self.signing_key.verify_key)).decode()

    def uptime(self) -> float:
        return self.clock.monotonic() - self._booted_at

    def statistics(self) -> AgentStatistics:
        link = self.link.statistics()
        return AgentStatistics(device_id=link.device_id, connected=link.connected,
                               boot_count=self.boot_count, boot_reason=self.boot_reason,
                               links=link.links, link_failures=link.link_failures,
                               heartbeats_sent=link.heartbeats_sent, last_error=link.last_error,
                               commands_handled=self.commands.handled,
                               duplicate_commands=self.commands.duplicates)

    def request_reboot(self, reason: str = "reboot") -> None:
        """Reboot once the replies being worked on are sent; the next hello reports ``reason``."""
        if self._reboot_reason is None:
            self._reboot_reason = reason
            self._reboot_command = current_command()
        self.link.leave(1012, "rebooting", self._persist_reboot)  # 1012: service restart

    # ---- the run ----

    async def run(self, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
        """Run forever; ``task_status.started(self)`` after the first welcome."""
        try:
            async with trio.open_nursery() as nursery:
                self.workload.nursery = self.nursery = nursery  # supervises the workload's processes
                await self._boot()
                self.link.on_first_welcome(functools.partial(task_status.started, self))
                while True:
                    if self._reboot_reason is not None:
                        await self._restart()
                        continue
                    welcomed = await self.link.connect_once()
                    if self._reboot_reason is not None:
                        continue
                    await self.link.pause(welcomed)
        finally:
            self.workload.nursery = self.nursery = None
            with trio.CancelScope(shield=True):
                await self.hooks.run(self.hooks.shutdown, self._who())

    def _hello(self) -> dict[str, Any]:
        facts = self.config.facts
        fields: dict[str, Any] = dict(
            agentVersion=AGENT_VERSION,
            firmware=str(facts.get("firmware") or _default_firmware())[:protocol.FACT_MAX],
            architecture=str(facts.get("architecture") or platform.machine())[:protocol.FACT_MAX],
            capabilities=self.capabilities,
            bootReason=self.boot_reason or "power_on",
            deviceClock=rfc3339(self.clock.now()),
            tunnelPublicKey=self.public_key_b64,
            system=self.system.sample(),
        )
        return {**fields, **self.hooks.hello_fields()}

    async def _linked(self) -> None:
        log.info("%s: linked to %s (boot reason %s)", self._who(), self.link.link_url, self.boot_reason)
        await self.hooks.run(self.hooks.link, self._who())

    def _who(self) -> str:
        device_id = self.link.device_id
        return f"device {device_id}" if device_id else f"agent {self.data_dir.name}"

    # ---- commands ----

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
        self.link.stay()  # a leave the reboot asked for is done with
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
        if self.config.reboot_mode == "exec":
            for handler in logging.getLogger().handlers:
                handler.flush()
            # orig_argv keeps "-m hub.cli" (or the fleethub script); sys.argv would have lost the -m
            os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
        await trio.sleep(REBOOT_PAUSE)
        await self._boot()
        self.link.reset_backoff()
