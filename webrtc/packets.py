"""aiortc's per-packet work, made cheaper where it does not change a byte on the wire.

A tunnel's bulk copy is CPU-bound in Python on both peers (issue 35): every 1,200-byte DATA chunk is a
DTLS record, an SCTP packet and a UDP datagram, and aiortc does some work per chunk that only matters
in a rare case. Each replacement below keeps aiortc's result for every input and only skips work that
would find nothing to do; each was measured A/B with two peers in one process, 32 MiB one way, CPU
ms per MiB of both peers together (the figures in docs/tunnel-performance.md and bench/RESULTS.md):

- ``InboundStream.pop_messages`` rescans the stream's reassembly list from its start after every
  chunk, looking for a complete message: for a 32 KiB message (28 chunks) that is about 400 steps,
  most of them on chunks already seen. A chunk that arrives after every other one of its stream
  (``add_chunk`` appended it) and is not a message's last fragment cannot complete any message (a
  message is a run of consecutive TSNs ending in a last fragment), so the scan is skipped for it; a
  last fragment, an unordered chunk or one that filled a gap still scans as before.
- ``RTCDtlsTransport._write_ssl`` runs after every record received, to send what OpenSSL may have
  to answer (a handshake retransmission, an alert). For a data record there is nothing, and
  pyOpenSSL says so by raising WantReadError from ``bio_read``: an exception per packet. The length
  of OpenSSL's outgoing memory BIO is asked first, and nothing is read when it is empty.
- ``RTCSctpTransport._mark_received`` sorts and filters its sets of misordered and duplicate TSNs
  for every chunk. A chunk that is the next TSN in order, with nothing misordered, only advances the
  cumulative TSN (and drops duplicates it now covers): that is what the general path computes.
- ``RTCSctpTransport._handle_data`` parses a packet into a list of chunk objects, counts its INIT
  chunks, then awaits ``_receive_chunk`` (an ``isinstance`` chain and a debug log) and
  ``_receive_data_chunk`` for each chunk. Under a bulk copy almost every packet is one DATA chunk
  with the next TSN in order, or one SACK: for such a packet (checksum and verification tag checked
  as aiortc checks them, a checksum of zero taken as checked where checksum.py agreed to it, nothing
  misordered, aiortc's debug log off) a DATA chunk's fields are read with one ``unpack_from`` and
  ``_receive_data_chunk``'s steps run in place, with the same replaced methods (``add_chunk``,
  ``pop_messages``), and a SACK is made by aiortc's own ``SackChunk`` from its bytes and handed to
  ``_receive_chunk``; then the same SACK call as aiortc's. Any other packet goes aiortc's way whole.
  ``python bench/tunnel_ab.py --data-in-place``: -9.6 ms per MiB paired for DATA alone (2026-11-30,
  slow host). FLEETHUB_SCTP_PARSE_EVERY_PACKET=1 turns this one off alone.
- aioice's ``StunProtocol.datagram_received`` parses every datagram as STUN first and hands it on
  as data when the parse raises ValueError: an exception per packet. RFC 7983 section 7 tells the
  protocols apart by the first byte, and a datagram starting with 20-63 goes straight on as data.
  A DTLS 1.0 or 1.2 record (what OpenSSL's DTLS_METHOD speaks) never parsed as STUN: its bytes 2-3,
  read as STUN's length, are 0xfd00 or more, far past the datagram's end.

Two more, each in its own module and applied from here (the same switch turns them off):
receive.py handles a DTLS datagram of an established association in aioice's datagram callback
(no queue, no task wake per datagram); send.py sends the DTLS records of a loop turn in one
``sendmsg`` with UDP_SEGMENT, the kernel cutting the same datagrams. Measured A/B with two peers in
one process on one association, the change switched between interleaved 8 MiB copies
(bench/tunnel_ab.py, 8 rounds, 2026-11-28 04:45 UTC at load average 0.9; CPU ms per MiB of both
peers and the TCP ends, median): 62.4 with this module's changes alone, 59.9 with receive.py
(paired median -2.5), 56.6 with send.py (-5.9), 56.3 with both (-6.2, about 10 %); at 05:03 UTC,
load 1-3, 69.7 / 65.1 / 66.5 / 64.5 (both: -4.9).

Applied once per process, like sctp.py's changes, to the methods it expects to find; with another
aiortc, check they still exist and do what the docstrings above say before trusting the figures.
FLEETHUB_AIORTC_AS_IS=1 leaves aiortc's own (the A/B's "before").
"""

