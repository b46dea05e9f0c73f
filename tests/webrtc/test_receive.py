"""webrtc/receive.py handles a DTLS datagram in aioice's datagram callback instead of through aioice's
queue and the DTLS transport's task. It must give aiortc's result: the same bytes, in the same order,
on a path that loses, duplicates and reorders datagrams; it must never overtake a datagram already
queued; a handler that waits must hold later datagrams behind it; and a peer's close_notify must end
the transport as aiortc's task does. The sources it copies are pinned."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import os
import random
from importlib.metadata import version
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from aioice.ice import Connection
from aiortc.rtcdtlstransport import RTCDtlsTransport, State
from OpenSSL import SSL

from tests.webrtc.peers import connect_pair, exchange, start_echo
from webrtc import receive
from webrtc.receive import MAX_READS, Inline, read_while_idle, receive_inline

VERIFIED = {"aiortc": "1.16.0", "aioice": "0.13.0"}
SOURCES = {
    # Inline._handle is _recv_next's DTLS branch; take() reads the queue recvfrom waits on
    (RTCDtlsTransport, "_recv_next"): "998076720c05aa13faadff2dfa337f6964c171fa6791789a72693e1480c74102",
    (RTCDtlsTransport, "_set_state"): "385f5542ac247175e430b48f9c4cbbb1cd5230375df5611a6bf9ddf3368230cb",
    (Connection, "data_received"): "5631b17fab717d6b9a956b775d6f5580a50c2419dc6ef693286a98355e98a253",
    (Connection, "recvfrom"): "676acc01e4a9a9da04d94d86092a81ba17f1ef77bed0322c8302e3436310e863",
}


def test_applied_and_the_copied_sources_are_the_verified_ones():
    if os.environ.get("FLEETHUB_AIORTC_AS_IS") or os.environ.get("FLEETHUB_RECEIVE_QUEUED"):
        pytest.skip("switched off")
    receive_inline()
    assert {name: version(name) for name in VERIFIED} == VERIFIED
    for (cls, name), digest in SOURCES.items():
        fn = getattr(cls, name)
        fn = getattr(fn, "__wrapped__", fn)
        got = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
        assert got == digest, f"{cls.__name__}.{name} changed: re-check webrtc/receive.py, then pin {got}"
    assert Connection.data_received.__wrapped__.__module__ == "aioice.ice"
    assert RTCDtlsTransport._set_state.__wrapped__.__module__ == "aiortc.rtcdtlstransport"


# ---- the ordering rules, on a stand-in transport (OpenSSL and SCTP replaced by recorders) ----

class FakeSsl:
    def __init__(self) -> None:
        self.pending: list[bytes] = []

    def bio_write(self, data: bytes) -> None:
        self.pending.append(data)

    def recv(self, _n: int) -> bytes:
        data = self.pending.pop(0)
        if data == b"\x15close":
            raise SSL.ZeroReturnError()
        if data == b"\x15bad":
            raise SSL.Error()
        return data


class FakeReceiver:
    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.hold: dict[bytes, asyncio.Future[None]] = {}

    async def _handle_data(self, data: bytes) -> None:
        if data in self.hold:
            await self.hold[data]
        self.got.append(data)


class FakeDtls:
    def __init__(self) -> None:
        self._state = State.CONNECTED
        self._RTCDtlsTransport__handshake_done = True
        self._RTCDtlsTransport__rx_bytes = 0
        self._RTCDtlsTransport__rx_packets = 0
        self._ssl = FakeSsl()
        self._data_receiver = FakeReceiver()
        self.flushes = 0

    async def _write_ssl(self) -> None:
        self.flushes += 1


class FakeConnection:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()


def run(coro: Any) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, 10)

    # not asyncio.run: it leaves the main thread's loop unset for good, which aioice's StunProtocol()
    # in a later test (test_packets.py) asks for
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(bounded())
    finally:
        loop.close()


def test_inline_only_while_the_transport_task_waits_on_an_empty_queue():
    async def main() -> None:
        dtls, conn = FakeDtls(), FakeConnection()
        inline = Inline(dtls, conn)
        assert not inline.take(b"\x17a")  # nobody waits on the queue: the task is busy, queue it
        getter = asyncio.ensure_future(conn._queue.get())
        await asyncio.sleep(0)
        assert inline.take(b"\x17b")
        assert dtls._data_receiver.got == [b"\x17b"] and dtls.flushes == 1
        assert dtls._RTCDtlsTransport__rx_packets == 1 and dtls._RTCDtlsTransport__rx_bytes == 2
        conn._queue.put_nowait((b"\x17c", 1))  # queued, not yet taken: a later one must not overtake it
        assert not inline.take(b"\x17d")
        await getter
        getter = asyncio.ensure_future(conn._queue.get())
        await asyncio.sleep(0)
        assert not inline.take(b"\x01stun")  # not a DTLS record
        assert not inline.take(b"")
        dtls._RTCDtlsTransport__handshake_done = False  # the task still runs the handshake's timer
        assert not inline.take(b"\x17e")
        dtls._RTCDtlsTransport__handshake_done = True
        dtls._state = State.CLOSED
        assert not inline.take(b"\x17f")
        getter.cancel()
        assert dtls._data_receiver.got == [b"\x17b"]

    run(main())


def test_a_handler_that_waits_holds_later_datagrams_behind_it_in_order():
    async def main() -> None:
        dtls, conn = FakeDtls(), FakeConnection()
        inline = Inline(dtls, conn)
        getter = asyncio.ensure_future(conn._queue.get())
        await asyncio.sleep(0)
        release = asyncio.get_running_loop().create_future()
        dtls._data_receiver.hold[b"\x17b"] = release
        for record in (b"\x17a", b"\x17b", b"\x17c", b"\x17d"):
            assert inline.take(record)
        assert dtls._data_receiver.got == [b"\x17a"] and inline.busy
        await asyncio.sleep(0.01)
        assert dtls._data_receiver.got == [b"\x17a"]
        release.set_result(None)
        for _ in range(100):
            if not inline.busy and len(dtls._data_receiver.got) == 4:
                break
            await asyncio.sleep(0.001)
        assert dtls._data_receiver.got == [b"\x17a", b"\x17b", b"\x17c", b"\x17d"]
        assert inline.take(b"\x17e") and dtls._data_receiver.got[-1] == b"\x17e"
        getter.cancel()

    run(main())


def test_close_notify_and_a_failed_handler_end_the_transport_task_as_aiortc_does():
    async def main() -> None:
        for record, handled in ((b"\x15close", []), (b"\x15bad", [])):
            dtls, conn = FakeDtls(), FakeConnection()
            inline = Inline(dtls, conn)
            getter = asyncio.ensure_future(conn._queue.get())
            await asyncio.sleep(0)
            assert inline.take(record)
            if record == b"\x15close":
                # aiortc raises ConnectionError in its task; here its queue gets aioice's "lost" sentinel
                assert await getter is None
            else:
                # an SSL error is an empty read: nothing reaches SCTP and the task goes on
                assert not getter.done()
                getter.cancel()
            assert dtls._data_receiver.got == handled

        dtls, conn = FakeDtls(), FakeConnection()
        inline = Inline(dtls, conn)
        getter = asyncio.ensure_future(conn._queue.get())
        await asyncio.sleep(0)

        async def refused(_data: bytes) -> None:
            raise ConnectionError("Cannot send encrypted data, not connected")

        dtls._data_receiver._handle_data = refused
        assert inline.take(b"\x17x")
        assert await getter is None

    run(main())


# ---- several datagrams per readiness of the socket, while the loop is idle ----

class Recorder(asyncio.DatagramProtocol):
    """A datagram endpoint's protocol that keeps what arrives; ``on`` runs after a given datagram."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.on: dict[bytes, Any] = {}
        self.lost: list[Any] = []

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.got.append(data)
        if data in self.on:
            self.on[data]()

    def connection_lost(self, exc: Any) -> None:
        self.lost.append(exc)


