"""The device's side of remote tunnels: ``tunnel.open``, ``tunnel.close``, ``tunnel.ice_restart``.

The hub hands the device a grant it signed and the CLI's SDP offer (device_client/shared/protocol.py,
"Tunnels"). The device trusts the grant only after checking it itself (grant.py): signed by a key
from ``welcome.hubKeys``, valid now by the device's own clock, for this device and its tunnel key,
and bound to the DTLS certificate of this very offer. Then it answers with aiortc (peer.py) and
connects every ``tcp`` channel to the target, which the device's own configuration resolves
(device_client/tunnel.py ``TunnelConfig``: named targets, ssh, allowed ports, the shell); each
``shell`` channel gets its own PTY (shell_channel.py).

The grant's expiry closes the session unless the CLI sends a renewed grant on the ``control``
channel first. The grant's bandwidthBps caps each direction. ``tunnel.usage`` events report bytes
(in: from the CLI to the target; out: back), relayed bytes (while the selected ICE pair uses a TURN
relay) and duration every 30 s and once, final, at the close; a final report made with no link is
sent at the next one.

Here, not in device_client: this is the part that needs webrtc, and device_client is the layer below
it. The agent's launcher (``fleethub agent``/``sim``/``demo``, hub/cli.py and hub/demo.py) passes
``attach`` as ``AgentConfig(tunnel_engine=...)``; an agent built without it has no tunnels at all
(docs/architecture.md, "Layers"). The log keeps the agent's name, ``fleethub.agent.tunnel``.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, Callable

import trio

from device_client.shared.clock import rfc3339
from device_client.commands import CommandError
from device_client.imports import load
from device_client.tunnel import ShellTarget, TunnelConfig

from .sdp import data_channels_only, fingerprints, media_kinds

if TYPE_CHECKING:
    from device_client.context import DeviceContext

    from .grant import Grant
    from .peer import TunnelPeer

log = logging.getLogger("fleethub.agent.tunnel")

USAGE_INTERVAL = 30.0  # seconds between tunnel.usage events of an open session
MAX_UNSENT_FINALS = 100  # final usage reports kept while there is no link
CONNECT_TIMEOUT = 30.0  # seconds for the CLI to open the control channel after the answer
CLOSE_TIMEOUT = 5.0  # seconds tunnel.close waits for the session to finish closing


def peer_target(target: "tuple[str, int] | ShellTarget") -> "tuple[str, int] | Callable[[Any], Any]":
    """What ``TunnelPeer.answer`` takes for a resolved target: the address of a TCP target, or for the
    shell a coroutine function that joins each ``shell`` channel's Pump to its own PTY (asyncio side)."""
    if isinstance(target, ShellTarget):
        from .shell_channel import connect_shell  # asyncio's PTY side: with the first shell channel

        return functools.partial(connect_shell, user=target.user)
    return target


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
        self._started = service.device.clock.monotonic()
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
        from .grant import GrantError, check_for_device, parse_grant, same_session

        device = self.service.device
        try:
            renewed = parse_grant(token, device.hub_keys, now=device.clock.now())
            check_for_device(renewed, device_id=device.device_id, device_key=device.public_key_b64)
            same_session(self.grant, renewed)
        except GrantError as exc:
            log.info("tunnel %s: refused a renewal: %s", self.sid, exc.reason)
            return {"type": "error", "reason": exc.reason}
        self.grant = renewed
        if self._expiry is not None:
            self._expiry.deadline = device.clock.deadline_for(renewed.expires_at)
        log.info("tunnel %s: renewed until %s", self.sid, rfc3339(renewed.expires_at))
        return {"type": "renewed", "expiresAt": rfc3339(renewed.expires_at)}

    async def run(self) -> None:
        clock = self.service.device.clock
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
            await self.service.device.send_event("tunnel.usage", self.usage(final=False))

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
            "durationSeconds": round(self.service.device.clock.monotonic() - self._started, 3)}
        if final and self.reason:
            usage["reason"] = self.reason
        return usage


