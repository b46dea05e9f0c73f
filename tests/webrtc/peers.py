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


async def move_through_pair(size: int) -> bool:
    """A pair of peers (connect_pair) carries ``size`` random bytes from a TCP client to a TCP sink;
    whether they arrived whole. Fresh-interpreter tests run it to see what a session loads."""
    import os

    got = bytearray()
    done = trio.Event()

    async def sink(stream: trio.SocketStream) -> None:
        async with stream:
            while data := await stream.receive_some(1 << 16):
                got.extend(data)
                if len(got) >= size:
                    done.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, sink, 0, host="127.0.0.1"))
        pair = await connect_pair(listeners[0].socket.getsockname()[1])
        stream = await trio.open_tcp_stream("127.0.0.1", pair.listen_port)
        block = os.urandom(size)
        await stream.send_all(block)
        with trio.fail_after(60):
            await done.wait()
        await stream.aclose()
        await pair.client.close()
        await pair.device.close()
        nursery.cancel_scope.cancel()
    return bytes(got[:size]) == block


class ShellChannel:
    """The client end of a ``shell`` channel, as the browser terminal drives it (the same credit
    protocol as webrtc/forward.Pump): ``send`` keystrokes, ``resize``, read ``output``. Its methods
    run on the peers' asyncio thread; the trio-facing ones are ``open_shell`` and ``wait_for``."""

    def __init__(self, pc: Any) -> None:
        import json

        self._json = json
        self.output = bytearray()
        self.closed = False
        self.credit = 0
        self._consumed = 0
        self.channel = pc.createDataChannel("shell")
        self.channel.on("message", self._on_message)
        self.channel.on("close", self._on_close)
        # the receiver's first grant, as a Pump announces it: the device sends only within credit
        self.channel.on("open", lambda: self.channel.send(json.dumps({"credit": 2 * 1024 * 1024})))

    def _on_message(self, message: Any) -> None:
        if isinstance(message, str):
            control = self._json.loads(message)
            self.credit += control.get("credit", 0)
            return
        self.output += message
        self._consumed += len(message)
        if self._consumed >= 256 * 1024:
            self.channel.send(self._json.dumps({"credit": self._consumed}))
            self._consumed = 0

    def _on_close(self) -> None:
        self.closed = True

    def _send(self, data: bytes) -> None:
        assert len(data) <= self.credit, "the device has not granted credit for these bytes"
        self.credit -= len(data)
        self.channel.send(data)

    def _resize(self, cols: int, rows: int) -> None:
        self.channel.send(self._json.dumps({"resize": {"cols": cols, "rows": rows}}))

    def text(self) -> str:
        return self.output.decode("utf-8", "replace")


async def open_shell(peer: TunnelPeer) -> ShellChannel:
    """A ``shell`` channel from the client ``peer`` (connected), once the device granted credit."""

    async def make() -> ShellChannel:
        return ShellChannel(peer.conn.pc)

    shell = await peer._thread.run(make())
    while not shell.credit and not shell.closed:
        await trio.sleep(0.01)
    return shell


async def shell_send(peer: TunnelPeer, shell: ShellChannel, data: bytes) -> None:
    peer._thread.call_soon(shell._send, data)


async def shell_resize(peer: TunnelPeer, shell: ShellChannel, cols: int, rows: int) -> None:
    peer._thread.call_soon(shell._resize, cols, rows)


async def wait_output(shell: ShellChannel, needle: str, *, after: int = 0) -> None:
    """Until ``needle`` appears in the output past offset ``after`` (the caller bounds the wait)."""
    while needle not in shell.output[after:].decode("utf-8", "replace"):
        await trio.sleep(0.01)


async def connect_shell_pair(target: Any) -> Pair:
    """A connected pair whose device peer answers with ``target`` (e.g. device_tunnel.peer_target of a ShellTarget)."""
    restrict_host_addresses(["127.0.0.1"])
    client_control: list[dict[str, Any]] = []
    device_control: list[dict[str, Any]] = []
    client = TunnelPeer(on_control=client_control.append)
    device = TunnelPeer(on_control=device_control.append)
    offer = await client.create_offer()
    answer = await device.answer(offer, target=target)
    await client.set_answer(answer)
    await client.wait_control_open()
    return Pair(client, device, client_control, device_control, 0)
