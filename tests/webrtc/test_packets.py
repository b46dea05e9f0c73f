"""webrtc/packets.py replaces six methods of aiortc and aioice by versions that skip work finding
nothing to do. Each must give aiortc's own result: here the replacement and the method it wraps
(``__wrapped__``) run side by side on the same inputs, including reordered, duplicated and
retransmitted chunks, and the sources they were verified against are pinned."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import random
from importlib.metadata import version
from types import SimpleNamespace
from typing import Any

import pytest
from aioice.ice import StunProtocol
from aiortc.rtcdtlstransport import RTCDtlsTransport
from aiortc.rtcsctptransport import (SCTP_DATA_FIRST_FRAG, SCTP_DATA_LAST_FRAG, SCTP_DATA_UNORDERED, DataChunk,
                                     InboundStream, RTCSctpTransport)

from webrtc.packets import cheaper_packets

# sha256 of each replaced method's source in the versions it was verified against: another aiortc or
# aioice fails here until the replacement is checked against the new source (packets.py's docstring)
VERIFIED = {"aiortc": "1.16.0", "aioice": "0.13.0"}
SOURCES = {
    "InboundStream.add_chunk": "de934faf324b1b4bfb9ac0c25e221a5babb436944e33f9972ca8f8cee26ee8b7",
    "InboundStream.pop_messages": "bd29de9aa7c4f8fda274a3f62feb85adb80add14f76ca79ad5b53da5cc10f3e3",
    "RTCSctpTransport._mark_received": "2ac68b6a3934ca87cf9d9383d4dd764a8fbef83c9d06f9a0435bedde7df46499",
    "RTCDtlsTransport._write_ssl": "6573c0237063bdf0df41ede543428ea6e669020e86b93e8484bbac9c9730a54a",
    "StunProtocol.datagram_received": "ff4c8b910d45fb3a9e50c4391fe5cbaba33dcba669fea9e847e19a5c99b9bfbb",
    "RTCSctpTransport._handle_data": "8661b724e20776bbf9af6f68a828cfb952d2deb617d7a9e0f143d641bdae95e2",
    # not replaced, but its steps are what the in-place DATA path does
    "RTCSctpTransport._receive_data_chunk": "790c2bb8cd0f5dd735cb051ac669ccc5749a25965fb19a6aeb740fc861563048",
}


@pytest.fixture(autouse=True, scope="module")
def applied() -> None:
    cheaper_packets()


def original(cls: Any, name: str) -> Any:
    """aiortc's own method under the replacements (send.py wraps packets.py's ``_write_ssl`` again)."""
    fn = getattr(cls, name)
    return inspect.unwrap(fn) if hasattr(fn, "__wrapped__") else None


def test_every_replacement_is_applied_and_wraps_aiortcs_own():
    for cls, name in ((InboundStream, "add_chunk"), (InboundStream, "pop_messages"),
                      (RTCSctpTransport, "_mark_received"), (RTCDtlsTransport, "_write_ssl"),
                      (StunProtocol, "datagram_received"), (RTCSctpTransport, "_handle_data")):
        wrapped = original(cls, name)
        assert wrapped is not None, f"{cls.__name__}.{name} is not replaced"
        assert wrapped.__module__.split(".")[0] in ("aiortc", "aioice")


def test_the_wrapped_sources_are_the_verified_ones():
    assert {name: version(name) for name in VERIFIED} == VERIFIED
    for key, digest in SOURCES.items():
        cls_name, name = key.split(".")
        cls = {"InboundStream": InboundStream, "RTCSctpTransport": RTCSctpTransport,
               "RTCDtlsTransport": RTCDtlsTransport, "StunProtocol": StunProtocol}[cls_name]
        got = hashlib.sha256(inspect.getsource(original(cls, name) or getattr(cls, name)).encode()).hexdigest()
        assert got == digest, f"{key} changed in this aiortc/aioice: re-check webrtc/packets.py, then pin {got}"


def chunks_of(messages: list[tuple[int, bytes, bool]], first_tsn: int) -> list[DataChunk]:
    """DATA chunks of (stream_seq, payload, unordered) messages, 100 bytes of payload per chunk."""
    out, tsn = [], first_tsn
    for seq, payload, unordered in messages:
        parts = [payload[i:i + 100] for i in range(0, len(payload), 100)]
        for i, part in enumerate(parts):
            c = DataChunk()
            c.flags = (SCTP_DATA_FIRST_FRAG if i == 0 else 0) | (SCTP_DATA_LAST_FRAG if i == len(parts) - 1 else 0)
            c.flags |= SCTP_DATA_UNORDERED if unordered else 0
            c.tsn, c.stream_id, c.stream_seq, c.protocol, c.user_data = tsn % (1 << 32), 1, seq, 53, part
            out.append(c)
            tsn += 1
    return out


def random_messages(rng: random.Random, most: int) -> list[tuple[int, bytes, bool]]:
    """1 to ``most`` (stream_seq, payload, unordered) messages, a fifth unordered, of 1-450 bytes."""
    seq, messages = 0, []
    for _ in range(rng.randint(1, most)):
        unordered = rng.random() < 0.2
        messages.append((0 if unordered else seq, bytes(rng.randrange(256) for _ in range(rng.randint(1, 450))),
                         unordered))
        seq += 0 if unordered else 1
    return messages


def deliver(arrivals: list[DataChunk], *, replaced: bool) -> list[tuple[int, int, bytes]]:
    """What _receive_data_chunk hands up, chunk by chunk (duplicates are dropped before add_chunk)."""
    stream, seen, got = InboundStream(), set(), []
    add = InboundStream.add_chunk if replaced else original(InboundStream, "add_chunk")
    pop = InboundStream.pop_messages if replaced else original(InboundStream, "pop_messages")
    for c in arrivals:
        if c.tsn in seen:
            continue
        seen.add(c.tsn)
        add(stream, c)
        got.extend(pop(stream))
    return got


@pytest.mark.parametrize("seed", range(40))
def test_reassembly_gives_aiortcs_messages_in_aiortcs_order(seed):
    rng = random.Random(seed)
    messages = random_messages(rng, most=12)
    chunks = chunks_of(messages, first_tsn=(1 << 32) - rng.randint(1, 20))  # across the TSN wrap too
    arrivals = list(chunks)
    for _ in range(rng.randint(0, 6)):  # reorder a few, and repeat a few (retransmissions)
        i, j = rng.randrange(len(arrivals)), rng.randrange(len(arrivals))
        arrivals[i], arrivals[j] = arrivals[j], arrivals[i]
    arrivals += [rng.choice(chunks) for _ in range(rng.randint(0, 3))]
    want = deliver(arrivals, replaced=False)
    assert deliver(arrivals, replaced=True) == want
    assert sorted(m[2] for m in want) == sorted(p for _s, p, _u in messages)


def test_a_forward_tsn_scan_after_a_skipped_one_still_scans():
    stream = InboundStream()
    first, second = chunks_of([(0, b"a" * 250, False)], first_tsn=10)[:2]
    stream.add_chunk(first)
    assert list(stream.pop_messages()) == []  # skipped: appended, not a last fragment
    stream.reassembly = [first]  # a FORWARD TSN calls pop_messages on its own: it must scan
    assert list(stream.pop_messages()) == [] and stream.reassembly == [first]
    last = chunks_of([(0, b"a" * 250, False)], first_tsn=10)[2]
    stream.add_chunk(second)
    list(stream.pop_messages())
    stream.add_chunk(last)
    assert [m[2] for m in stream.pop_messages()] == [b"a" * 250]


@pytest.mark.parametrize("seed", range(40))
def test_marking_tsns_received_keeps_aiortcs_cumulative_tsn_gaps_and_duplicates(seed):
    rng = random.Random(seed)
    start = (1 << 32) - rng.randint(1, 30)
    tsns = [(start + i) % (1 << 32) for i in range(60)]
    arrivals = list(tsns)
    for _ in range(rng.randint(0, 10)):
        i, j = rng.randrange(60), rng.randrange(60)
        arrivals[i], arrivals[j] = arrivals[j], arrivals[i]
    arrivals += [rng.choice(tsns) for _ in range(rng.randint(0, 8))]
    rng.shuffle(arrivals[-10:])

    def state() -> SimpleNamespace:
        return SimpleNamespace(_last_received_tsn=(start - 1) % (1 << 32), _sack_misordered=set(),
                               _sack_duplicates=[])

    ours, theirs = state(), state()
    mark, mark_as_aiortc = RTCSctpTransport._mark_received, original(RTCSctpTransport, "_mark_received")
    for n, tsn in enumerate(arrivals):
        assert mark(ours, tsn) == mark_as_aiortc(theirs, tsn)
        assert vars(ours) == vars(theirs)
        if n % 4 == 3:  # a SACK went out: aiortc clears the duplicates it reported
            ours._sack_duplicates.clear()
            theirs._sack_duplicates.clear()


class Receiver:
    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.requests: list[Any] = []

    def data_received(self, data: bytes, component: int) -> None:
        self.data.append(data)

    def request_received(self, message: Any, addr: Any, protocol: Any) -> None:
        self.requests.append(message)


@pytest.fixture
def main_thread_loop():
    """An event loop set for this thread: aioice's StunProtocol makes an ``asyncio.Future()`` as it is
    built. Without one, that relied on asyncio making a loop on demand, which it no longer does once
    any earlier test in the process has run ``asyncio.run`` (test_fairness, test_hubcalls): the test
    failed whenever it followed one in the same worker."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def test_dtls_records_go_on_as_data_and_stun_is_still_parsed(main_thread_loop):
    from aioice import stun

    receiver = Receiver()
    proto = StunProtocol(receiver)
    proto.local_candidate = SimpleNamespace(component=1)
    record = bytes([23, 0xFE, 0xFD, 0, 1]) + bytes(8) + (1200).to_bytes(2, "big") + bytes(1200)
    request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
    proto.datagram_received(record, ("127.0.0.1", 9))
    proto.datagram_received(bytes(request), ("127.0.0.1", 9))
    assert receiver.data == [record]
    assert [m.transaction_id for m in receiver.requests] == [request.transaction_id]
    # aioice's own path agrees on the record: its STUN parse fails and the record is data
    as_aioice = Receiver()
    other = StunProtocol(as_aioice)
    other.local_candidate = SimpleNamespace(component=1)
    original(StunProtocol, "datagram_received")(other, record, ("127.0.0.1", 9))
    assert as_aioice.data == [record]