class TunnelService:
    """The agent's open sessions and the final usage reports still to send."""

    def __init__(self, device: "DeviceContext", config: TunnelConfig) -> None:
        self.device = device
        self.config = config
        self.sessions: dict[str, Session] = {}
        # Final usage of sessions that ended with no link (the hub down or unreachable): the bytes are
        # billed, so each is sent at the next link. Bounded: the oldest go first when it overflows.
        self.unsent_finals: list[dict[str, Any]] = []

    async def report_final(self, usage: dict[str, Any]) -> None:
        if not await self.device.send_event("tunnel.usage", usage):
            self.unsent_finals = (self.unsent_finals + [usage])[-MAX_UNSENT_FINALS:]

    async def _on_link(self) -> None:
        while self.unsent_finals:
            usage = self.unsent_finals[0]
            if not await self.device.send_event("tunnel.usage", usage):
                return
            if self.unsent_finals and self.unsent_finals[0] is usage:
                self.unsent_finals.pop(0)

    async def open(self, payload: dict[str, Any]) -> dict[str, Any]:
        await load_engine()
        from .grant import GrantError, check_for_device, parse_grant
        from .peer import TunnelPeer

        token, offer = payload.get("grant"), payload.get("offer")
        if not isinstance(offer, dict) or not isinstance(offer.get("sdp"), str) or offer.get("type") != "offer":
            raise CommandError("rejected", "the payload has no SDP offer")
        if not data_channels_only(offer["sdp"]):
            raise CommandError("rejected", "a tunnel's offer carries data channels only (m=application); "
                                           f"this one has {media_kinds(offer['sdp'])[:8]}")
        device = self.device
        try:
            grant = parse_grant(token, device.hub_keys, now=device.clock.now())
            check_for_device(grant, device_id=device.device_id, device_key=device.public_key_b64,
                             offer_fingerprints=fingerprints(offer["sdp"]))
        except GrantError as exc:
            log.warning("tunnel: refused a grant: %s", exc.reason)
            raise CommandError(exc.code, exc.reason) from None
        target = self.config.resolve(grant.target)
        if grant.sid in self.sessions:
            raise CommandError("rejected", f"session {grant.sid} is already open")
        nursery = device.nursery
        if nursery is None:
            raise CommandError("rejected", "the agent is shutting down")
        servers = [s for s in payload.get("iceServers") or [] if isinstance(s, dict)]
        if not grant.relay:
            servers = [s for s in servers if not _is_turn(s)]
        session: Session | None = None
        peer = TunnelPeer(ice_servers=servers, on_control=lambda m: session and session.on_control(m),
                          on_state=lambda s: session and session.on_state(s))
        try:
            answer = await peer.answer(offer, target=peer_target(target), bandwidth_bps=grant.bandwidth_bps)
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


async def load_engine() -> None:
    """The tunnel's own modules, imported off the agent's trio thread (device_client/imports.py) the
    first time: grant.py brings pyjwt and cryptography, peer.py the data path's modules, about 130 ms
    of CPU together. An idle agent with targets configured holds none of them (bench/agent_footprint.py).
    aiortc itself is imported later, on the asyncio thread that runs it (peer.py, loop.py)."""
    await load(f"{__package__}.grant", f"{__package__}.peer")


def _is_turn(server: dict[str, Any]) -> bool:
    urls = server.get("urls")
    urls = [urls] if isinstance(urls, str) else urls or []
    return any(str(u).startswith(("turn:", "turns:")) for u in urls)


def attach(device: "DeviceContext", config: TunnelConfig | None = None) -> TunnelService:
    """The agent's tunnel engine (``AgentConfig(tunnel_engine=attach)``): registers the tunnel verbs, their
    hooks and hello fields, and advertises ``capabilities.tunnel``. ``config`` None: no targets."""
    service = TunnelService(device, config or TunnelConfig())
    device.register("tunnel.open", service.open)
    device.register("tunnel.close", service.close)
    device.register("tunnel.ice_restart", service.ice_restart)
    device.add_shutdown_hook(service.shutdown)
    device.add_hello_provider(service.config.hello_fields)
    device.add_link_hook(service._on_link)
    device.capabilities.tunnel = True
    # an operator's first question when a tunnel is refused: what does this device offer?
    log.info("tunnel targets: %s", service.config.describe())
    return service
