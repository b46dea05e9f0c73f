"""webrtc/pmtu.py: the path is probed once the association is up, and only an echo of the full size
makes the chunks bigger.

- Sizes, without IO: the probe's SCTP packet and a full DATA packet of the chunk it confirms are the
  same size, serialized by aiortc itself, and fit a 1,500-byte path with the negotiated cipher.
- The chunking that replaces aiortc's ``_send``: the same chunks as aiortc's at aiortc's size (its
  source pinned), and the bigger size when the probe confirmed one.
- Real peers on loopback: both ends confirm 1,404-byte chunks and a copy arrives whole in fewer packets.
  A path that drops datagrams over 1,300 bytes (both ways) leaves both at aiortc's size, and a copy
  still arrives whole. ``FLEETHUB_TUNNEL_PMTU=0`` sends no probe.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
from collections import deque
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest
import trio
from aiortc.rtcdtlstransport import RTCDtlsTransport
from aiortc.rtcsctptransport import (USERDATA_MAX_LENGTH, DataChunk, HeartbeatChunk, RTCSctpTransport,
                                     serialize_packet)

from tests.webrtc.peers import connect_pair, exchange, start_echo
from webrtc import forward, pmtu

# sha256 of aiortc 1.16.0's RTCSctpTransport._send, which pmtu._send_in_chunks mirrors with another size
VERIFIED_SEND = "f0f8aff63a9a87439230618a25e4e7db919f5001459f06281b4c08724ec395a6"


def aiortc_send():
    pmtu.probe_on_establish()
    return RTCSctpTransport._send.__wrapped__


def test_the_mirrored_send_is_aiortcs_pinned_one():
    source = inspect.getsource(aiortc_send())
    got = hashlib.sha256(source.encode()).hexdigest()
    assert got == VERIFIED_SEND, f"aiortc's _send changed: re-check webrtc/pmtu.py _send_in_chunks, then pin {got}"


@pytest.mark.parametrize(("cipher", "overhead"), [("ECDHE-ECDSA-AES128-GCM-SHA256", 37),
                                                  ("ECDHE-ECDSA-CHACHA20-POLY1305", 29),
                                                  ("ECDHE-RSA-AES256-SHA", 65), (None, 65)])
def test_record_overheads(cipher, overhead):
    assert pmtu.record_overhead(cipher) == overhead


@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("cipher", ["ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-SHA"])
def test_the_probe_and_a_full_data_packet_have_one_size_that_fits_the_path(family, cipher):
    overhead = pmtu.record_overhead(cipher)
    packet = pmtu.probe_packet(family, overhead)
    assert packet % 4 == 0 and packet > pmtu.BASE_PACKET
    assert packet + overhead + pmtu.IP_UDP_HEADERS[family] <= pmtu.PATH_MTU < packet + 4 + overhead + pmtu.IP_UDP_HEADERS[family]
    token = os.urandom(pmtu.TOKEN_BYTES)
    heartbeat = HeartbeatChunk()
    heartbeat.params = [(1, pmtu.heartbeat_info(token, packet))]
    data = DataChunk()
    data.flags, data.tsn, data.stream_id, data.stream_seq, data.protocol = 3, 1, 1, 0, 53
    data.user_data = os.urandom(pmtu.chunk_for(packet))
    assert len(serialize_packet(5000, 5000, 1, heartbeat)) == packet
    assert len(serialize_packet(5000, 5000, 1, data)) == packet
    assert pmtu.is_echo(heartbeat.params, token, packet)
    assert pmtu.chunk_for(pmtu.probe_packet(4, 37)) == 1404


def test_only_a_whole_echo_of_the_token_counts():
    token, packet = os.urandom(pmtu.TOKEN_BYTES), 1432
    info = pmtu.heartbeat_info(token, packet)
    assert pmtu.is_echo([(1, info)], token, packet)
    assert not pmtu.is_echo([(1, info[:-4])], token, packet)  # truncated: the size did not get through
    assert not pmtu.is_echo([(1, pmtu.heartbeat_info(os.urandom(16), packet))], token, packet)  # another probe's
    assert not pmtu.is_echo([(2, info)], token, packet)
    assert not pmtu.is_echo([], token, packet)


@pytest.mark.parametrize("family", [4, 6])
def test_a_probe_goes_with_the_dont_fragment_bit_and_the_socket_is_put_back(family):
    import socket

    sock = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        level, option = pmtu.MTU_DISCOVER[family]
        before = sock.getsockopt(level, option)
        with pmtu.DontFragment(sock, family) as truthful:
            assert truthful and sock.getsockopt(level, option) == pmtu.PMTUDISC_PROBE
        assert sock.getsockopt(level, option) == before != pmtu.PMTUDISC_PROBE
    with pmtu.DontFragment(sock, family) as truthful:  # closed: nothing can be promised, nothing probed
        assert not truthful


def fresh_association(chunk: int | None = None) -> SimpleNamespace:
    sent = []

    async def transmit() -> None:
        sent.append(len(state._outbound_queue))

    state = SimpleNamespace(_outbound_stream_seq={}, _local_tsn=4_294_967_290, _outbound_queue=deque(),
                            _transmit=transmit, transmits=sent)
    if chunk is not None:
        state._fleethub_chunk = chunk
    return state


def chunks_of(state: SimpleNamespace) -> list[tuple]:
    return [(c.flags, c.tsn, c.stream_id, c.stream_seq, c.protocol, c.user_data, c._book_size, c._sent_count,
             c._expiry, c._max_retransmits, c._abandoned, c._acked, c._in_flight, c._misses, c._retransmit,
             c._sent_time) for c in state._outbound_queue]


@pytest.mark.parametrize("size", [1, USERDATA_MAX_LENGTH, USERDATA_MAX_LENGTH + 1, 32 * 1024, 100_000])
@pytest.mark.parametrize("ordered", [True, False])
def test_at_aiortcs_size_the_chunks_are_aiortcs(size, ordered):
    message = os.urandom(size)
    mine, theirs = fresh_association(), fresh_association()
    for state, send in ((mine, pmtu._send_in_chunks), (theirs, aiortc_send())):
        for stream in (1, 1, 3):  # sequence numbers per stream, TSNs across them (wrapping past 2**32)
            asyncio.run(send(state, stream, 53, message, expiry=None, max_retransmits=None, ordered=ordered))
    assert chunks_of(mine) == chunks_of(theirs) and mine.transmits == theirs.transmits
    assert mine._outbound_stream_seq == theirs._outbound_stream_seq and mine._local_tsn == theirs._local_tsn


def test_with_a_confirmed_size_a_message_is_cut_in_chunks_of_that_size():
    state = fresh_association(chunk=1404)
    message = os.urandom(32 * 1024)
    asyncio.run(pmtu._send_in_chunks(state, 1, 53, message))
    chunks = list(state._outbound_queue)
    assert [len(c.user_data) for c in chunks] == [1404] * 23 + [32 * 1024 - 23 * 1404]
    assert b"".join(c.user_data for c in chunks) == message
    assert chunks[0].flags & 2 and chunks[-1].flags & 1 and not any(c.flags & 3 for c in chunks[1:-1])
    assert len({c.stream_seq for c in chunks}) == 1 and state._outbound_stream_seq == {1: 1}


@pytest.mark.parametrize("chunk, size", [(1404, 23 * 1404), (None, 28 * 1160), (1160, 28 * 1160),
                                         (1, 32 * 1024), (40_000, 32 * 1024)])
def test_a_message_is_whole_chunks_of_its_association(chunk, size, monkeypatch):
    channel = SimpleNamespace(transport=SimpleNamespace(_fleethub_chunk=chunk))
    assert forward.message_size(channel) == size <= forward.MESSAGE
    assert forward.AIORTC_CHUNK == USERDATA_MAX_LENGTH  # forward.py does not import aiortc for it
    monkeypatch.setattr(forward, "FIT_MESSAGES", False)  # the A/B's "before"
    assert forward.message_size(channel) == forward.MESSAGE


@asynccontextmanager
async def echo_pair():
    """Two real peers on loopback, the device's target a TCP echo server; closed after."""
    async with trio.open_nursery() as nursery:
        pair = await connect_pair(await start_echo(nursery))
        try:
            yield pair
        finally:
            await pair.client.close()
            await pair.device.close()
        nursery.cancel_scope.cancel()