def test_an_empty_dtls_write_sends_nothing_and_a_pending_one_still_goes():
    from OpenSSL import SSL

    sent: list[bytes] = []

    async def send(data: bytes) -> None:
        sent.append(data)

    ctx = SSL.Context(SSL.DTLS_METHOD)
    conn = SSL.Connection(ctx)
    conn.set_connect_state()
    dtls = SimpleNamespace(_ssl=conn, transport=SimpleNamespace(_send=send),
                           _RTCDtlsTransport__tx_bytes=0, _RTCDtlsTransport__tx_packets=0)
    asyncio.run(RTCDtlsTransport._write_ssl(dtls))
    assert sent == []
    try:
        conn.do_handshake()
    except SSL.WantReadError:
        pass  # the ClientHello is written into the memory BIO
    asyncio.run(RTCDtlsTransport._write_ssl(dtls))
    assert len(sent) == 1 and sent[0][0] == 22  # a handshake record


class Association:
    """An RTCSctpTransport on a stand-in DTLS transport, its delivery and SACKs recorded."""

    def __init__(self, first_tsn: int) -> None:
        self.sctp = RTCSctpTransport(SimpleNamespace(state="connected", _register_data_receiver=lambda _r: None))
        self.sctp._last_received_tsn = (first_tsn - 1) % (1 << 32)
        self.sctp._local_verification_tag = 0x1234ABCD
        self.delivered: list[tuple[int, int, bytes]] = []
        self.sacks = 0

        async def receive(stream_id: int, pp_id: int, data: bytes) -> None:
            self.delivered.append((stream_id, pp_id, data))

        async def send_sack() -> None:  # what aiortc's SACK resets once it is sent
            self.sacks += 1
            self.sctp._sack_duplicates.clear()
            self.sctp._sack_needed = False

        self.sctp._receive = receive
        self.sctp._send_sack = send_sack

    def state(self) -> tuple[Any, ...]:
        t = self.sctp
        return (t._last_received_tsn, sorted(t._sack_misordered), list(t._sack_duplicates), t._advertised_rwnd,
                t._sack_needed, self.sacks, list(self.delivered),
                {sid: ([c.tsn for c in st.reassembly], st.sequence_number) for sid, st in t._inbound_streams.items()})


