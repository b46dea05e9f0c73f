"""A real nats-server (Debian's nats-server package, see Makefile system-deps) on a free 127.0.0.1 port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.ports import free_port

NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"


class NatsServer:
    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"nats://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"nats-server exited with {self.proc.returncode}")
                time.sleep(0.02)
        raise RuntimeError("nats-server did not listen within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@contextmanager
def running_nats() -> Iterator[NatsServer]:
    if not shutil.which("nats-server") and not shutil.os.path.exists(NATS_SERVER):
        pytest.skip("nats-server is not installed (make system-deps)")
    server = NatsServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


class CuttableLink:
    """A TCP forwarder in front of the nats-server (or PostgreSQL: any TCP server, ``url`` aside) for one
    node: ``cut`` drops its connections and refuses new ones (the node is cut off from that server
    alone, tests/cluster/test_node_bus_liveness.py uses it so for PostgreSQL); ``restore`` listens again on
    the same port. ``stall`` keeps every connection open but passes no more bytes either way (a network
    that drops packets: nobody sees a close); ``heal`` drops the stalled connections and forwards again.
    Start with ``await nursery.start(link.run)``."""

    def __init__(self, target_port: int) -> None:
        import trio

        self.target_port = target_port
        self.port = 0
        self._flowing = trio.Event()
        self._flowing.set()
        self._scope: "trio.CancelScope | None" = None
        self._nursery: "trio.Nursery | None" = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def run(self, task_status=None) -> None:
        import trio

        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._serve)
            if task_status is not None:
                task_status.started(self)
            await trio.sleep_forever()

    async def _serve(self, task_status) -> None:
        import trio

        async def pipe(src, dst) -> None:
            try:
                async for chunk in src:
                    await self._flowing.wait()  # stalled: the bytes go nowhere, nobody is told
                    await dst.send_all(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                with trio.CancelScope(shield=True):
                    await dst.aclose()

        async def handle(client) -> None:
            await self._flowing.wait()
            upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
            async with trio.open_nursery() as pair:
                pair.start_soon(pipe, client, upstream)
                pair.start_soon(pipe, upstream, client)

        with trio.CancelScope() as scope:
            self._scope = scope
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            self.port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as conns:
                await conns.start(trio.serve_listeners, handle, listeners)
                task_status.started()

    def cut(self) -> None:
        assert self._scope is not None
        self._scope.cancel()  # the listener and every forwarded connection close

    async def restore(self) -> None:
        assert self._nursery is not None
        await self._nursery.start(self._serve)

    def stall(self) -> None:
        import trio

        self._flowing = trio.Event()

    async def heal(self) -> None:
        self.cut()  # what was stalled goes: the client's next connection is a clean one
        self._flowing.set()
        await self.restore()