async def wait_probes(pair, *, want, within: float = 5.0):
    associations = [peer.conn.pc.sctp for peer in (pair.client, pair.device)]
    with trio.move_on_after(within):
        while [getattr(a, "_fleethub_chunk", None) for a in associations] != [want, want]:
            await trio.sleep(0.02)
    return [getattr(a, "_fleethub_chunk", None) for a in associations]


@pytest.mark.trio
async def test_peers_on_loopback_confirm_bigger_chunks_and_a_copy_arrives_whole(monkeypatch):
    monkeypatch.delenv("FLEETHUB_TUNNEL_PMTU", raising=False)
    data_sizes = []
    send_chunk = RTCSctpTransport._send_chunk

    async def watch(self, chunk) -> None:
        if isinstance(chunk, DataChunk):
            data_sizes.append(len(chunk.user_data))
        await send_chunk(self, chunk)

    monkeypatch.setattr(RTCSctpTransport, "_send_chunk", watch)
    payload = os.urandom(3 << 20)
    async with echo_pair() as pair:
        assert await wait_probes(pair, want=1404) == [1404, 1404]  # IPv4, AES-GCM: a 1,500-byte path
        for peer in (pair.client, pair.device):  # the ICE socket's mode put back after the probe
            pair_ = peer.conn.pc.sctp.transport.transport._connection._nominated[1]
            sock = pair_.protocol.transport.get_extra_info("socket")
            assert sock.getsockopt(*pmtu.MTU_DISCOVER[4]) != pmtu.PMTUDISC_PROBE
        data_sizes.clear()  # the control channel's messages before
        assert await exchange(pair.listen_port, payload) == payload
        # there and back: every byte in chunks of at most 1,404 bytes; at aiortc's size it would take
        # 5,424 or more
        assert max(data_sizes) == 1404 and sum(data_sizes) >= 2 * len(payload), (max(data_sizes), sum(data_sizes))
        assert len(data_sizes) < 2 * len(payload) / 1300, len(data_sizes)
        # a message is whole chunks (forward.message_size: 23 of them, not 32 KiB's 23 and a third):
        # a short chunk ends only a message that took all the bytes there were (18 of 4,498 here;
        # with 32 KiB messages 1 in 24 is short, and 2.8 % more chunks carry the same bytes)
        short = [n for n in data_sizes if n < 1404]
        assert len(short) < len(data_sizes) / 40, (len(short), len(data_sizes))