def packet(chunks: list[Any], tag: int = 0x1234ABCD, corrupt: bool = False, body: bytes | None = None) -> bytes:
    """An SCTP packet of ``chunks`` (serialized as aiortc serializes them) or of ``body``, its
    checksum as aiortc's."""
    from struct import pack

    from aiortc.rtcsctptransport import crc32c

    header = pack("!HHL", 5000, 5000, tag)
    body = b"".join(bytes(c) for c in chunks) if body is None else body
    checksum = crc32c(header + bytes(4) + body) ^ (1 if corrupt else 0)
    return header + pack("<L", checksum) + body


def handle_all(packets: list[bytes], first_tsn: int, *, in_place: bool) -> tuple[Association, int]:
    """Each packet through _handle_data (ours, or aiortc's), as receive.py hands it on; the number
    of packets aiortc's parse saw."""
    import aiortc.rtcsctptransport as sctp_module

    association = Association(first_tsn)
    handle = RTCSctpTransport._handle_data if in_place else original(RTCSctpTransport, "_handle_data")
    parse, parsed = sctp_module.parse_packet, [0]

    def counting_parse(data: bytes) -> Any:
        parsed[0] += 1
        return parse(data)

    sctp_module.parse_packet = counting_parse
    try:
        for data in packets:
            asyncio.get_event_loop().run_until_complete(handle(association.sctp, data))
    finally:
        sctp_module.parse_packet = parse
    return association, parsed[0]


