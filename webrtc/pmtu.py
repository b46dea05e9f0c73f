"""DATA chunks as large as the path carries, once a probe has shown it carries them (issue 35).

aiortc cuts every message into DATA chunks of at most 1,160 bytes (``USERDATA_MAX_LENGTH``: a
1,189-byte SCTP packet). That is WebRTC's usual size, chosen to fit any path: a TURN relay's
framing, a VPN's, IPv6's 1,280-byte minimum. Almost all of a bulk copy's CPU is per packet (a DTLS
record sealed and opened, a datagram sent and received, a chunk parsed, acknowledged and reassembled
in Python), so the packet size sets CPU per MiB. ``python bench/tunnel_ab.py --pmtu`` (two peers in
one process, the size switched between copies on one association, 2026-11-28 21:22 UTC): 117.2 ms per
MiB at 1,160 bytes, 103.7 at 1,404, paired by round -20.8 ms.

What is done here, after packetization-layer path MTU discovery (RFC 8899, section 6.2.1 for SCTP):
once the association is established, each end sends a HEARTBEAT whose info is padded so that the SCTP
packet is as large as a full DATA packet of the bigger size would be, with the Don't Fragment bit set
and the kernel's own path MTU ignored (``DontFragment``: a probe cut into IP fragments would prove
nothing). Its peer echoes the info in a HEARTBEAT-ACK (RFC 9260, section 8.3). aiortc does; Chromium
echoed a 1,100-byte probe and left a 1,192-byte one unanswered (2026-11-28), so a browser keeps
aiortc's 1,160-byte chunks. The echo proves that a datagram of that size went whole through the path
that carries this end's data and that the peer's stack took it. Only then does this end cut new
messages in bigger chunks (``_fleethub_chunk``). No echo after ``ATTEMPTS`` probes (a smaller MTU on
the way, a peer that takes no larger packet): it stays at aiortc's size, and nothing else has changed.
A session through a TURN relay is not probed: the relay frames each datagram again on a leg this end
cannot probe. Linux only (the socket options).

How large: what a 1,500-byte path carries (Ethernet, and most of the internet), less the IP and UDP
headers of the socket's address family and the DTLS record overhead of the negotiated cipher. Not
more, even on loopback (which would carry 64 KiB): a bench figure must be what an operator's network
gives. IPv4 with AES-GCM: a 1,432-byte SCTP packet, 1,404 bytes of data per chunk.

Not handled: a path whose MTU falls in the middle of a session. A chunk already cut cannot be cut
again (SCTP has no re-fragmentation), so it relies on the kernel: the socket's mode is put back after
the probe, and on an ICMP "fragmentation needed" Linux fragments later datagrams of that size (IPv4,
IP_PMTUDISC_WANT, the UDP default). Where ICMP is filtered as well, such a session stalls like a TCP
connection in a PMTU black hole. ``FLEETHUB_TUNNEL_PMTU=0`` keeps aiortc's size for every session
(docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from typing import Any

from .closed import closed_send

log = logging.getLogger("fleethub.webrtc")

PATH_MTU = 1500  # the largest path probed for: Ethernet's
IP_UDP_HEADERS = {4: 20 + 8, 6: 40 + 8}
SCTP_COMMON_HEADER = 12
DATA_CHUNK_HEADER = 16
HEARTBEAT_HEADERS = 4 + 4  # the chunk header and the Heartbeat Info parameter's header
BASE_PACKET = 1189  # aiortc's SCTP_MAX_PACKET_LENGTH
ATTEMPTS = 3  # probes sent before giving up; one may be lost to congestion, three in a row are the path
WAIT = 0.5  # seconds each probe waits for its echo: far above a usable tunnel's round trip
TOKEN_BYTES = 16
AIORTC_CHUNK = 1160  # aiortc's USERDATA_MAX_LENGTH (tests/webrtc/test_pmtu.py checks), not imported for it

_applied = False


def chunk_of(sctp: Any) -> int:
    """DATA chunk bytes of an association: the size its probe confirmed, aiortc's otherwise. What
    messages are cut into (here), what a message is a multiple of (forward.py), what the window's floor
    and a burst are counted in (sctp.py)."""
    return getattr(sctp, "_fleethub_chunk", None) or AIORTC_CHUNK


def enabled() -> bool:
    # Linux only: elsewhere the probe could not be sent with the Don't Fragment bit (DontFragment)
    return sys.platform == "linux" and os.environ.get("FLEETHUB_TUNNEL_PMTU", "1") != "0"


def record_overhead(cipher: str | None) -> int:
    """Bytes a DTLS 1.2 record adds to its plaintext under ``cipher`` (OpenSSL's name): the 13-byte
    header, plus an AEAD's explicit nonce and tag, or for anything else the worst of CBC with SHA-1
    (an IV, a MAC and a full block of padding)."""
    name = (cipher or "").upper()
    if "CHACHA20" in name:
        return 13 + 16
    if "GCM" in name or "CCM" in name:
        return 13 + 8 + 16
    return 13 + 16 + 20 + 16


def probe_packet(family: int, overhead: int, path_mtu: int = PATH_MTU) -> int:
    """The largest SCTP packet (a multiple of 4: chunks are padded to it) whose DTLS record, in a UDP
    datagram of ``family``, fits a path of ``path_mtu`` bytes."""
    return (path_mtu - IP_UDP_HEADERS[family] - overhead) // 4 * 4


def chunk_for(packet: int) -> int:
    """The user data of one DATA chunk that fills an SCTP packet of ``packet`` bytes."""
    return packet - SCTP_COMMON_HEADER - DATA_CHUNK_HEADER


def heartbeat_info(token: bytes, packet: int) -> bytes:
    """A Heartbeat Info value that makes the HEARTBEAT's SCTP packet ``packet`` bytes long."""
    return token + bytes(packet - SCTP_COMMON_HEADER - HEARTBEAT_HEADERS - len(token))


def is_echo(params: list[tuple[int, bytes]], token: bytes, packet: int) -> bool:
    """Whether a HEARTBEAT-ACK's parameters echo the probe: the token, at the full length (a peer
    that truncated it did not carry the size)."""
    return any(kind == 1 and value[:len(token)] == token and len(value) == len(heartbeat_info(token, packet))
               for kind, value in params)


def probe_on_establish() -> None:
    """Every association probes its path once it is established; messages are cut in the chunk size
    the probe confirmed (aiortc's otherwise). Applied once per process, with the other SCTP changes."""
    global _applied
    if _applied:
        return
    from aiortc.rtcsctptransport import RTCSctpTransport

    set_state = RTCSctpTransport._set_state

    def set_state_and_probe(self: Any, state: Any) -> None:
        before = self._association_state
        set_state(self, state)
        if state == self.State.ESTABLISHED and before != state and enabled():
            asyncio.ensure_future(probe(self))

    set_state_and_probe.__wrapped__ = set_state  # type: ignore[attr-defined]
    RTCSctpTransport._set_state = set_state_and_probe  # type: ignore[method-assign]
    _send_in_chunks.__wrapped__ = RTCSctpTransport._send  # type: ignore[attr-defined]  # the one it mirrors
    RTCSctpTransport._send = _send_in_chunks  # type: ignore[method-assign]
    _applied = True


def _path(sctp: Any) -> tuple[int, int, Any] | None:
    """(address family, DTLS record overhead, UDP socket) of the association's path; None when it has
    none, or when a TURN server is on it: a relay frames each datagram again (4 or 36 bytes more, on a
    leg this end cannot probe with the Don't Fragment bit), so a relayed session keeps aiortc's size."""
    dtls = sctp.transport
    try:
        pair = dtls.transport._connection._nominated.get(1)
        cipher = dtls._ssl.get_cipher_name()
        if pair is None or "relay" in (pair.local_candidate.type, pair.remote_candidate.type):
            return None
        sock = pair.protocol.transport.get_extra_info("socket")
    except AttributeError:
        return None
    if sock is None:
        return None
    return (6 if sock.family == socket.AF_INET6 else 4), record_overhead(cipher), sock


# Linux's socket options for the Don't Fragment bit (not in Python's socket module): PROBE sets DF and
# ignores the path MTU the kernel learnt, so a probe is never cut into IP fragments, here or later
MTU_DISCOVER = {4: (socket.IPPROTO_IP, 10), 6: (socket.IPPROTO_IPV6, 23)}  # IP(V6)_MTU_DISCOVER
PMTUDISC_PROBE = 3


class DontFragment:
    """The socket's MTU discovery mode set to PROBE while the probe runs, then put back as it was (so
    that later, should the path's MTU fall, the kernel may fragment what SCTP retransmits)."""

    def __init__(self, sock: Any, family: int) -> None:
        self.sock, (self.level, self.option) = sock, MTU_DISCOVER[family]
        self.before: int | None = None

    def __enter__(self) -> bool:
        try:
            self.before = self.sock.getsockopt(self.level, self.option)
            self.sock.setsockopt(self.level, self.option, PMTUDISC_PROBE)
        except OSError:
            self.before = None
        return self.before is not None

    def __exit__(self, *exc: object) -> None:
        if self.before is not None:
            try:
                self.sock.setsockopt(self.level, self.option, self.before)
            except OSError:  # the socket closed meanwhile
                pass


async def probe(sctp: Any) -> int | None:
    """Probe the path of an established association; on an echo, set its chunk size and return it."""
    path = _path(sctp)
    if path is None:
        return None
    family, overhead, sock = path
    packet = probe_packet(family, overhead)
    if packet <= BASE_PACKET:
        return None
    with DontFragment(sock, family) as truthful:
        if not truthful:
            return None  # a probe the kernel might fragment proves nothing
        return await _probe(sctp, packet)


async def _probe(sctp: Any, packet: int) -> int | None:
    from aiortc.rtcsctptransport import HeartbeatAckChunk, HeartbeatChunk

    token = os.urandom(TOKEN_BYTES)
    echoed = asyncio.Event()
    receive_chunk = sctp._receive_chunk

    async def receive_and_watch(chunk: Any) -> None:
        # only while the probe waits (an attribute of this association, removed after): the chunks of
        # an established session go straight to aiortc's method
        if type(chunk) is HeartbeatAckChunk and is_echo(chunk.params, token, packet):
            echoed.set()
            return
        await receive_chunk(chunk)

    sctp._receive_chunk = receive_and_watch
    try:
        for _ in range(ATTEMPTS):
            if sctp._association_state != sctp.State.ESTABLISHED:
                return None
            heartbeat = HeartbeatChunk()
            heartbeat.params = [(1, heartbeat_info(token, packet))]
            try:
                await sctp._send_chunk(heartbeat)
            except Exception as exc:  # noqa: BLE001 — nobody awaits this task: see closed.closed_send
                if closed_send(exc):
                    return None  # the session closed meanwhile
                raise
            try:
                await asyncio.wait_for(echoed.wait(), WAIT)
            except asyncio.TimeoutError:
                continue
            sctp._fleethub_chunk = chunk_for(packet)
            log.debug("SCTP packets of %d bytes confirmed by the path: %d bytes per DATA chunk",
                      packet, sctp._fleethub_chunk)
            return sctp._fleethub_chunk
        log.info("the path did not carry a %d-byte SCTP packet (%d probes): chunks stay at aiortc's size",
                 packet, ATTEMPTS)
        return None
    finally:
        del sctp._receive_chunk


async def _send_in_chunks(self: Any, stream_id: int, pp_id: int, user_data: bytes, expiry: float | None = None,
                          max_retransmits: int | None = None, ordered: bool = True) -> None:
    """aiortc's ``RTCSctpTransport._send`` (1.16), with the chunk size of this association: the size
    its probe confirmed, aiortc's USERDATA_MAX_LENGTH otherwise. The rest is as aiortc does it: one
    TSN per fragment, the stream sequence number shared by a message's fragments, the counters each
    chunk carries, then ``_transmit``."""
    from aiortc.rtcsctptransport import (SCTP_DATA_FIRST_FRAG, SCTP_DATA_LAST_FRAG, SCTP_DATA_UNORDERED,
                                         DataChunk, tsn_plus_one, uint16_add)

    size = chunk_of(self)
    stream_seq = self._outbound_stream_seq.get(stream_id, 0) if ordered else 0
    fragments = -(-len(user_data) // size)  # math.ceil, as aiortc
    for fragment in range(fragments):
        chunk = DataChunk()
        chunk.flags = 0 if ordered else SCTP_DATA_UNORDERED
        if fragment == 0:
            chunk.flags |= SCTP_DATA_FIRST_FRAG
        if fragment == fragments - 1:
            chunk.flags |= SCTP_DATA_LAST_FRAG
        chunk.tsn = self._local_tsn
        chunk.stream_id = stream_id
        chunk.stream_seq = stream_seq
        chunk.protocol = pp_id
        chunk.user_data = user_data[fragment * size:(fragment + 1) * size]
        chunk._abandoned = False
        chunk._acked = False
        chunk._book_size = len(chunk.user_data)
        chunk._expiry = expiry
        chunk._in_flight = False
        chunk._max_retransmits = max_retransmits
        chunk._misses = 0
        chunk._retransmit = False
        chunk._sent_count = 0
        chunk._sent_time = None
        self._local_tsn = tsn_plus_one(self._local_tsn)
        self._outbound_queue.append(chunk)
    if ordered:
        self._outbound_stream_seq[stream_id] = uint16_add(stream_seq, 1)
    await self._transmit()