@pytest.mark.trio
async def test_a_path_that_drops_large_datagrams_keeps_aiortcs_size_and_still_carries_a_copy(monkeypatch):
    monkeypatch.delenv("FLEETHUB_TUNNEL_PMTU", raising=False)
    monkeypatch.setattr(pmtu, "WAIT", 0.1)
    dropped = []
    send_data = RTCDtlsTransport._send_data

    async def narrow_path(self, data: bytes) -> None:
        # the records of both peers go through here: a path of 1,300-byte datagrams, both ways
        if len(data) > 1300 - 37:  # the plaintext, before its 37 bytes of record
            dropped.append(len(data))
            return
        await send_data(self, data)

    monkeypatch.setattr(RTCDtlsTransport, "_send_data", narrow_path)
    payload = os.urandom(1 << 20)
    async with echo_pair() as pair:
        await trio.sleep(pmtu.ATTEMPTS * pmtu.WAIT + 0.5)
        assert await wait_probes(pair, want=None, within=0) == [None, None]
        assert len(dropped) == 2 * pmtu.ATTEMPTS and set(dropped) == {1432}, dropped  # each end's probes
        assert await exchange(pair.listen_port, payload) == payload
        assert len(dropped) == 2 * pmtu.ATTEMPTS  # no DATA packet was over the path's size


@pytest.mark.trio
async def test_the_switch_off_sends_no_probe(monkeypatch):
    monkeypatch.setenv("FLEETHUB_TUNNEL_PMTU", "0")
    probes = []
    send_chunk = RTCSctpTransport._send_chunk

    async def watch(self, chunk) -> None:
        if isinstance(chunk, HeartbeatChunk):
            probes.append(chunk)
        await send_chunk(self, chunk)

    monkeypatch.setattr(RTCSctpTransport, "_send_chunk", watch)
    async with echo_pair() as pair:
        await trio.sleep(0.5)
        assert await wait_probes(pair, want=None, within=0) == [None, None]
        assert probes == []
        assert await exchange(pair.listen_port, b"still a tunnel") == b"still a tunnel"
