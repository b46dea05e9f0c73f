"""The DTLS records one loop turn produces leave in one ``sendmsg``, segmented by the kernel (UDP GSO).

aiortc sends each DTLS record as it makes it: ``_send_data`` encrypts, ``_write_ssl`` reads the
record and awaits aioice's ``Connection.send``, ``sendto`` and ``StunProtocol.send_data`` down to
asyncio's ``transport.sendto``: a system call, and a pass through the kernel's UDP and IP stack, per
1,200-byte chunk. SCTP sends a window's worth of chunks in one go (``_transmit``), so here the
records are collected and sent once the loop has worked off what is ready (``call_soon``): a run of
records of one size goes out as one ``sendmsg`` with ``UDP_SEGMENT`` (Linux 4.18 and later), and
the kernel, or the network card, cuts it into the same datagrams, each of one record, that
one ``sendto`` each would have sent. Nothing changes on the wire: the datagrams, their sizes and
their order are the same; over a real network the kernel or the card does the cutting, so this
holds beyond loopback.

Order is kept: records of one transport leave in the order they were made, and when asyncio holds
some of its own (its socket buffer was full) the rest queue behind them through ``transport.sendto``.
The first refusal of ``UDP_SEGMENT`` (an old kernel; EIO from a card without checksum offload)
turns it off for the process and the records go one ``sendto`` each. Only a pair of plain UDP
candidates (host, server-reflexive) on asyncio's own socket transport is batched: a pair relayed by
this end wraps each record for the TURN server (aioice's TurnTransport) and goes aiortc's way. A record made while ICE has no pair, or sent after the connection
closed, is dropped at the flush instead of raising in ``_send_data``: SCTP treats it as lost.

Applied on Linux only (elsewhere a batch would buy nothing); FLEETHUB_AIORTC_AS_IS=1 or
FLEETHUB_SEND_EACH=1 leave aiortc's own. Measured A/B in docs/tunnel-performance.md.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
import sys
from typing import Any

from .records import bindings, seal

log = logging.getLogger("fleethub.webrtc")

UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)  # linux/udp.h
SOL_UDP = getattr(socket, "SOL_UDP", 17)
MAX_SEGMENTS = 64  # the kernel's UDP_MAX_SEGMENTS
MAX_BATCH = 65507 - 1500  # bytes in one sendmsg: one IPv4 UDP datagram's payload, less a margin

# what says this kernel or card cannot segment (anything else is the network's, reported per datagram)
REFUSALS = {errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP}

_applied = False
_gso = True  # off for the process after the kernel's first refusal


def send_batched() -> None:
    global _applied
    if (_applied or sys.platform != "linux" or os.environ.get("FLEETHUB_AIORTC_AS_IS")
            or os.environ.get("FLEETHUB_SEND_EACH")):
        return
    from asyncio.selector_events import _SelectorDatagramTransport  # type: ignore[attr-defined]

    from aioice.ice import StunProtocol
    from aiortc.rtcdtlstransport import RTCDtlsTransport, State

    send_data = RTCDtlsTransport._send_data
    connected = State.CONNECTED

    async def send(self: Any, data: bytes) -> None:
        connection = getattr(self.transport, "_connection", None)
        pair = connection._nominated.get(1) if connection is not None else None
        # a relayed pair's StunProtocol sends through aioice's TurnTransport, not a socket
        if (self._state is not connected or pair is None or type(pair.protocol) is not StunProtocol
                or type(getattr(pair.protocol, "transport", None)) is not _SelectorDatagramTransport):
            await send_data(self, data)  # aiortc's own, with its errors
            return
        # aiortc's _send_data and _write_ssl, the record kept instead of sent (records.py: OpenSSL's
        # calls without pyOpenSSL's wrapping; an encryption error raised as Connection.send raises it)
        record = seal(self._ssl, data)
        if record:
            self._RTCDtlsTransport__tx_bytes += len(record)
            self._RTCDtlsTransport__tx_packets += 1
            outbox = getattr(self, "_fleethub_outbox", None)
            if outbox is None:
                outbox = self._fleethub_outbox = Outbox(connection)
            outbox.add(record)

    send.__wrapped__ = send_data  # type: ignore[attr-defined]
    RTCDtlsTransport._send_data = send  # type: ignore[method-assign]
    RTCDtlsTransport._write_ssl = flushing_first(RTCDtlsTransport._write_ssl)  # type: ignore[method-assign]
    _applied = True


def has_output(ssl: Any) -> bool:
    """Whether OpenSSL has written a record to send: its outgoing memory BIO holds bytes (asked
    without reading, which raises WantReadError when it is empty). True when the BIO cannot be asked.
    Asked after every record received: pyOpenSSL's bindings are looked up once (records.py), not
    imported at each call (1.05 -> 0.20 us a call)."""
    bio = getattr(ssl, "_from_ssl", None)
    if bio is None:
        return True
    ffi, lib = bindings()
    return lib.BIO_get_mem_data(bio, ffi.NULL) > 0


def flushing_first(write_ssl: Any) -> Any:
    """``_write_ssl`` sends at once what OpenSSL wrote outside ``send`` (an alert such as the
    close_notify of ``stop()``, a handshake retransmission): the records this loop turn queued go
    first, or a close made in the same turn as the last data would overtake it and the peer, closed
    by it, would drop the data that follows. The outbox is flushed only when OpenSSL has something
    to send: a record received (which calls this every time) leaves the turn's batch whole; and with
    nothing to send, nothing further is called."""
    async def write_ssl_after_outbox(self: Any) -> None:
        if not has_output(self._ssl):
            return  # nothing to send (the common case, after a data record): asked once, not again inside
        outbox = getattr(self, "_fleethub_outbox", None)
        if outbox is not None and outbox.records:
            outbox.flush()
        await write_ssl(self)

    write_ssl_after_outbox.__wrapped__ = write_ssl  # type: ignore[attr-defined]
    return write_ssl_after_outbox


class Outbox:
    """One DTLS transport's records waiting for the end of the loop turn."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.records: list[bytes] = []
        self.sendmsgs = 0  # tests/webrtc/test_send.py

    def add(self, record: bytes) -> None:
        if not self.records:
            asyncio.get_running_loop().call_soon(self.flush)
        self.records.append(record)

    def flush(self) -> None:
        records, self.records = self.records, []
        pair = self.connection._nominated.get(1)
        transport = getattr(pair.protocol, "transport", None) if pair is not None else None
        if transport is None or transport.is_closing():
            return  # ICE closed under the association: lost, as a datagram the network dropped
        send_runs(transport, pair.remote_addr, records, self)


