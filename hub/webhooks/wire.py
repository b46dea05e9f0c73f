"""HTTP/1.1 for webhook deliveries: h11 over trio's TCP (and TLS) streams, connections kept alive.

A delivery is one small POST and the first ``EXCERPT_BYTES`` of its answer. httpx did that through its
client, auth, redirect, cookie and transport layers, and with the receiver on the same machine those
layers were most of the hub's cost of a delivery (bench/events.py, py-spy: ``AsyncClient.stream`` about
two thirds of it), which capped one endpoint at a few hundred events a second. Here a request is one
``send_all`` of what h11 writes, and the answer is read only as far as the excerpt and the rest of a
small body (a keep-alive connection must be left at a message boundary); a longer body closes the
connection instead of being read.

``Pool`` holds one endpoint's idle connections (at most ``MAX_IDLE``: parallel lanes each take one).
A connection is made to the address ``check_destination`` approved for the URL's host (unless private
addresses are allowed), so a DNS answer that changes between the check and the connect cannot move a
delivery into the hub's network; TLS verifies the certificate against the URL's host name. A kept
connection the receiver closed while idle fails at its first read: the request is sent once more on a
fresh connection (a delivery may be repeated anyway: receivers deduplicate on ``webhook-id``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import h11
import trio

from hub.images import check_destination
from device_client.shared import outbound_tls

EXCERPT_BYTES = 1024
MAX_DRAIN = 64 * 1024  # more answer than this after the excerpt: close rather than read it all
MAX_IDLE = 8
USER_AGENT = "fleethub-webhooks/1"


@dataclass(frozen=True)
class Target:
    scheme: str  # http or https
    host: str  # the URL's host name (TLS's server name), brackets stripped
    port: int
    authority: str  # the Host header: host[:port] as the URL wrote it
    path: bytes  # path and query


class StaleConnection(Exception):
    """A kept connection closed before any byte of the answer (the receiver dropped it while idle)."""


class Connection:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.reused = False

    async def post(self, target: Target, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, bool]:
        """(status, the answer's first bytes, whether the connection may carry another request)."""
        h = self.h11
        fields = [("Host", target.authority), ("User-Agent", USER_AGENT), ("Content-Length", str(len(body))),
                  *headers.items()]
        await self.stream.send_all(h.send(h11.Request(method="POST", target=target.path, headers=fields))
                                   + h.send(h11.Data(data=body)) + h.send(h11.EndOfMessage()))
        status, kept, read = 0, bytearray(), 0
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                chunk = await self.stream.receive_some(65536)
                if not chunk and status == 0 and self.reused:
                    raise StaleConnection()
                h.receive_data(chunk)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                kept += event.data[:max(0, EXCERPT_BYTES - len(kept))]
                read += len(event.data)
                if read > EXCERPT_BYTES + MAX_DRAIN:
                    return status, bytes(kept), False
            elif isinstance(event, h11.EndOfMessage):
                reusable = h.our_state is h11.DONE and h.their_state is h11.DONE
                if reusable:
                    h.start_next_cycle()
                    self.reused = True
                return status, bytes(kept), reusable
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("the receiver closed the connection before its answer ended")
            # an InformationalResponse (100 Continue) needs nothing

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(self.stream)


class Pool:
    """One endpoint's kept connections."""

    def __init__(self, *, allow_private: bool, tls: ssl.SSLContext | None = None) -> None:
        """``tls``: what HTTPS receivers' certificates are checked against (default: the system's
        trust store, host names checked)."""
        self.allow_private = allow_private
        self._idle: dict[Target, list[Connection]] = {}
        self._tls = tls

    async def post(self, target: Target, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """(status, the answer's first ``EXCERPT_BYTES``); an error of the connection raises."""
        idle = self._idle.get(target)
        conn = idle.pop() if idle else await self._connect(target)
        try:
            try:
                status, excerpt, reusable = await conn.post(target, body, headers)
            except (StaleConnection, trio.BrokenResourceError, ConnectionResetError, BrokenPipeError):
                if not conn.reused:
                    raise
                await conn.aclose()  # the receiver dropped it while idle: once more, on a new one
                conn = await self._connect(target)
                status, excerpt, reusable = await conn.post(target, body, headers)
        except BaseException:
            await conn.aclose()
            raise
        idle = self._idle.setdefault(target, [])
        if reusable and len(idle) < MAX_IDLE:
            idle.append(conn)
        else:
            await conn.aclose()
        return status, excerpt

    async def _connect(self, target: Target) -> Connection:
        address = None if self.allow_private else await check_destination(
            f"[{target.host}]:{target.port}" if ":" in target.host else f"{target.host}:{target.port}", ())
        stream: trio.abc.Stream = await trio.open_tcp_stream(address or target.host, target.port)
        if target.scheme == "https":
            if self._tls is None:  # made once per process, off the loop (outbound_tls.py says why)
                self._tls = await outbound_tls.system_default()
            tls = trio.SSLStream(stream, self._tls, server_hostname=target.host, https_compatible=True)
            try:
                await tls.do_handshake()
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            stream = tls
        return Connection(stream)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                await conn.aclose()
        self._idle.clear()
