"""A counting relay in front of a test registry: the upstream side of the hub's registry proxy, seen
from outside it. It forwards TCP both ways, counts the requests that go through it by path, and can
refuse connections whose first request comes from podman (``block_podman``): a registry a device
cannot reach while the hub still can; or every other one (``block_hub``): a registry the hub cannot
reach. ``podman_connections`` counts podman's connections, refused or not."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import trio

from tests.ports import free_port

_REQUEST = re.compile(rb"(GET|HEAD) (/v2/\S*) HTTP/1\.[01]\r\n")
MAX_HEAD = 64 << 10


@dataclass
class Relay:
    host: str  # 127.0.0.1:PORT, as an image reference names it
    upstream_port: int
    block_podman: bool = False
    block_hub: bool = False
    podman_connections: int = 0
    requests: Counter = field(default_factory=Counter)  # "GET /v2/…" -> how many
    bytes_down: int = 0  # bytes the registry sent through the relay
    refused: int = 0

    def blob_gets(self, digest: str | None = None) -> int:
        return sum(n for line, n in self.requests.items()
                   if line.startswith("GET ") and "/blobs/" in line and (digest is None or line.endswith(digest)))

    async def _serve(self, client: trio.SocketStream) -> None:
        seen = bytearray()
        with trio.move_on_after(120):
            async with client:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < MAX_HEAD:
                    chunk = await client.receive_some(65536)
                    if not chunk:
                        return
                    head += chunk
                from_podman = re.search(rb"(?i)\r\nuser-agent: containers/", head) is not None
                self.podman_connections += from_podman
                if (self.block_podman and from_podman) or (self.block_hub and not from_podman):
                    self.refused += 1
                    return  # the connection closes: the registry is down, for podman or the hub
                upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
                async with upstream, trio.open_nursery() as nursery:
                    async def up(data: bytes) -> None:
                        while data:
                            seen.extend(data)
                            last = bytes(seen).rfind(b"\r\n\r\n")
                            if last >= 0:  # whole request heads only (the hub's requests have no body)
                                for m in _REQUEST.finditer(bytes(seen[:last + 4])):
                                    self.requests[f"{m.group(1).decode()} {m.group(2).decode()}"] += 1
                                del seen[:last + 4]
                            await upstream.send_all(data)
                            data = await client.receive_some(65536)
                        nursery.cancel_scope.cancel()

                    async def down() -> None:
                        while chunk := await upstream.receive_some(65536):
                            self.bytes_down += len(chunk)
                            await client.send_all(chunk)
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(up, head)
                    nursery.start_soon(down)


async def start_relay(nursery: trio.Nursery, upstream_port: int) -> Relay:
    port = free_port()
    relay = Relay(f"127.0.0.1:{port}", upstream_port)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await relay._serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    await nursery.start(partial(trio.serve_tcp, handle, port, host="127.0.0.1"))
    return relay
