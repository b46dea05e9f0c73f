"""The device's side of remote tunnels: ``tunnel.open``, ``tunnel.close``, ``tunnel.ice_restart``.

The hub hands the device a grant it signed and the CLI's SDP offer (device_client/protocol.py,
"Tunnels"). The device trusts the grant only after checking it itself: signed by a key from
``welcome.hubKeys``, valid now by the device's own clock, for this device and its tunnel key, and
bound to the DTLS certificate of this very offer. Then it answers with aiortc (webrtc/peer.py) and
connects every ``tcp`` channel to the target, a name from its own configuration:

- a configured target ``NAME=HOST:PORT`` (``--tunnel-target``),
- ``ssh``: refused with ssh_disabled unless ssh is enabled (``--ssh``); goes to the configured
  ``ssh`` target, else 127.0.0.1:22,
- a TCP port number the device allows (``--tunnel-allow-port``), on 127.0.0.1,
- ``shell``: refused with shell_disabled unless enabled (``--tunnel-shell``); each ``shell`` channel
  gets its own PTY and login shell as ``--tunnel-shell-user`` (device_client/shell.py).

The grant's expiry closes the session unless the CLI sends a renewed grant on the ``control``
channel first. The grant's bandwidthBps caps each direction. ``tunnel.usage`` events report bytes
(in: from the CLI to the target; out: back), relayed bytes (while the selected ICE pair uses a TURN
relay) and duration every 30 s and once, final, at the close; a final report made with no link is
sent at the next one.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from webrtc.grant import Grant, GrantError, check_for_device, parse_grant, same_session
from webrtc.sdp import fingerprints
from webrtc.shell_channel import connect_shell

from .clock import rfc3339
from .commands import CommandError
from .shell import ShellUser

if TYPE_CHECKING:
    from webrtc.peer import TunnelPeer

    from .agent import Agent

log = logging.getLogger("fleethub.agent.tunnel")

USAGE_INTERVAL = 30.0  # seconds between tunnel.usage events of an open session
MAX_UNSENT_FINALS = 100  # final usage reports kept while there is no link
CONNECT_TIMEOUT = 30.0  # seconds for the CLI to open the control channel after the answer
CLOSE_TIMEOUT = 5.0  # seconds tunnel.close waits for the session to finish closing
SSH_DEFAULT = ("127.0.0.1", 22)
_HOSTPORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>\d{1,5})$")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")


def parse_hostport(text: str) -> tuple[str, int]:
    match = _HOSTPORT.match(text.strip())
    if not match or not 0 < int(match["port"]) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return match["host"].strip("[]"), int(match["port"])


@dataclass(frozen=True)
class TunnelConfig:
    """What this device lets a tunnel reach. Its own configuration: the hub cannot widen it."""

    targets: dict[str, tuple[str, int]] = field(default_factory=dict)
    allowed_ports: frozenset[int] = frozenset()
    ssh: bool = False
    shell: "ShellUser | None" = None  # the user the shell target runs as; None: the shell is off

    @classmethod
    def from_flags(cls, targets: list[str] | None, ports: list[int] | None, ssh: bool | None,
                   shell: bool = False, shell_user: str | None = None) -> "TunnelConfig":
        """From ``--tunnel-target NAME=HOST:PORT`` (repeatable), ``--tunnel-allow-port N``, ``--ssh``,
        ``--tunnel-shell [--tunnel-shell-user USER]``."""
        named: dict[str, tuple[str, int]] = {}
        for item in targets or []:
            name, sep, hostport = item.partition("=")
            if not sep or not _NAME.match(name):
                raise ValueError(f"--tunnel-target wants NAME=HOST:PORT, got {item!r}")
            named[name] = parse_hostport(hostport)
        for port in ports or []:
            if not 0 < port < 65536:
                raise ValueError(f"--tunnel-allow-port {port} is not a TCP port")
        if shell_user and not shell:
            raise ValueError("--tunnel-shell-user needs --tunnel-shell")
        if "shell" in named:
            raise ValueError("--tunnel-target: 'shell' is the name of the shell target (--tunnel-shell)")
        user = ShellUser.lookup(shell_user) if shell else None
        if user is not None and user.uid != os.getuid() and os.getuid() != 0:
            raise ValueError(f"--tunnel-shell-user {user.name}: only an agent running as root can start "
                             "a shell as another user")
        return cls(targets=named, allowed_ports=frozenset(ports or []), ssh=bool(ssh), shell=user)

    def describe(self) -> str:
        """One line for the agent's log at start: what a tunnel to this device can reach."""
        ssh = f"ssh on ({':'.join(map(str, self.targets.get('ssh', SSH_DEFAULT)))})" if self.ssh else \
            "ssh off (--ssh)"
        named = [f"{name}={host}:{port}" for name, (host, port) in sorted(self.targets.items())
                 if name != "ssh" or not self.ssh]
        ports = [f"port {port}" for port in sorted(self.allowed_ports)]
        shell = f"shell on (as {self.shell.name})" if self.shell else "shell off (--tunnel-shell)"
        return ", ".join([ssh, shell, *named, *ports])

    def resolve(self, target: str) -> "tuple[str, int] | ShellTarget":
        """Where ``target`` goes, or CommandError target_not_configured / ssh_disabled / shell_disabled."""
        if target == "shell":
            if self.shell is None:
                raise CommandError("shell_disabled", "the shell target is disabled on this device")
            return ShellTarget(self.shell)
        if target == "ssh":
            if not self.ssh:
                raise CommandError("ssh_disabled", "ssh is disabled on this device")
            return self.targets.get("ssh", SSH_DEFAULT)
        if target in self.targets:
            return self.targets[target]
        if target.isdigit() and int(target) in self.allowed_ports:
            return "127.0.0.1", int(target)
        raise CommandError("target_not_configured", f"target {target!r} is not configured on this device")