@contextlib.asynccontextmanager
async def endpoint() -> AsyncIterator[tuple[Any, Recorder, Any]]:
    """A UDP endpoint on 127.0.0.1 with a Recorder, and a socket sending to it; both closed after."""
    import socket

    loop = asyncio.get_running_loop()
    transport, recorder = await loop.create_datagram_endpoint(Recorder, local_addr=("127.0.0.1", 0))
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sender.connect(transport.get_extra_info("sockname"))
        yield transport, recorder, sender
    finally:
        transport.close()
        sender.close()


def queued(sender: Any, datagrams: list[bytes]) -> None:
    """Sent while the loop does not run: all of them wait in the socket when it next polls."""
    import time

    for d in datagrams:
        sender.send(d)
    time.sleep(0.05)  # loopback delivers at once; this only makes sure


async def idle() -> None:
    """Let the loop run with nothing ready (a timer, not ``sleep(0)``: the test task's own wake-up
    would be ready when the socket is, and a run stops for it)."""
    await asyncio.sleep(0.05)


def test_one_readiness_takes_up_to_max_reads_datagrams_in_order():
    async def main() -> None:
        async with endpoint() as (transport, recorder, sender):
            assert read_while_idle(transport)
            assert read_while_idle(transport)  # a second call (another state change) changes nothing
            sent = [b"d%d" % i for i in range(MAX_READS + 4)]
            queued(sender, sent)
            await idle()
            assert recorder.got == sent
            assert transport._fleethub_reads == [2, MAX_READS + 4]  # MAX_READS, then the other 4

    run(main())


