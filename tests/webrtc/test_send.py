"""webrtc/send.py sends a loop turn's DTLS records in one sendmsg with UDP_SEGMENT. The datagrams that
arrive must be the records, one each, in order, whatever their sizes; a full socket buffer or a
kernel that refuses segmentation must fall back to one sendto each without losing or reordering one;
and the aiortc and aioice sources it copies are pinned."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import inspect
import itertools
import os
import random
import sys
from importlib.metadata import version
from typing import Any

import pytest
import trio
from aioice.ice import Connection, StunProtocol
from aiortc.rtcdtlstransport import RTCDtlsTransport

import webrtc.send as send_mod
from tests.webrtc.peers import connect_pair, exchange, start_echo
from webrtc.send import MAX_SEGMENTS, Outbox, runs, send_batched, send_runs

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="UDP_SEGMENT is Linux's")

VERIFIED = {"aiortc": "1.16.0", "aioice": "0.13.0"}
SOURCES = {
    # send() is _send_data and _write_ssl with the record kept; the batch replaces this chain to sendto
    (RTCDtlsTransport, "_send_data"): "ee6cd411dd7f8eda6da0344f01b98f3c24ae9072cd3ef36d0a0acdd7a618eb47",
    (Connection, "sendto"): "bf162ec03bdce2cc2b9602cd47a03aa70b15b45383da4d0618090e65179f7e85",
    (StunProtocol, "send_data"): "8bfbce074a897482d13dba6bf49ff6f09e48f84327143b801a3a12d2e43de358",
}


def switched_off() -> bool:
    return bool(os.environ.get("FLEETHUB_AIORTC_AS_IS") or os.environ.get("FLEETHUB_SEND_EACH"))


def test_applied_and_the_copied_sources_are_the_verified_ones():
    if switched_off():
        pytest.skip("switched off")
    send_batched()
    assert {name: version(name) for name in VERIFIED} == VERIFIED
    for (cls, name), digest in SOURCES.items():
        fn = getattr(cls, name)
        fn = getattr(fn, "__wrapped__", fn)
        got = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
        assert got == digest, f"{cls.__name__}.{name} changed: re-check webrtc/send.py, then pin {got}"
    assert RTCDtlsTransport._send_data.__wrapped__.__module__ == "aiortc.rtcdtlstransport"


@pytest.mark.parametrize("seed", range(20))
def test_batches_are_what_udp_segment_can_cut(seed):
    rng = random.Random(seed)
    records = [bytes(rng.choice([1253, 1253, 1253, 1253, 93, 700, 1500])) for _ in range(rng.randrange(1, 300))]
    batches = runs(records)
    assert [r for start, end in batches for r in records[start:end]] == records
    assert batches[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(batches))
    for start, end in batches:
        batch = records[start:end]
        assert len(batch) <= MAX_SEGMENTS and sum(map(len, batch)) <= 65507
        assert all(len(r) == len(batch[0]) for r in batch[:-1]) and len(batch[-1]) <= len(batch[0])
    # a run of 1,253-byte records fills batches of as many as fit in a datagram
    assert runs([bytes(1253)] * 120) == [(0, 51), (51, 102), (102, 120)]


def run(coro: Any) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, 10)

    loop = asyncio.new_event_loop()  # not asyncio.run: see test_receive.py
    try:
        return loop.run_until_complete(bounded())
    finally:
        loop.close()


def run_keeping_gso(coro: Any) -> Any:
    """``run``, with the process's segmentation switch put back after (a test may turn it off)."""
    saved = send_mod._gso
    try:
        return run(coro)
    finally:
        send_mod._gso = saved


