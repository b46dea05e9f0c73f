"""Helpers for the tunnel tests: a TCP echo target and a connected pair of real aiortc peers on loopback."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from webrtc.loop import restrict_host_addresses
from webrtc.peer import TunnelPeer


async def echo_handler(stream: trio.SocketStream) -> None:
    async with stream:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                await stream.send_eof()
                return
            await stream.send_all(data)


async def start_echo(nursery: trio.Nursery) -> int:
    """A TCP echo server on 127.0.0.1; returns its port."""
    listeners = await nursery.start(partial(trio.serve_tcp, echo_handler, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1]


async def exchange(port: int, payload: bytes, *, chunk: int = 65536) -> bytes:
    """Send ``payload`` to 127.0.0.1:port, half-close, and read everything that comes back."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = bytearray()
    async with stream:
        async def send() -> None:
            for i in range(0, len(payload), chunk):
                await stream.send_all(payload[i:i + chunk])
            await stream.send_eof()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            while True:
                data = await stream.receive_some(1 << 20)
                if not data:
                    break
                received += data
    return bytes(received)


@dataclass
class Pair:
    client: TunnelPeer
    device: TunnelPeer
    client_control: list[dict[str, Any]]
    device_control: list[dict[str, Any]]
    listen_port: int


async def connect_pair(target_port: int, *, bandwidth_bps: int | None = None) -> Pair:
    restrict_host_addresses(["127.0.0.1"])
    client_control: list[dict[str, Any]] = []
    device_control: list[dict[str, Any]] = []
    client = TunnelPeer(on_control=client_control.append)
    device = TunnelPeer(on_control=device_control.append)
    offer = await client.create_offer()
    answer = await device.answer(offer, target=("127.0.0.1", target_port), bandwidth_bps=bandwidth_bps)
    await client.set_answer(answer)
    await client.wait_control_open()
    _, port = await client.listen("127.0.0.1", 0)
    return Pair(client, device, client_control, device_control, port)
