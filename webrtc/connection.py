"""One tunnel's WebRTC peer connection (aiortc), on asyncio: what a tunnel does, with no trio in it.

Everything here runs on the asyncio loop that runs aiortc: the agent's asyncio thread (loop.py), where
peer.py's ``TunnelPeer`` drives it from trio, or the main loop of the ``fleethub tunnel`` CLI, which
has no trio at all (client.py): an OpenSSH ProxyCommand starts at every ``ssh``, and trio's import was
about a sixth of that start (docs/tunnel-performance.md). The callbacks given at construction are
called on that loop.

The client side (``offer``, ``set_answer``, ``listen``, ``stdio``) opens the ``control`` channel and
one ``tcp`` channel per accepted TCP connection; the device side (``answer``) accepts them and
connects each ``tcp`` channel to its target.

Offers and answers carry every candidate (aiortc gathers before it returns a description), so no
trickle ICE is needed. aiortc cannot restart ICE on a live connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from typing import Any, Callable

from .forward import Counters, Pump, bucket_for
from .ice import ice_configuration, quiet_ice_logs, restrict_host_addresses
from .listener import Listener, listening_socket
from .marks import Marks
from .packets import cheaper_packets
from .pmtu import probe_on_establish
from .sctp import batch_sacks

log = logging.getLogger("fleethub.webrtc")

CLOSE_FLUSH = 0.5  # seconds to let a last control message (closing) leave before the abort


def _ignore(*_args: Any) -> None:
    return None


def change_aiortc() -> None:
    """Apply this package's changes to aiortc and aioice (sctp.py, pmtu.py, packets.py and what it
    applies), once per process; the first PeerConnection does. A test that wraps one of the changed
    methods must come after this (tests/webrtc/conftest.py): a wrapper put on first would be wrapped
    or replaced in turn, and its undo would take the change away for the rest of the process."""
    batch_sacks()
    probe_on_establish()
    cheaper_packets()


class PeerConnection:
    def __init__(self, *, ice_servers: list[dict[str, Any]] | None = None, relay_only: bool = False,
                 on_control: Callable[[dict[str, Any]], None] | None = None,
                 on_state: Callable[[str], None] | None = None,
                 on_control_open: Callable[[], None] | None = None, marks: Marks | None = None) -> None:
        """Plain set-up, no IO: may be made on any thread. ``marks`` gets "ice", "dtls" and "sctp" (the
        control channel open) as the connection reaches them (marks.py)."""
        restrict_host_addresses()
        change_aiortc()
        quiet_ice_logs()
        self._ice_servers = list(ice_servers or [])
        self._relay_only = relay_only
        self._marks = marks
        self._on_control = on_control or _ignore
        self._on_state = on_state or _ignore
        self._on_control_open = on_control_open or _ignore
        self.counters = Counters()
        self.state = "new"
        # the pair ICE nominated, kept once seen: aioice forgets it when the connection closes, which
        # can come (the far end leaving) before the session counts its last bytes by path
        self._pair: tuple[str, str] | None = None
        self.pc: Any = None
        self._control: Any = None
        self._pumps: set[Pump] = set()
        self._listener: Listener | None = None
        self._target: tuple[str, int] | Callable[[Pump], Any] | None = None
        self._limit_out = self._limit_in = None

    # ---- the client's side ----

    async def offer(self) -> dict[str, str]:
        """The client's offer, with the ``control`` channel in it."""
        self.pc = self._new_pc()
        self._watch_control(self.pc.createDataChannel("control"))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return {"sdp": self.pc.localDescription.sdp, "type": self.pc.localDescription.type}

    async def set_answer(self, answer: dict[str, str]) -> None:
        from aiortc import RTCSessionDescription

        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))

    async def listen(self, host: str = "127.0.0.1", port: int = 0, *,
                     sock: socket.socket | None = None) -> tuple[str, int]:
        """Forward every TCP connection to ``host:port`` (or accepted on ``sock``, a socket the caller
        bound and listens on) over its own channel; returns the address it listens on."""
        def accept() -> asyncio.Protocol:
            sctp = self.pc.sctp
            if sctp is None or sctp.state != "connected":
                return _Refuse()  # the peer connection is gone: a channel would never open
            return self._pump(self.pc.createDataChannel("tcp"))

        self._listener = Listener(sock if sock is not None else listening_socket(host, port), accept)
        return self._listener.address

    async def stdio(self, fd_in: int, fd_out: int, on_closed: Callable[[], None]) -> None:
        """Forward ``fd_in``/``fd_out`` (an OpenSSH ProxyCommand's pipes) over one channel;
        ``on_closed`` is called once that channel and the pipes are done."""
        from .stdio import connect_stdio

        pump = self._pump(self.pc.createDataChannel("tcp"))
        discard = pump.on_closed

        def closed(p: Pump) -> None:
            if discard is not None:
                discard(p)
            on_closed()

        pump.on_closed = closed
        await connect_stdio(pump, fd_in, fd_out)

    # ---- the device's side ----

    async def answer(self, offer: dict[str, str], *, target: tuple[str, int] | Callable[[Pump], Any],
                     bandwidth_bps: int | None = None) -> dict[str, str]:
        """The device's answer to ``offer``. A ``(host, port)`` target: each ``tcp`` channel is connected
        to it. A callable target (the ``shell`` target, device_tunnel.py ``peer_target``): each ``shell``
        channel's Pump is handed to it, a coroutine function run on this loop. Any other channel is closed."""
        from aiortc import RTCSessionDescription

        self._target = target
        loop = asyncio.get_running_loop()
        self._limit_out = bucket_for(bandwidth_bps, loop.time())
        self._limit_in = bucket_for(bandwidth_bps, loop.time())
        pc = self.pc = self._new_pc()

        @pc.on("datachannel")
        def on_channel(channel: Any) -> None:
            if channel.label == "control" and self._control is None:
                self._watch_control(channel)
            elif channel.label == "tcp" and isinstance(self._target, tuple):
                pump = self._pump(channel)
                asyncio.ensure_future(self._connect(pump))
            elif channel.label == "shell" and callable(self._target):
                asyncio.ensure_future(self._target(self._pump(channel)))
            else:
                channel.close()

        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer["sdp"], type=offer["type"]))
        await pc.setLocalDescription(await pc.createAnswer())
        return {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type}

    # ---- either side ----

    def send_control(self, message: dict[str, Any]) -> None:
        """Send a control message now if the channel is open (order is kept)."""
        if self._control is not None and self._control.readyState == "open":
            self._control.send(json.dumps(message, separators=(",", ":")))

    def candidate_pair(self) -> tuple[str, str] | None:
        """The (local, remote) candidate types of the pair ICE nominated, once there is one."""
        # aiortc has no getSelectedCandidatePair; aioice keeps the nominated pair per component, and
        # nominates once (no ICE restart), so the first pair seen is the pair for the whole session.
        if self._pair is None:
            try:
                pair = self.pc.sctp.transport.transport._connection._nominated.get(1)
            except AttributeError:
                pair = None
            if pair is not None:
                self._pair = pair.local_candidate.type, pair.remote_candidate.type
        return self._pair

    def uses_relay(self) -> bool:
        """Whether the selected ICE candidate pair goes through a TURN relay (either end)."""
        pair = self.candidate_pair()
        return pair is not None and "relay" in pair

    async def close(self) -> None:
        if self._listener is not None:
            # before the pumps are closed below: no connection is taken after that
            await self._listener.close()
        if self.pc is None:
            return
        sctp = self.pc.sctp
        # stopping SCTP aborts the association; give queued messages (a last "closing") a moment, when
        # there is an association to carry them (a session refused before it connected has only the
        # control channel's unsent open in its queue: waiting for it delayed every refusal by 0.5 s)
        deadline = asyncio.get_running_loop().time() + CLOSE_FLUSH
        while sctp is not None and sctp.state == "connected" and asyncio.get_running_loop().time() < deadline and any(
                getattr(sctp, name, None) for name in ("_data_channel_queue", "_outbound_queue", "_sent_queue")):
            await asyncio.sleep(0.01)
        for pump in list(self._pumps):
            pump.close()
        with contextlib.suppress(Exception):
            await self.pc.close()

    # ---- inside ----

    def _new_pc(self) -> Any:
        from aiortc import RTCPeerConnection

        pc = RTCPeerConnection(ice_configuration(self._ice_servers, self._relay_only))

        @pc.on("iceconnectionstatechange")
        def ice_changed() -> None:
            if self._marks is not None and pc.iceConnectionState == "completed":
                self._marks.mark("ice")

        @pc.on("connectionstatechange")
        def changed() -> None:
            if pc.connectionState == "connected":
                self.candidate_pair()
                if self._marks is not None:
                    self._marks.mark("dtls")  # aiortc's "connected": ICE and DTLS both are
            self.state = pc.connectionState
            self._on_state(pc.connectionState)

        return pc

    def _watch_control(self, channel: Any) -> None:
        self._control = channel

        def opened() -> None:
            if self._marks is not None:
                self._marks.mark("sctp")
            self._on_control_open()

        @channel.on("message")
        def message(text: Any) -> None:
            if not isinstance(text, str):
                return
            try:
                decoded = json.loads(text)
            except ValueError:
                return
            if isinstance(decoded, dict):
                self._on_control(decoded)

        if channel.readyState == "open":
            opened()
        else:
            channel.on("open", opened)

    def _pump(self, channel: Any) -> Pump:
        pump = Pump(channel, self.counters, limit_out=self._limit_out, limit_in=self._limit_in,
                    on_closed=self._pumps.discard)
        self._pumps.add(pump)
        return pump

    async def _connect(self, pump: Pump) -> None:
        assert self._target is not None
        host, port = self._target
        try:
            await asyncio.get_running_loop().create_connection(lambda: pump, host, port)
        except OSError as exc:
            log.info("tunnel target %s:%d refused a connection: %s", host, port, exc)
            pump.close()


class _Refuse(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()