def add_arguments(parser: Any) -> None:
    """The tunnel flags of ``fleethub agent`` and ``fleethub sim``."""
    import argparse

    parser.add_argument("--tunnel-target", action="append", default=[], metavar="NAME=HOST:PORT",
                        help="a TCP service tunnels may reach by NAME (repeatable)")
    parser.add_argument("--tunnel-allow-port", action="append", type=int, default=[], metavar="N",
                        help="a port on 127.0.0.1 tunnels may reach by number (repeatable)")
    parser.add_argument("--ssh", action=argparse.BooleanOptionalAction, default=False,
                        help="allow the ssh target (default: off)")
    parser.add_argument("--tunnel-shell", action=argparse.BooleanOptionalAction, default=False,
                        help="allow the shell target: a PTY with a login shell per browser terminal "
                             "(default: off)")
    parser.add_argument("--tunnel-shell-user", metavar="USER", default=None,
                        help="the user the shell target runs as (default: the agent's own user)")


@dataclass(frozen=True)
class ShellTarget:
    """The peer's target for ``shell`` channels: each Pump gets its own shell (on the asyncio side)."""

    user: ShellUser

    async def __call__(self, pump: Any) -> None:
        await connect_shell(pump, self.user)


class Session:
    """One open tunnel on the device: its grant, its peer, its expiry and its usage."""

    def __init__(self, service: "TunnelService", grant: Grant, peer: "TunnelPeer") -> None:
        self.service = service
        self.grant = grant
        self.peer = peer
        self.reason: str | None = None
        self.done = trio.Event()
        self._stop = trio.Event()
        self._expiry: trio.CancelScope | None = None
        self._started = service.agent.clock.monotonic()
        self._relayed = 0
        self._counted = 0  # bytes already classified as relayed or not

    @property
    def sid(self) -> str:
        return self.grant.sid

    def close(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self._stop.set()

    def on_state(self, state: str) -> None:
        if state in ("failed", "closed"):
            self.close("connection_" + state)

    def on_control(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "closing":
            self.close("client_closed")
        elif kind == "renew":
            self.peer.send_control(self._renew(message.get("grant")))

    def _renew(self, token: Any) -> dict[str, Any]:
        agent = self.service.agent
        try:
            renewed = parse_grant(token, agent.hub_keys, now=agent.clock.now())
            check_for_device(renewed, device_id=agent.device_id, device_key=agent.public_key_b64)
            same_session(self.grant, renewed)
        except GrantError as exc:
            log.info("tunnel %s: refused a renewal: %s", self.sid, exc.reason)
            return {"type": "error", "reason": exc.reason}
        self.grant = renewed
        if self._expiry is not None:
            self._expiry.deadline = agent.clock.deadline_for(renewed.expires_at)
        log.info("tunnel %s: renewed until %s", self.sid, rfc3339(renewed.expires_at))
        return {"type": "renewed", "expiresAt": rfc3339(renewed.expires_at)}

    async def run(self) -> None:
        clock = self.service.agent.clock
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._report_usage)
                nursery.start_soon(self._require_connection)
                with trio.CancelScope(deadline=clock.deadline_for(self.grant.expires_at)) as self._expiry:
                    await self._stop.wait()
                if self._expiry.cancelled_caught:
                    self.close("expired")
                    self.peer.send_control({"type": "closing", "reason": "expired"})
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                # classify the bytes by path while the selected pair is still there: a closed peer has
                # none, and a session shorter than USAGE_INTERVAL would report nothing relayed
                self._classify()
                await self.peer.close()
                self.service.sessions.pop(self.sid, None)
                await self.service.report_final(self.usage(final=True))
                log.info("tunnel %s closed (%s)", self.sid, self.reason)
                self.done.set()

    async def _require_connection(self) -> None:
        with trio.move_on_after(CONNECT_TIMEOUT) as waited:
            await self.peer.wait_control_open()
        if waited.cancelled_caught:
            self.close("not_connected")

    async def _report_usage(self) -> None:
        while True:
            await trio.sleep(USAGE_INTERVAL)
            await self.service.agent.send_event("tunnel.usage", self.usage(final=False))

    def _classify(self) -> None:
        counters = self.peer.counters
        total = counters.received + counters.sent
        # bytes since the last look went the way the selected pair goes now
        if self.peer.uses_relay():
            self._relayed += total - self._counted
        self._counted = total

    def usage(self, *, final: bool) -> dict[str, Any]:
        counters = self.peer.counters
        self._classify()
        usage: dict[str, Any] = {
            "sessionId": self.sid, "bytesIn": counters.received, "bytesOut": counters.sent,
            "relayedBytes": self._relayed, "final": final,
            "durationSeconds": round(self.service.agent.clock.monotonic() - self._started, 3)}
        if final and self.reason:
            usage["reason"] = self.reason
        return usage


class TunnelService:
    def __init__(self, agent: "Agent", config: TunnelConfig) -> None:
        self.agent = agent
        self.config = config
        self.sessions: dict[str, Session] = {}
        # Final usage of sessions that ended with no link (the hub down or unreachable): the bytes are
        # billed, so each is sent at the next link. Bounded: the oldest go first when it overflows.
        self.unsent_finals: list[dict[str, Any]] = []

    async def report_final(self, usage: dict[str, Any]) -> None:
        if not await self.agent.send_event("tunnel.usage", usage):
            self.unsent_finals = (self.unsent_finals + [usage])[-MAX_UNSENT_FINALS:]

    async def _on_link(self) -> None:
        while self.unsent_finals:
            usage = self.unsent_finals[0]
            if not await self.agent.send_event("tunnel.usage", usage):
                return
            if self.unsent_finals and self.unsent_finals[0] is usage:
                self.unsent_finals.pop(0)

    def hello_fields(self) -> dict[str, Any]:
        # the hub refuses a target missing here before it asks the device (404 target_not_configured)
        return {"tunnelTargets": {"names": sorted(self.config.targets), "ports": sorted(self.config.allowed_ports),
                                  "ssh": self.config.ssh, "shell": self.config.shell is not None}}

    async def open(self, payload: dict[str, Any]) -> dict[str, Any]:
        from webrtc.peer import TunnelPeer  # aiortc loads on the first tunnel, not at every agent start

        token, offer = payload.get("grant"), payload.get("offer")
        if not isinstance(offer, dict) or not isinstance(offer.get("sdp"), str) or offer.get("type") != "offer":
            raise CommandError("rejected", "the payload has no SDP offer")
        agent = self.agent
        try:
            grant = parse_grant(token, agent.hub_keys, now=agent.clock.now())
            check_for_device(grant, device_id=agent.device_id, device_key=agent.public_key_b64,
                             offer_fingerprints=fingerprints(offer["sdp"]))
        except GrantError as exc:
            log.warning("tunnel: refused a grant: %s", exc.reason)
            raise CommandError(exc.code, exc.reason) from None
        target = self.config.resolve(grant.target)
        if grant.sid in self.sessions:
            raise CommandError("rejected", f"session {grant.sid} is already open")
        nursery = agent.nursery
        if nursery is None:
            raise CommandError("rejected", "the agent is shutting down")
        servers = [s for s in payload.get("iceServers") or [] if isinstance(s, dict)]
        if not grant.relay:
            servers = [s for s in servers if not _is_turn(s)]
        session: Session | None = None
        peer = TunnelPeer(ice_servers=servers, on_control=lambda m: session and session.on_control(m),
                          on_state=lambda s: session and session.on_state(s))
        try:
            answer = await peer.answer(offer, target=target, bandwidth_bps=grant.bandwidth_bps)
        except Exception as exc:
            await peer.close()
            raise CommandError("rejected", f"cannot answer the offer: {exc}") from None
        except BaseException:
            await peer.close()
            raise
        session = Session(self, grant, peer)
        self.sessions[grant.sid] = session
        nursery.start_soon(session.run)
        where = f"{target[0]}:{target[1]}" if isinstance(target, tuple) else f"a shell as {target.user.name}"
        log.info("tunnel %s opened for %s to %s (%s)", grant.sid, grant.principal, grant.target, where)
        return {"answer": answer}

    async def close(self, payload: dict[str, Any]) -> dict[str, Any]:
        session = self.sessions.get(str(payload.get("sessionId")))
        if session is None:
            return {"closed": False}
        reason = payload.get("reason")
        session.close(reason if isinstance(reason, str) and reason else "closed_by_hub")
        with trio.move_on_after(CLOSE_TIMEOUT):
            await session.done.wait()
        return {"closed": True}

    async def ice_restart(self, payload: dict[str, Any]) -> dict[str, Any]:
        if str(payload.get("sessionId")) not in self.sessions:
            raise CommandError("rejected", "no such tunnel session on this device")
        raise CommandError("device_unsupported", "this device's WebRTC stack (aiortc) cannot restart "
                                                 "ICE; open a new session")

    async def shutdown(self) -> None:
        for session in list(self.sessions.values()):
            session.close("device_shutdown")
        for session in list(self.sessions.values()):
            with trio.move_on_after(CLOSE_TIMEOUT):
                await session.done.wait()


def _is_turn(server: dict[str, Any]) -> bool:
    urls = server.get("urls")
    urls = [urls] if isinstance(urls, str) else urls or []
    return any(str(u).startswith(("turn:", "turns:")) for u in urls)


def attach(agent: "Agent", config: TunnelConfig | None = None) -> TunnelService:
    service = TunnelService(agent, config or TunnelConfig())
    agent.register("tunnel.open", service.open)
    agent.register("tunnel.close", service.close)
    agent.register("tunnel.ice_restart", service.ice_restart)
    agent.add_shutdown_hook(service.shutdown)
    agent.add_hello_provider(service.hello_fields)
    agent.add_link_hook(service._on_link)
    agent.capabilities.tunnel = True
    # an operator's first question when a tunnel is refused: what does this device offer?
    log.info("tunnel targets: %s", service.config.describe())
    return service
