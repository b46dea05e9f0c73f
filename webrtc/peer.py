"""One tunnel's WebRTC peer connection (aiortc), driven from trio.

The RTCPeerConnection and everything it touches live on the shared asyncio thread (loop.py); the
methods here are trio coroutines that cross once per call. The client side (``create_offer``,
``set_answer``, ``listen``) opens the ``control`` channel and one ``tcp`` channel per accepted TCP
connection; the device side (``answer``) accepts them and connects each ``tcp`` channel to its
target. Control messages and connection state changes come back to trio through the callbacks given
at construction, called in the trio thread.

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

import trio

from . import loop as loop_mod
from .forward import Counters, Pump, bucket_for
from .listener import Listener, listening_socket
from .marks import Marks
from .packets import cheaper_packets
from .pmtu import probe_on_establish
from .sctp import batch_sacks

log = logging.getLogger("fleethub.webrtc")

CLOSE_FLUSH = 0.5  # seconds to let a last control message (closing) leave before the abort
# aioice logs every ICE check and state change at INFO (about 18 lines a session on each peer);
# aiortc its transports' states. Operators read the agent's and the CLI's logs for the one line
# that says a tunnel opened or closed, so below DEBUG these libraries only speak up for WARNING.
CHATTY = ("aioice", "aiortc")


def quiet_ice_logs(extra: tuple[str, ...] = ()) -> None:
    """Send the ICE libraries' INFO chatter (and ``extra`` loggers') to DEBUG: shown only when the
    process logs at DEBUG. A level someone set on those loggers explicitly is left alone."""
    if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        return
    for name in CHATTY + extra:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def _ice_configuration(ice_servers: list[dict[str, Any]], relay_only: bool) -> Any:
    from aiortc import RTCConfiguration, RTCIceServer
    from aiortc.rtcconfiguration import RTCIceTransportPolicy

    servers = [RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
               for s in ice_servers if s.get("urls")]
    return RTCConfiguration(iceServers=servers,
                            iceTransportPolicy=RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL)


class TunnelPeer:
    def __init__(self, *, ice_servers: list[dict[str, Any]] | None = None, relay_only: bool = False,
                 on_control: Callable[[dict[str, Any]], None] | None = None,
                 on_state: Callable[[str], None] | None = None,
                 thread: loop_mod.AsyncioThread | None = None, marks: Marks | None = None) -> None:
        """Construct in trio: the callbacks are bound to the current trio run. ``marks`` gets "ice",
        "dtls" and "sctp" (the control channel open) as the connection reaches them (marks.py)."""
        loop_mod.restrict_host_addresses()
        batch_sacks()
        probe_on_establish()
        cheaper_packets()
        quiet_ice_logs()
        self._thread = thread or loop_mod.shared()
        self._ice_servers = list(ice_servers or [])
        self._relay_only = relay_only
        self._marks = marks
        self._on_control = loop_mod.to_trio(on_control or (lambda _m: None))
        self._on_state = loop_mod.to_trio(on_state or (lambda _s: None))
        self.counters = Counters()
        self.state = "new"
        # the pair ICE nominated, kept once seen: aioice forgets it when the connection closes, which
        # can come (the far end leaving) before the session counts its last bytes by path
        self._pair: tuple[str, str] | None = None
        self._pc: Any = None
        self._control: Any = None
        self._pumps: set[Pump] = set()
        self._listener: Listener | None = None
        self._target: tuple[str, int] | Callable[[Pump], Any] | None = None
        self._limit_out = self._limit_in = None
        self._bandwidth: int | None = None
        self._control_open = trio.Event()
        self._mark_control_open = loop_mod.to_trio(self._control_open.set)

    # ---- trio-facing ----

    async def create_offer(self) -> dict[str, str]:
        """The client's offer, with the ``control`` channel in it."""
        return await self._thread.run(self._offer())

    async def set_answer(self, answer: dict[str, str]) -> None:
        await self._thread.run(self._set_answer(answer))

    async def answer(self, offer: dict[str, str], *, target: tuple[str, int] | Callable[[Pump], Any],
                     bandwidth_bps: int | None = None) -> dict[str, str]:
        """The device's answer to ``offer``. A ``(host, port)`` target: each ``tcp`` channel is connected
        to it. A callable target (the ``shell`` target, device_tunnel.py ``peer_target``): each ``shell`` channel's
        Pump is handed to it, a coroutine function run on the asyncio side. Any other channel is closed."""
        self._target = target
        self._bandwidth = bandwidth_bps
        return await self._thread.run(self._answer(offer))

    async def wait_control_open(self) -> None:
        await self._control_open.wait()

    async def listen(self, host: str = "127.0.0.1", port: int = 0, *,
                     sock: socket.socket | None = None) -> tuple[str, int]:
        """Client: forward every TCP connection to ``host:port`` (or accepted on ``sock``, a socket the
        caller bound and listens on) over its own channel; returns the address it listens on."""
        return await self._thread.run(self._listen(host, port, sock))

    async def stdio(self, fd_in: int, fd_out: int, on_closed: Callable[[], None]) -> None:
        """Client: forward ``fd_in``/``fd_out`` (an OpenSSH ProxyCommand's pipes) over one channel;
        ``on_closed`` is called (in trio) once that channel and the pipes are done."""
        await self._thread.run(self._stdio(fd_in, fd_out, loop_mod.to_trio(on_closed)))

    def send_control(self, message: dict[str, Any]) -> None:
        """Queue a control message (sync: nothing to wait for; order is kept)."""
        self._thread.call_soon(self._send_control, json.dumps(message, separators=(",", ":")))

    def uses_relay(self) -> bool:
        """Whether the selected ICE candidate pair goes through a TURN relay (either end)."""
        pair = self._selected_pair()
        return pair is not None and "relay" in pair

    def candidate_pair(self) -> tuple[str, str] | None:
        return self._selected_pair()

    async def close(self) -> None:
        with trio.CancelScope(shield=True):
            await self._thread.run(self._close())

    # ---- the asyncio side ----

    def _new_pc(self) -> Any:
        from aiortc import RTCPeerConnection

        pc = RTCPeerConnection(_ice_configuration(self._ice_servers, self._relay_only))

        @pc.on("iceconnectionstatechange")
        def ice_changed() -> None:
            if self._marks is not None and pc.iceConnectionState == "completed":
                self._marks.mark("ice")

        @pc.on("connectionstatechange")
        def changed() -> None:
            if pc.connectionState == "connected":
                self._selected_pair()
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
            self._mark_control_open()

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

    async def _offer(self) -> dict[str, str]:
        self._pc = self._new_pc()
        self._watch_control(self._pc.createDataChannel("control"))
        await self._pc.setLocalDescription(await self._pc.createOffer())
        return {"sdp": self._pc.localDescription.sdp, "type": self._pc.localDescription.type}

    async def _set_answer(self, answer: dict[str, str]) -> None:
        from aiortc import RTCSessionDescription

        await self._pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))

    async def _answer(self, offer: dict[str, str]) -> dict[str, str]:
        from aiortc import RTCSessionDescription

        loop = asyncio.get_running_loop()
        self._limit_out = bucket_for(self._bandwidth, loop.time())
        self._limit_in = bucket_for(self._bandwidth, loop.time())
        pc = self._pc = self._new_pc()

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

    async def _listen(self, host: str, port: int, sock: socket.socket | None) -> tuple[str, int]:
        def accept() -> asyncio.Protocol:
            sctp = self._pc.sctp
            if sctp is None or sctp.state != "connected":
                return _Refuse()  # the peer connection is gone: a channel would never open
            return self._pump(self._pc.createDataChannel("tcp"))

        self._listener = Listener(sock if sock is not None else listening_socket(host, port), accept)
        return self._listener.address

    async def _stdio(self, fd_in: int, fd_out: int, on_closed: Callable[[], None]) -> None:
        from .stdio import connect_stdio

        pump = self._pump(self._pc.createDataChannel("tcp"))
        discard = pump.on_closed

        def closed(p: Pump) -> None:
            if discard is not None:
                discard(p)
            on_closed()

        pump.on_closed = closed
        await connect_stdio(pump, fd_in, fd_out)

    def _send_control(self, text: str) -> None:
        if self._control is not None and self._control.readyState == "open":
            self._control.send(text)

    def _selected_pair(self) -> tuple[str, str] | None:
        # aiortc has no getSelectedCandidatePair; aioice keeps the nominated pair per component, and
        # nominates once (no ICE restart), so the first pair seen is the pair for the whole session.
        if self._pair is None:
            try:
                pair = self._pc.sctp.transport.transport._connection._nominated.get(1)
            except AttributeError:
                pair = None
            if pair is not None:
                self._pair = pair.local_candidate.type, pair.remote_candidate.type
        return self._pair

    async def _close(self) -> None:
        if self._listener is not None:
            # before the pumps are closed below: no connection is taken after that
            await self._listener.close()
        if self._pc is None:
            return
        sctp = self._pc.sctp
        # stopping SCTP aborts the association; give queued messages (a last "closing") a moment
        deadline = asyncio.get_running_loop().time() + CLOSE_FLUSH
        while sctp is not None and asyncio.get_running_loop().time() < deadline and any(
                getattr(sctp, name, None) for name in ("_data_channel_queue", "_outbound_queue", "_sent_queue")):
            await asyncio.sleep(0.01)
        for pump in list(self._pumps):
            pump.close()
        with contextlib.suppress(Exception):
            await self._pc.close()


class _Refuse(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()