from __future__ import annotations

import os
from typing import Any

from .checksum import zero_checksums
from .receive import receive_inline
from .send import has_output, send_batched

_applied = False


def cheaper_packets() -> None:
    global _applied
    if _applied or os.environ.get("FLEETHUB_AIORTC_AS_IS"):
        return
    from aiortc.rtcdtlstransport import RTCDtlsTransport
    from aiortc.rtcsctptransport import SCTP_DATA_LAST_FRAG, SCTP_DATA_UNORDERED, InboundStream, RTCSctpTransport
    from aiortc.utils import uint32_gt

    _scan_only_when_complete(InboundStream, SCTP_DATA_LAST_FRAG | SCTP_DATA_UNORDERED)
    _write_ssl_only_when_pending(RTCDtlsTransport)
    _in_order_fast(RTCSctpTransport, uint32_gt)
    _one_chunk_in_place(RTCSctpTransport)
    zero_checksums()
    _dtls_straight_on()
    receive_inline()
    send_batched()
    _applied = True


def _scan_only_when_complete(stream_cls: Any, scan_flags: int) -> None:
    add_chunk, pop_messages = stream_cls.add_chunk, stream_cls.pop_messages

    def add_and_note(self: Any, chunk: Any) -> None:
        add_chunk(self, chunk)
        self._fleethub_scan = bool(chunk.flags & scan_flags) or self.reassembly[-1] is not chunk

    def pop_when_possible(self: Any) -> Any:
        # a FORWARD TSN (its own caller) or anything but add_chunk leaves no note: scan as before
        if getattr(self, "_fleethub_scan", True):
            return pop_messages(self)
        self._fleethub_scan = True
        return iter(())

    add_and_note.__wrapped__ = add_chunk  # type: ignore[attr-defined]  # tests/webrtc/test_packets.py compares
    pop_when_possible.__wrapped__ = pop_messages  # type: ignore[attr-defined]
    stream_cls.add_chunk = add_and_note
    stream_cls.pop_messages = pop_when_possible


def _write_ssl_only_when_pending(cls: Any) -> None:
    write_ssl = cls._write_ssl

    async def write_if_pending(self: Any) -> None:
        if not has_output(self._ssl):
            return  # OpenSSL wrote nothing: bio_read would raise WantReadError, and aiortc send nothing
        await write_ssl(self)

    write_if_pending.__wrapped__ = write_ssl  # type: ignore[attr-defined]
    cls._write_ssl = write_if_pending


def _in_order_fast(cls: Any, uint32_gt: Any) -> None:
    mark_received = cls._mark_received

    def mark(self: Any, tsn: int) -> bool:
        if self._sack_misordered or tsn != (self._last_received_tsn + 1) % (1 << 32):
            return mark_received(self, tsn)
        self._last_received_tsn = tsn
        if self._sack_duplicates:
            self._sack_duplicates = [x for x in self._sack_duplicates if uint32_gt(x, tsn)]
        return False

    mark.__wrapped__ = mark_received  # type: ignore[attr-defined]
    cls._mark_received = mark


def _dtls_straight_on() -> None:
    from aioice.ice import StunProtocol

    datagram_received = StunProtocol.datagram_received

    def receive(self: Any, data: Any, addr: Any) -> None:
        if data and 19 < data[0] < 64:
            self.receiver.data_received(data, self.local_candidate.component)
            return
        datagram_received(self, data, addr)

    receive.__wrapped__ = datagram_received  # type: ignore[attr-defined]
    StunProtocol.datagram_received = receive


ONE_CHUNK_IN_PLACE = True  # False: every packet through aiortc's _handle_data (bench/tunnel_ab.py --data-in-place)