class Sink(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: list[bytes] = []

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.got.append(data)


async def udp_pair() -> tuple[Any, Any, Sink]:
    loop = asyncio.get_running_loop()
    receiver, sink = await loop.create_datagram_endpoint(Sink, local_addr=("127.0.0.1", 0))
    sender, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
    return sender, receiver, sink


async def wait_count(sink: Sink, n: int) -> None:
    for _ in range(1000):
        if len(sink.got) >= n:
            return
        await asyncio.sleep(0.002)


def test_a_batch_arrives_as_the_same_datagrams_in_order():
    async def main() -> None:
        rng = random.Random(3)
        records = [bytes([i % 256]) * rng.choice([1253, 1253, 1253, 40, 900]) for i in range(240)]
        sender, receiver, sink = await udp_pair()
        outbox = Outbox(None)
        for start in range(0, len(records), 60):  # what the receiving socket's buffer holds at once
            send_runs(sender, receiver.get_extra_info("sockname"), records[start:start + 60], outbox)
            await wait_count(sink, start + 60)
        assert sink.got == records
        assert outbox.sendmsgs > 0 and outbox.sendmsgs < len(records) // 2  # segmented, not one each
        sender.close()
        receiver.close()

    run_keeping_gso(main())


class Refusing:
    """The sender's socket, refusing segmentation with ``error``."""

    def __init__(self, sock: Any, error: int) -> None:
        self.sock, self.error = sock, error

    def sendto(self, *args: Any) -> int:
        return self.sock.sendto(*args)

    def sendmsg(self, *_args: Any) -> int:
        raise OSError(self.error, os.strerror(self.error))


def test_a_refusal_or_a_full_buffer_falls_back_to_one_sendto_each_in_order():
    async def main() -> None:
        records = [bytes([i]) * 1253 for i in range(10)] + [b"\x17short"]
        sender, receiver, sink = await udp_pair()
        addr = receiver.get_extra_info("sockname")
        real = sender._sock
        try:
            sender._sock = Refusing(real, errno.ENETUNREACH)  # the network's error: reported, segmentation kept
            send_runs(sender, addr, records[:5])
            assert send_mod._gso
            sender._sock = Refusing(real, errno.EIO)  # a card that cannot segment: off for the process
            send_runs(sender, addr, records[5:])
            assert not send_mod._gso
        finally:
            sender._sock = real
        await wait_count(sink, len(records))
        assert sink.got == records

        send_mod._gso = True
        sink.got.clear()
        sender._buffer.append((b"\x17first", addr))  # asyncio holds one: the rest queue behind it
        sender._buffer_size += 6
        sender._loop._add_writer(sender._sock_fd, sender._sendto_ready)
        outbox = Outbox(None)
        send_runs(sender, addr, records, outbox)
        await wait_count(sink, len(records) + 1)
        assert sink.got == [b"\x17first", *records] and outbox.sendmsgs == 0
        sender.close()
        receiver.close()

    run_keeping_gso(main())


async def test_real_peers_carry_a_copy_whole_with_records_segmented():
    if switched_off():
        pytest.skip("switched off")
    payload = random.Random(11).randbytes(1 << 20)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            pair = await connect_pair(await start_echo(nursery))
            try:
                assert await exchange(pair.listen_port, payload) == payload
                outboxes = [peer.conn.pc.sctp.transport._fleethub_outbox for peer in (pair.client, pair.device)]
                assert all(box.sendmsgs > 0 for box in outboxes), [box.sendmsgs for box in outboxes]
            finally:
                await pair.client.close()
                await pair.device.close()
            nursery.cancel_scope.cancel()


def test_an_alert_written_outside_the_batch_never_overtakes_the_records_queued_before_it():
    """A close_notify (``stop()`` calls ``_write_ssl``) made in the loop turn that queued the last
    data records goes out after them, not before: the peer drops what arrives after it."""
    from webrtc.send import flushing_first

    class Transport:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def sendto(self, data: bytes, addr: Any) -> None:
            self.sent.append(data)

        def is_closing(self) -> bool:
            return False

        def get_write_buffer_size(self) -> int:
            return 0

    wire = Transport()
    pair = type("Pair", (), {"protocol": type("Protocol", (), {"transport": wire})(), "remote_addr": ("127.0.0.1", 9)})()
    connection = type("Connection", (), {"_nominated": {1: pair}})()

    class Dtls:
        _ssl = object()  # no memory BIO to ask: treated as having output

        def __init__(self) -> None:
            self._fleethub_outbox = Outbox(connection)
            self._fleethub_outbox.records = [b"\x17data-1", b"\x17data-2"]

    async def write_ssl(self: Any) -> None:  # what aiortc's does: the alert straight to the wire
        wire.sendto(b"\x15close_notify", None)

    dtls = Dtls()
    trio.run(flushing_first(write_ssl), dtls)
    assert wire.sent == [b"\x17data-1", b"\x17data-2", b"\x15close_notify"]
    assert dtls._fleethub_outbox.records == []
