"""webrtc/checksum.py: zero checksums (RFC 9653) between two ends that both announce them, CRC32c
towards an end that does not, and the receive path that takes a zero checksum only once announced."""

from __future__ import annotations

import os
from struct import unpack_from

import pytest
from aiortc.rtcdtlstransport import RTCDtlsTransport
from aiortc.rtcsctptransport import RTCSctpTransport, crc32c, parse_packet

from tests.webrtc.peers import exchange
from tests.webrtc.test_packets import Association, chunks_of, main_thread_loop, original, packet  # noqa: F401
from tests.webrtc.test_pmtu import echo_pair
from webrtc import checksum
from webrtc.packets import cheaper_packets

INIT, INIT_ACK, SACK, DATA = 1, 2, 3, 0


def test_the_parameter_round_trips_and_only_dtls_counts():
    params: list[tuple[int, bytes]] = []
    assert checksum.announce(params)
    assert params == [(0x8001, b"\x00\x00\x00\x01")]
    assert checksum.announced(params)
    assert not checksum.announced([(0x8001, b"\x00\x00\x00\x02")])  # another error detection method
    assert not checksum.announced([(0x8001, b"")])
    assert not checksum.announced([(0x8000, b"")])


def test_a_zero_checksum_is_filled_in_as_aiortc_would_have_sent_it():
    chunk = chunks_of([(0, b"x" * 80, False)], first_tsn=3)[0]
    sent = packet([chunk])
    zeroed = sent[:8] + bytes(4) + sent[12:]
    assert checksum.with_crc(zeroed) == sent
    assert parse_packet(checksum.with_crc(zeroed))[3][0].user_data == b"x" * 80


def wire(monkeypatch) -> list[tuple[int, bytes]]:
    """Every SCTP packet either peer hands to DTLS: (which DTLS transport, the packet)."""
    cheaper_packets()  # send.py's _send_data in place first: this wraps it, not the other way round
    sent: list[tuple[int, bytes]] = []
    send_data = RTCDtlsTransport._send_data

    async def record(self, data: bytes) -> None:
        sent.append((id(self), data))
        await send_data(self, data)

    monkeypatch.setattr(RTCDtlsTransport, "_send_data", record)
    return sent


@pytest.mark.trio
async def test_two_ends_that_announce_it_send_zero_checksums_after_the_init(monkeypatch):
    sent = wire(monkeypatch)
    payload = os.urandom(300_000)
    async with echo_pair() as pair:
        associations = [peer.conn.pc.sctp for peer in (pair.client, pair.device)]
        assert [(a._fleethub_zero_in, a._fleethub_zero_out) for a in associations] == [(True, True)] * 2
        assert await exchange(pair.listen_port, payload) == payload
    inits = [data for _, data in sent if data[12] == INIT]
    assert inits and all(unpack_from("<L", d, 8)[0] == crc32c(d[:8] + bytes(4) + d[12:]) for d in inits)
    later = [data for _, data in sent if data[12] in (DATA, SACK)]
    assert len(later) > 400  # both ways: DATA and SACKs
    assert all(d[8:12] == bytes(4) for d in later)


@pytest.mark.trio
async def test_an_end_that_does_not_announce_it_gets_crc32c_and_its_zeros_are_taken(monkeypatch):
    sent = wire(monkeypatch)
    set_extensions = RTCSctpTransport._set_extensions

    def client_silent(self, params):
        # the INIT's sender (aiortc's SCTP client) as an end without RFC 9653: nothing announced
        set_extensions(self, params)
        if not self.is_server:
            params[:] = [p for p in params if p[0] != checksum.ZERO_CHECKSUM_ACCEPTABLE]
            self._fleethub_zero_in = False

    monkeypatch.setattr(RTCSctpTransport, "_set_extensions", client_silent)
    payload = os.urandom(300_000)
    async with echo_pair() as pair:
        associations = [peer.conn.pc.sctp for peer in (pair.client, pair.device)]
        silent = [a for a in associations if not a._fleethub_zero_in]
        assert len(silent) == 1
        told = next(a for a in associations if a is not silent[0])
        assert told._fleethub_zero_in and not told._fleethub_zero_out  # it was not told: CRC32c
        assert silent[0]._fleethub_zero_out  # the other end announced: zeros towards it
        assert await exchange(pair.listen_port, payload) == payload
        transports = {id(a.transport): a for a in associations}
    by_end = {id(a): [d for t, d in sent if transports.get(t) is a and d[12] in (DATA, SACK)] for a in associations}
    towards_silent = by_end[id(told)]
    assert towards_silent and all(d[8:12] != bytes(4) for d in towards_silent)
    assert all(d[8:12] == bytes(4) for d in by_end[id(silent[0])])


def test_a_zero_checksum_is_taken_only_by_an_end_that_announced_it(main_thread_loop):  # noqa: F811
    import asyncio

    messages = [(0, b"a" * 250, False), (1, b"b" * 120, False)]
    chunks = chunks_of(messages, first_tsn=50)
    # one DATA chunk a packet (the in-place path) and two bundled (aiortc's parse after the fill-in)
    packets = [packet([chunks[0]]), packet(chunks[1:3]), packet([chunks[3]]), packet([chunks[4]])]
    zeroed = [p[:8] + bytes(4) + p[12:] for p in packets]
    run = asyncio.get_event_loop().run_until_complete
    announced, silent, theirs = Association(50), Association(50), Association(50)
    announced.sctp._fleethub_zero_in = True
    for z, p in zip(zeroed, packets, strict=True):
        run(RTCSctpTransport._handle_data(announced.sctp, z))
        run(RTCSctpTransport._handle_data(silent.sctp, z))
        run(original(RTCSctpTransport, "_handle_data")(theirs.sctp, p))  # aiortc with the CRC32c
        assert announced.state() == theirs.state()
    assert [m[2] for m in announced.delivered] == [b"a" * 250, b"b" * 120]
    assert silent.delivered == [] and silent.sctp._last_received_tsn == 49  # dropped, as aiortc drops them
    # a wrong checksum that is not zero is still a wrong checksum
    bad = Association(50)
    bad.sctp._fleethub_zero_in = True
    run(RTCSctpTransport._handle_data(bad.sctp, packets[0][:8] + b"\x01\x02\x03\x04" + packets[0][12:]))
    assert bad.delivered == [] and bad.sctp._last_received_tsn == 49


# sha256 of the aiortc 1.16.0 methods checksum.py wraps (and, for _send_chunk, mirrors)
SOURCES = {
    "_send_chunk": "eb2f909e3c2ff5cc948062e5eeaee54868455940ea62c6c9162145a4550127e6",
}


def test_the_wrapped_methods_are_aiortcs_pinned_ones():
    import hashlib
    import inspect

    cheaper_packets()
    for name in ("_set_extensions", "_get_extensions", "_send_chunk"):
        fn = getattr(RTCSctpTransport, name)
        assert fn.__module__ == "webrtc.checksum", f"{name} is not replaced"
        source = inspect.getsource(inspect.unwrap(fn))
        got = hashlib.sha256(source.encode()).hexdigest()
        assert got == SOURCES.get(name, got), f"{name} changed: re-check webrtc/checksum.py, then pin {got}"