def test_packets_of_one_data_chunk_in_order_are_not_parsed_and_give_aiortcs_state(main_thread_loop):
    messages = [(i, bytes([i]) * (50 + 70 * i), False) for i in range(6)]
    chunks = chunks_of(messages, first_tsn=(1 << 32) - 5)  # across the TSN wrap
    packets = [packet([c]) for c in chunks]
    ours, parsed = handle_all(packets, (1 << 32) - 5, in_place=True)
    theirs, _ = handle_all(packets, (1 << 32) - 5, in_place=False)
    assert parsed == 0  # every packet handled in place
    assert ours.state() == theirs.state()
    assert [m[2] for m in ours.delivered] == [p for _s, p, _u in messages]
    assert ours.sacks == len(packets)


@pytest.mark.parametrize("seed", range(40))
def test_any_packet_gives_aiortcs_state_and_delivery(main_thread_loop, seed):
    """Reordered, repeated, bundled, corrupted, mistagged and unknown chunks: after every packet the
    association's TSNs, gaps, duplicates, window, SACKs, delivered messages and reassembly are
    aiortc's."""
    rng = random.Random(seed)
    messages = random_messages(rng, most=10)
    first = (1 << 32) - rng.randint(1, 20)
    chunks = chunks_of(messages, first_tsn=first)
    arrivals = list(chunks)
    for _ in range(rng.randint(0, 5)):
        i, j = rng.randrange(len(arrivals)), rng.randrange(len(arrivals))
        arrivals[i], arrivals[j] = arrivals[j], arrivals[i]
    arrivals += [rng.choice(chunks) for _ in range(rng.randint(0, 3))]
    packets: list[bytes] = []
    i = 0
    while i < len(arrivals):
        kind = rng.random()
        if kind < 0.1 and i + 1 < len(arrivals):  # two chunks bundled in one packet
            packets.append(packet(arrivals[i:i + 2]))
            i += 2
            continue
        if kind < 0.15:  # a corrupted copy, then the packet itself
            packets.append(packet([arrivals[i]], corrupt=True))
        elif kind < 0.2:  # another association's tag, then the packet itself
            packets.append(packet([arrivals[i]], tag=0x0BADF00D))
        elif kind < 0.25:  # a chunk type aiortc does not know, before the DATA chunk: skipped
            packets.append(packet([], body=bytes([200, 0, 0, 8, 0, 0, 0, 0]) + bytes(arrivals[i])))
        packets.append(packet([arrivals[i]]))
        i += 1
    ours = Association(first)
    theirs = Association(first)
    run = asyncio.get_event_loop().run_until_complete
    for data in packets:
        run(RTCSctpTransport._handle_data(ours.sctp, data))
        run(original(RTCSctpTransport, "_handle_data")(theirs.sctp, data))
        assert ours.state() == theirs.state()
    assert sorted(m[2] for m in ours.delivered) == sorted(p for _s, p, _u in messages)


