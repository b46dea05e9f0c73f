"""One tunnel's WebRTC peer connection, driven from trio: the agent's side (device_tunnel.py).

The peer connection (connection.py) and everything it touches live on the shared asyncio thread
(loop.py); the methods here are trio coroutines that cross once per call. Control messages and
connection state changes come back to trio through the callbacks given at construction, called in
the trio thread. The ``fleethub tunnel`` CLI uses connection.py directly, on asyncio alone.
"""

from __future__ import annotations

import socket
from typing import Any, Callable

import trio

from . import loop as loop_mod
from .connection import PeerConnection
from .forward import Counters, Pump
from .marks import Marks


class TunnelPeer:
    def __init__(self, *, ice_servers: list[dict[str, Any]] | None = None, relay_only: bool = False,
                 on_control: Callable[[dict[str, Any]], None] | None = None,
                 on_state: Callable[[str], None] | None = None,
                 thread: loop_mod.AsyncioThread | None = None, marks: Marks | None = None) -> None:
        """Construct in trio: the callbacks are bound to the current trio run. ``marks`` gets "ice",
        "dtls" and "sctp" (the control channel open) as the connection reaches them (marks.py)."""
        self._thread = thread or loop_mod.shared()
        self._control_open = trio.Event()
        self.conn = PeerConnection(ice_servers=ice_servers, relay_only=relay_only,
                                   on_control=loop_mod.to_trio(on_control or (lambda _m: None)),
                                   on_state=loop_mod.to_trio(on_state or (lambda _s: None)),
                                   on_control_open=loop_mod.to_trio(self._control_open.set), marks=marks)

    @property
    def counters(self) -> Counters:
        return self.conn.counters

    @property
    def state(self) -> str:
        return self.conn.state

    async def create_offer(self) -> dict[str, str]:
        """The client's offer, with the ``control`` channel in it."""
        return await self._thread.run(self.conn.offer())

    async def set_answer(self, answer: dict[str, str]) -> None:
        await self._thread.run(self.conn.set_answer(answer))

    async def answer(self, offer: dict[str, str], *, target: tuple[str, int] | Callable[[Pump], Any],
                     bandwidth_bps: int | None = None) -> dict[str, str]:
        """The device's answer to ``offer`` (connection.py ``PeerConnection.answer``)."""
        return await self._thread.run(self.conn.answer(offer, target=target, bandwidth_bps=bandwidth_bps))

    async def wait_control_open(self) -> None:
        await self._control_open.wait()

    async def listen(self, host: str = "127.0.0.1", port: int = 0, *,
                     sock: socket.socket | None = None) -> tuple[str, int]:
        """Client: forward every TCP connection to ``host:port`` (or accepted on ``sock``) over its own
        channel; returns the address it listens on."""
        return await self._thread.run(self.conn.listen(host, port, sock=sock))

    async def stdio(self, fd_in: int, fd_out: int, on_closed: Callable[[], None]) -> None:
        """Client: forward ``fd_in``/``fd_out`` over one channel; ``on_closed`` is called (in trio) once
        that channel and the pipes are done."""
        await self._thread.run(self.conn.stdio(fd_in, fd_out, loop_mod.to_trio(on_closed)))

    def send_control(self, message: dict[str, Any]) -> None:
        """Queue a control message (sync: nothing to wait for; order is kept)."""
        self._thread.call_soon(self.conn.send_control, message)

    def uses_relay(self) -> bool:
        """Whether the selected ICE candidate pair goes through a TURN relay (either end)."""
        return self.conn.uses_relay()

    def candidate_pair(self) -> tuple[str, str] | None:
        return self.conn.candidate_pair()

    async def close(self) -> None:
        with trio.CancelScope(shield=True):
            await self._thread.run(self.conn.close())