def _one_chunk_in_place(cls: Any) -> None:
    import logging
    from struct import unpack_from

    from aiortc.rtcsctptransport import DataChunk, InboundStream, SackChunk, uint32_gt

    from .checksum import ZERO, crc_of, with_crc

    global ONE_CHUNK_IN_PLACE
    ONE_CHUNK_IN_PLACE = not os.environ.get("FLEETHUB_SCTP_PARSE_EVERY_PACKET")  # the A/B's "before", across processes
    handle_data = cls._handle_data
    if not hasattr(cls, "_fleethub_zero_in"):
        cls._fleethub_zero_in = False  # checksum.py sets it per association that announced zero checksums
    aiortc_log = logging.getLogger("aiortc.rtcsctptransport")

    def _crc_ok(data: bytes) -> bool:
        return crc_of(data) == unpack_from("<L", data, 8)[0]

    def aiortcs_way(self: Any, data: bytes, zero: bool) -> Any:
        # aiortc's _handle_data, the packet's CRC32c filled in first where it came as zero
        return handle_data(self, with_crc(data) if zero else data)

    async def handle(self: Any, data: bytes) -> None:
        # the packet's layout (RFC 9260 3): a 12-byte common header (ports, verification tag,
        # checksum), then the chunk's 4-byte header; for DATA 12 bytes of TSN, stream, sequence and
        # PPID follow. A checksum of zero, once this end announced it takes them (checksum.py), was
        # checked by DTLS.
        size = len(data)
        zero = self._fleethub_zero_in and data[8:12] == ZERO
        kind = data[12] if size > 16 else None
        if not ONE_CHUNK_IN_PLACE or (kind != 0 and kind != 3) or aiortc_log.isEnabledFor(logging.DEBUG):
            await aiortcs_way(self, data, zero)
            return
        tag, flags, length = unpack_from("!4xL5xBH", data)
        # exactly one chunk (aiortc's parse: padded to 4 bytes, nothing after), of this association
        if 12 + length + (-length % 4) != size or tag != self._local_verification_tag:
            await aiortcs_way(self, data, zero)
            return
        if kind == 3:  # a SACK: aiortc's parse of its one chunk, then what _handle_data does with it
            if length < 16 or not (zero or _crc_ok(data)):
                await aiortcs_way(self, data, zero)
                return
            await self._receive_chunk(SackChunk(flags=flags, body=data[16:12 + length]))
            if self._sack_needed:
                await self._send_sack()
            return
        # DATA longer than its header (so its TSN and the rest are there), nothing misordered, the
        # next TSN in order
        if length <= 16 or self._sack_misordered:
            await aiortcs_way(self, data, zero)
            return
        tsn, stream_id, stream_seq, protocol = unpack_from("!LHHL", data, 16)
        if tsn != (self._last_received_tsn + 1) & 0xFFFFFFFF:
            await aiortcs_way(self, data, zero)
            return
        if not (zero or _crc_ok(data)):
            return  # aiortc's parse raises ValueError and _handle_data drops the packet
        chunk = DataChunk.__new__(DataChunk)
        chunk.flags, chunk.tsn, chunk.stream_id, chunk.stream_seq, chunk.protocol = (
            flags, tsn, stream_id, stream_seq, protocol)
        chunk.user_data = user_data = data[28:12 + length]
        # _receive_data_chunk, with _mark_received for the next TSN in order (_in_order_fast)
        self._sack_needed = True
        self._last_received_tsn = tsn
        if self._sack_duplicates:
            self._sack_duplicates = [x for x in self._sack_duplicates if uint32_gt(x, tsn)]
        streams = self._inbound_streams
        stream = streams.get(stream_id)
        if stream is None:
            stream = streams[stream_id] = InboundStream()
        stream.add_chunk(chunk)
        self._advertised_rwnd -= len(user_data)
        for message in stream.pop_messages():
            self._advertised_rwnd += len(message[2])
            await self._receive(*message)
        if self._reconfig_deferred is not None:
            await self._reset_deferred_streams()
        if self._sack_needed:
            await self._send_sack()

    handle.__wrapped__ = handle_data  # type: ignore[attr-defined]
    cls._handle_data = handle
