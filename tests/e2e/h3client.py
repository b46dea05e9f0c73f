"""A minimal HTTP/3 client on aioquic (asyncio), for tests: one GET, the status, headers and body."""

from __future__ import annotations

import asyncio
import ssl

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration


class _H3Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiters: dict[int, asyncio.Future] = {}
        self.responses: dict[int, dict] = {}

    def quic_event_received(self, event) -> None:
        for h3_event in self.h3.handle_event(event):
            response = self.responses.setdefault(h3_event.stream_id, {"headers": {}, "body": b""})
            if isinstance(h3_event, HeadersReceived):
                response["headers"].update({k.decode(): v.decode() for k, v in h3_event.headers})
            elif isinstance(h3_event, DataReceived):
                response["body"] += h3_event.data
            if getattr(h3_event, "stream_ended", False):
                waiter = self.waiters.pop(h3_event.stream_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(response)

    async def get(self, authority: str, path: str, headers: dict[str, str]) -> dict:
        stream_id = self._quic.get_next_available_stream_id()
        self.h3.send_headers(stream_id, [(b":method", b"GET"), (b":scheme", b"https"),
                                         (b":authority", authority.encode()), (b":path", path.encode()),
                                         *[(k.lower().encode(), v.encode()) for k, v in headers.items()]],
                             end_stream=True)
        waiter = self.waiters[stream_id] = asyncio.get_running_loop().create_future()
        self.transmit()
        return await asyncio.wait_for(waiter, 10)


async def _get(host: str, port: int, path: str, cafile: str, headers: dict[str, str]) -> dict:
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_REQUIRED)
    config.load_verify_locations(cafile)
    async with connect(host, port, configuration=config, create_protocol=_H3Client) as client:
        response = await client.get(f"{host}:{port}", path, headers)
        response["status"] = int(response["headers"][":status"])
        return response


def h3_get(host: str, port: int, path: str, *, cafile: str, headers: dict[str, str] | None = None) -> dict:
    """Blocking: run one HTTP/3 GET on a fresh asyncio loop."""
    return asyncio.run(_get(host, port, path, cafile, headers or {}))
