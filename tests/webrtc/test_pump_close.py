"""A Pump closed before asyncio connects its socket (no IO: a stand-in channel and transport)."""

from __future__ import annotations

import asyncio

from webrtc.forward import Counters, Pump


class Channel:
    """What a Pump uses of an aiortc data channel that has not opened yet."""

    readyState = "connecting"
    bufferedAmountLowThreshold = 0

    def __init__(self) -> None:
        self.closed = False

    def on(self, event, handler) -> None:
        pass

    def close(self) -> None:
        self.closed = True
        self.readyState = "closed"


class Transport:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int) -> None:
        pass


def test_a_socket_connected_after_its_session_closed_is_closed_not_left_open():
    # asyncio calls the protocol factory at accept and connection_made a loop turn later; a session
    # closed in between (TunnelPeer._close closes every pump) must not leave that socket open: its
    # client would wait forever (a CI hang in tests/webrtc/test_peer.py, 2026-11)
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        channel = Channel()
        pump = Pump(channel, Counters())
        pump.close()
        transport = Transport()
        pump.connection_made(transport)
        assert transport.closed and channel.closed
    finally:
        asyncio.set_event_loop(None)
        loop.close()