def runs(records: list[bytes]) -> list[tuple[int, int]]:
    """(start, end) of each batch: records of one size, the last of a batch may be shorter (what
    UDP_SEGMENT cuts: every segment but the last is exactly the size given)."""
    out, i, n = [], 0, len(records)
    while i < n:
        size = len(records[i])
        limit = min(MAX_SEGMENTS, max(1, MAX_BATCH // size))
        j = i + 1
        while j < n and j - i < limit and len(records[j]) == size:
            j += 1
        if j < n and j - i < limit and len(records[j]) < size:
            j += 1
        out.append((i, j))
        i = j
    return out


def send_runs(transport: Any, addr: Any, records: list[bytes], outbox: Outbox | None = None) -> None:
    global _gso
    raw = getattr(transport, "_sock", None)  # asyncio's get_extra_info("socket") has no sendmsg
    for start, end in runs(records):
        batch = records[start:end]
        if len(batch) == 1 or not _gso or raw is None or transport.get_write_buffer_size():
            for record in batch:
                transport.sendto(record, addr)
            continue
        try:
            raw.sendmsg([b"".join(batch)], [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", len(batch[0])))], 0, addr)
        except (BlockingIOError, InterruptedError):
            for record in batch:  # asyncio buffers them and sends when the socket is writable
                transport.sendto(record, addr)
        except OSError as exc:
            if exc.errno in REFUSALS:
                _gso = False
                log.info("UDP segmentation offload refused (%s): one sendto per datagram", exc)
            for record in batch:  # and asyncio reports any other error as it would have
                transport.sendto(record, addr)
        else:
            if outbox is not None:
                outbox.sendmsgs += 1