def test_a_run_of_reads_ends_when_anything_is_ready_to_run():
    async def main() -> None:
        async with endpoint() as (transport, recorder, sender):
            loop = asyncio.get_running_loop()
            ran: list[int] = []

            def note() -> None:
                ran.append(len(recorder.got))

            read_while_idle(transport)
            # the third datagram's handling schedules work (as a SACK due does): it runs before the
            # fourth is read
            recorder.on[b"d2"] = lambda: loop.call_soon(note)
            sent = [b"d%d" % i for i in range(6)]
            queued(sender, sent)
            await idle()
            assert recorder.got == sent and ran == [3]
            # work scheduled one turn on (as a due SACK's task steps the turn after): the run that
            # turn stops at its first datagram, though that datagram scheduled nothing itself
            recorder.on[b"e2"] = lambda: loop.call_soon(loop.call_soon, note)
            sent = [b"e%d" % i for i in range(6)]
            queued(sender, sent)
            await idle()
            assert recorder.got[6:] == sent and ran == [3, 10]

    run(main())


def test_one_per_readiness_when_switched_off(monkeypatch):
    monkeypatch.setattr(receive, "READ_MORE", False)

    async def main() -> None:
        async with endpoint() as (transport, recorder, sender):
            read_while_idle(transport)
            sent = [b"d%d" % i for i in range(4)]
            queued(sender, sent)
            await idle()
            assert recorder.got == sent and transport._fleethub_reads == [4, 4]

    run(main())


def test_a_transport_closed_by_a_datagram_reads_no_further():
    async def main() -> None:
        async with endpoint() as (transport, recorder, sender):
            read_while_idle(transport)
            recorder.on[b"d1"] = transport.close
            queued(sender, [b"d%d" % i for i in range(5)])
            await idle()
            assert recorder.got == [b"d0", b"d1"] and recorder.lost == [None]
            assert not read_while_idle(transport)  # closing: not given a reader

    run(main())


def test_only_a_plain_udp_socket_transport_is_given_the_reader():
    assert not read_while_idle(None)
    assert not read_while_idle(object())


# ---- real peers on a path that loses, duplicates and reorders ----

def shim(conn: Any, rng: random.Random) -> None:
    """Between aioice's socket and the Connection: 1 % lost, 1 % duplicated, 3 % held back behind the next."""
    deliver = type(conn).data_received
    held: list[tuple[bytes, int]] = []

    def received(data: bytes, component: int) -> None:
        r = rng.random()
        if r < 0.01:
            return
        if r < 0.04 and not held:
            held.append((data, component))
            return
        deliver(conn, data, component)
        if r < 0.05:
            deliver(conn, data, component)
        while held:
            deliver(conn, *held.pop())

    conn.data_received = received


def connections(pair: Any) -> list[Any]:
    return [peer.conn.pc.sctp.transport.transport._connection for peer in (pair.client, pair.device)]


@pytest.mark.parametrize("inline", [True, False])
async def test_bytes_arrive_whole_and_in_order_through_loss_duplicates_and_reordering(inline):
    if os.environ.get("FLEETHUB_AIORTC_AS_IS") or os.environ.get("FLEETHUB_RECEIVE_QUEUED"):
        pytest.skip("switched off")
    payload = random.Random(7).randbytes(1 << 20)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            pair = await connect_pair(await start_echo(nursery))
            conns = connections(pair)
            inlines: list[Inline] = []

            async def prepare() -> None:
                for i, conn in enumerate(conns):
                    assert isinstance(conn._fleethub_inline, Inline)
                    inlines.append(conn._fleethub_inline)
                    if not inline:
                        conn._fleethub_inline = None
                    shim(conn, random.Random(i))

            await pair.client._thread.run(prepare())
            readers = [c._nominated[1].protocol.transport for c in conns]
            try:
                assert await exchange(pair.listen_port, payload) == payload
            finally:
                await pair.client.close()
                await pair.device.close()
            if inline:
                # both peers took most of their datagrams inline (about 900 DATA packets a MiB each way)
                assert min(i.handled for i in inlines) > 500, [i.handled for i in inlines]
                # and each socket's reader took some of them several per readiness (on aiortc's queue,
                # each datagram wakes its task: one per readiness)
                reads = [t._fleethub_reads for t in readers]
                assert all(datagrams > readinesses for readinesses, datagrams in reads), reads
            nursery.cancel_scope.cancel()