def test_in_place_off_leaves_every_packet_to_aiortc(main_thread_loop, monkeypatch):
    from webrtc import packets as packets_module

    monkeypatch.setattr(packets_module, "ONE_CHUNK_IN_PLACE", False)
    chunks = chunks_of([(0, b"x" * 300, False)], first_tsn=7)
    _, parsed = handle_all([packet([c]) for c in chunks], 7, in_place=True)
    assert parsed == len(chunks)


@pytest.mark.parametrize("seed", range(20))
def test_a_sack_reaches_receive_chunk_as_aiortc_parses_it(main_thread_loop, seed):
    """A packet of one SACK chunk is parsed in place: _receive_chunk gets the chunk aiortc's parse
    would give it, and the SACK that follows is aiortc's; a bundled, corrupted, mistagged or zero-
    checksum one goes (or is dropped) as aiortc would."""
    from aiortc.rtcsctptransport import SackChunk

    rng = random.Random(seed)
    packets: list[bytes] = []
    for _ in range(30):
        sack = SackChunk()
        sack.cumulative_tsn = rng.randrange(1 << 32)
        sack.advertised_rwnd = rng.randrange(1 << 20)
        sack.gaps = [(rng.randrange(1, 50), rng.randrange(50, 99)) for _ in range(rng.randint(0, 3))]
        sack.duplicates = [rng.randrange(1 << 32) for _ in range(rng.randint(0, 3))]
        kind = rng.random()
        if kind < 0.15:
            packets.append(packet([sack], corrupt=True))
        elif kind < 0.25:
            packets.append(packet([sack], tag=0x0BADF00D))
        elif kind < 0.35:
            packets.append(packet([sack] + chunks_of([(0, b"z" * 30, False)], first_tsn=rng.randrange(1 << 32))))
        elif kind < 0.45:
            whole = packet([sack])
            packets.append(whole[:8] + bytes(4) + whole[12:])  # a zero checksum, this end never announced it
        else:
            packets.append(packet([sack]))

    def run_all(handle: Any) -> tuple[list[Any], int]:
        association = Association(1)
        got: list[Any] = []

        async def receive_chunk(chunk: Any) -> None:
            got.append((type(chunk).__name__, sorted(vars(chunk).items())))
            association.sctp._sack_needed = rng_needed.random() < 0.3  # as a chunk may leave it

        association.sctp._receive_chunk = receive_chunk
        rng_needed = random.Random(seed)
        for data in packets:
            asyncio.get_event_loop().run_until_complete(handle(association.sctp, data))
        return got, association.sacks

    ours = run_all(RTCSctpTransport._handle_data)
    theirs = run_all(original(RTCSctpTransport, "_handle_data"))
    assert ours == theirs
    assert any(name == "SackChunk" for name, _ in ours[0])


def test_a_data_chunk_too_short_for_its_header_goes_aiortcs_way(main_thread_loop):
    """A DATA chunk whose length leaves no room for its TSN is not read in place (no struct error
    there): aiortc's parse gets it, as it would have."""
    from struct import pack

    short = packet([], body=pack("!BBH", 0, 3, 8) + b"abcd")
    ours, theirs = [], []
    for handle, out in ((RTCSctpTransport._handle_data, ours), (original(RTCSctpTransport, "_handle_data"), theirs)):
        association = Association(1)
        try:
            asyncio.get_event_loop().run_until_complete(handle(association.sctp, short))
            out.append(association.state())
        except Exception as exc:  # noqa: BLE001 — compared: whatever aiortc does with it, ours does
            out.append(type(exc))
    assert ours == theirs
