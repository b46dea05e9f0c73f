"""Interactive beside bulk in one session (issue 21 items 3 and 2): bounded buffering per channel,
channels served in turn, a queueing-delay cap on the SCTP window, one connection's failure kept to
itself, and a SACK per batch of packets.

The pair tests use real aiortc peers over loopback UDP (tests/webrtc/peers.py) on trio's real clock;
the queue and window tests drive the pure pieces of webrtc/sctp.py directly.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections import deque
from functools import partial
from types import SimpleNamespace

import pytest
import trio

from webrtc.forward import MESSAGE
from webrtc.sctp import DelayWindow, FairQueue, batch_sacks

from .peers import connect_pair, echo_handler, exchange, start_echo

CONTROL_SLACK = 1024  # credit/eof control messages that may sit beside the data


def _queued(peer) -> int:
    """Bytes the peer's SCTP association holds that are not on the wire yet: messages waiting in
    aiortc's data-channel queue and fragments of the message being sent. Runs on the asyncio thread."""
    sctp = peer.conn.pc.sctp
    return (sum(len(data) for _channel, _protocol, data in list(sctp._data_channel_queue))
            + sum(len(chunk.user_data) for chunk in list(sctp._outbound_queue)))


async def test_a_bulk_copy_queues_at_most_two_messages_ahead_of_another_channel(nursery):
    with trio.fail_after(60):
        pair = await connect_pair(await start_echo(nursery))
        try:
            done = False
            samples: list[int] = []

            async def sample() -> None:  # on the asyncio thread, beside the pumps
                while not done:
                    samples.append(_queued(pair.client))
                    await asyncio.sleep(0.001)

            payload = os.urandom(6 * 1024 * 1024)

            async def bulk_then_stop() -> None:
                nonlocal done
                try:
                    assert await exchange(pair.listen_port, payload) == payload
                finally:
                    done = True

            async with trio.open_nursery() as both:
                both.start_soon(bulk_then_stop)
                both.start_soon(pair.client._thread.run, sample())
            busy = [n for n in samples if n]
            assert len(busy) > 20, samples  # the copy was watched while it ran
            # a message waiting in the queue plus the rest of the one being sent; the old 1 MiB
            # high-water mark let a megabyte sit ahead of a keystroke
            assert max(samples) <= 2 * MESSAGE + CONTROL_SLACK, max(samples)
        finally:
            await pair.client.close()
            await pair.device.close()


async def test_keystrokes_beside_a_bulk_copy_come_back_in_order(nursery):
    # not timed (the machine is shared): both connections of one session carry their own bytes
    with trio.fail_after(60):
        pair = await connect_pair(await start_echo(nursery))
        try:
            payload = os.urandom(4 * 1024 * 1024)
            keys = bytes(range(32, 96))
            echoed = bytearray()

            async def type_keys() -> None:
                stream = await trio.open_tcp_stream("127.0.0.1", pair.listen_port)
                async with stream:
                    for key in keys:
                        await stream.send_all(bytes([key]))
                        echoed.extend(await stream.receive_some(1))

            async with trio.open_nursery() as both:
                both.start_soon(type_keys)
                assert await exchange(pair.listen_port, payload) == payload
            assert bytes(echoed) == keys
        finally:
            await pair.client.close()
            await pair.device.close()


async def test_a_connection_failing_under_aiortc_leaves_the_session_up(nursery):
    """A local client resets its connection while the pump has stopped reading it (credit ran out), so
    asyncio has not seen the reset; then the target's end half-closes and the pump's write_eof raises
    ENOTCONN inside aiortc's receive path. Raised into aiortc, that ended the whole association."""
    blocked: list[trio.SocketStream] = []
    release = trio.Event()

    async def target(stream: trio.SocketStream) -> None:
        if not blocked:  # the first connection: never read, half-close when released
            blocked.append(stream)
            await release.wait()
            await stream.send_eof()
            await trio.sleep_forever()
        await echo_handler(stream)

    with trio.fail_after(60):
        listeners = await nursery.start(partial(trio.serve_tcp, target, 0, host="127.0.0.1"))
        pair = await connect_pair(listeners[0].socket.getsockname()[1])
        try:
            sock = socket.create_connection(("127.0.0.1", pair.listen_port))
            sock.setblocking(False)
            chunk = bytes(256 * 1024)
            with trio.move_on_after(3):  # until the credit window and every buffer are full
                while True:
                    try:
                        sock.send(chunk)
                    except BlockingIOError:
                        await trio.sleep(0.05)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # a reset the paused pump does not read
            await trio.sleep(0.2)
            release.set()
            await trio.sleep(1.0)  # the eof crosses the tunnel and meets the reset socket
            assert pair.client.state == "connected"
            assert await exchange(pair.listen_port, b"still here") == b"still here"
        finally:
            await pair.client.close()
            await pair.device.close()


class _Channel:
    """Only an identity for FairQueue (it keeps each channel's last turn on the channel)."""


def test_the_queue_serves_a_waiting_channel_before_the_next_bulk_message():
    bulk, keys = _Channel(), _Channel()
    queue = FairQueue()
    queue.append((bulk, 53, b"b1"))
    assert queue.popleft()[2] == b"b1"  # bulk was served last
    queue.append((bulk, 53, b"b2"))
    queue.append((bulk, 53, b"b3"))
    queue.append((keys, 51, b"k1"))
    queue.append((keys, 51, b"k2"))
    order = [queue.popleft()[2] for _ in range(4)]
    # the keystroke goes before the bulk message queued ahead of it; then they alternate and each
    # channel keeps its own order
    assert order == [b"k1", b"b2", b"k2", b"b3"]
    assert not queue


def test_the_queue_keeps_deque_behaviour_for_one_channel():
    only = _Channel()
    queue = FairQueue([(only, 53, b"a"), (only, 53, b"b")])
    queue.append((only, 53, b"c"))
    assert [queue.popleft()[2] for _ in range(3)] == [b"a", b"b", b"c"]


def test_the_window_shrinks_in_proportion_to_the_queueing_delay():
    window = DelayWindow(floor=4_000, target=0.004)
    assert window.sample(0.001, 100_000) is None  # the smallest round trip: no queue
    assert window.sample(0.005, 100_000) is None  # 4 ms of queue: on target
    # 2 ms of queue over target: held to what fits in base + target (5 ms of a 7 ms round trip)
    assert window.sample(0.007, 100_000) == 71_428
    # 19 ms of queue: halved, no more at a time (as for a loss)
    assert window.sample(0.020, 100_000) == 50_000
    assert window.sample(1.0, 6_000) == 4_000  # never below the floor


def test_the_base_round_trip_follows_a_path_that_got_longer():
    window = DelayWindow(floor=4_000, target=0.004)
    window.sample(0.001, 100_000)
    for _ in range(3 * 256):  # a relay: 50 ms round trips from now on, all propagation
        window.sample(0.050, 100_000)
    assert window.base_rtt == 0.050
    assert window.sample(0.050, 100_000) is None


async def test_a_bulk_copy_is_acknowledged_a_batch_of_packets_at_a_time(nursery, monkeypatch):
    from aiortc.rtcsctptransport import RTCSctpTransport, SackChunk

    with trio.fail_after(60):
        pair = await connect_pair(await start_echo(nursery))
        try:
            device_sctp = pair.device.conn.pc.sctp
            sacks, send_chunk = [0], RTCSctpTransport._send_chunk

            async def watch(self, chunk) -> None:  # SACKs counted on their way out, whoever sent them
                if self is device_sctp and isinstance(chunk, SackChunk):
                    sacks[0] += 1
                await send_chunk(self, chunk)

            async def received() -> int:
                return device_sctp._last_received_tsn

            monkeypatch.setattr(RTCSctpTransport, "_send_chunk", watch)
            tsn0, sacks0 = await pair.device._thread.run(received()), sacks[0]
            payload = os.urandom(4 * 1024 * 1024)
            assert await exchange(pair.listen_port, payload) == payload
            tsn1, sacks1 = await pair.device._thread.run(received()), sacks[0]
            packets = (tsn1 - tsn0) % (1 << 32)  # aiortc sends one DATA chunk per packet
            assert packets >= len(payload) / 1404, packets  # at least one per chunk of the probed size
            # aiortc sends a SACK per packet (FLEETHUB_SCTP_SACK_EVERY_PACKET=1 makes this fail). Ours:
            # up to SACK_EVERY (8) packets per SACK, fewer where the sender's window held fewer or its
            # thread was not scheduled within SACK_DELAY (sctp.SackPace, never under 2); a lone packet
            # gets its own after SACK_DELAY. How many stalls a run sees depends on the host's
            # scheduling: 1 SACK in 3.7 packets here, 1 in 2.5 on the CI host under `-n 4` (CI of
            # 2026-11-29). So the bound is the pace's floor with room for lone packets.
            assert sacks1 - sacks0 <= packets * 0.55, (sacks1 - sacks0, packets)
        finally:
            await pair.client.close()
            await pair.device.close()


def _association(*, chunk: int = 1404, cwnd: int = 1 << 20, queued: int = 40, recovering: bool = False):
    """What aiortc's ``_transmit`` reads of an association: an established one with ``queued`` full
    chunks waiting, nothing in flight. Its sends are recorded instead of going anywhere."""
    from aiortc.rtcsctptransport import DataChunk, RTCSctpTransport

    state = SimpleNamespace(_forward_tsn_chunk=None, _fast_recovery_exit=7 if recovering else None,
                            _flight_size=0, _cwnd=cwnd, _sent_queue=deque(), _outbound_queue=deque(),
                            _t3_handle=object(), _fleethub_chunk=chunk, sent=[])
    for tsn in range(queued):
        data = DataChunk()
        data.tsn, data.user_data, data._book_size = tsn, bytes(chunk), chunk
        data._sent_count, data._retransmit, data._in_flight = 0, False, False
        state._outbound_queue.append(data)

    async def send_chunk(data) -> None:
        state.sent.append(data.tsn)

    state._send_chunk = send_chunk
    state._flight_size_increase = partial(RTCSctpTransport._flight_size_increase, state)
    return state


def test_a_sack_lets_as_many_packets_go_as_it_acknowledges():
    from aiortc.rtcsctptransport import RTCSctpTransport

    from webrtc import sctp

    batch_sacks()
    ours, theirs = RTCSctpTransport._transmit, RTCSctpTransport._transmit.__wrapped__
    # aiortc's burst is 4 x 1,160 bytes: 4 packets of 1,404; a SACK acknowledges SACK_EVERY of them
    for transmit, want in ((theirs, 4), (ours, sctp.SACK_EVERY)):
        state = _association()
        asyncio.run(transmit(state))
        assert state.sent == list(range(want)) and state._flight_size == want * 1404, (transmit, state.sent)
    assert sctp.SACK_EVERY == 8
    # the window still bounds it (a chunk goes while the flight is below the window, as aiortc's)
    state = _association(cwnd=3 * 1404)
    asyncio.run(ours(state))
    assert state.sent == [0, 1, 2]
    # after a loss, aiortc's smaller burst (2 x 1,160 bytes) stands
    for transmit in (ours, theirs):
        state = _association(recovering=True)
        asyncio.run(transmit(state))
        assert state.sent == [0, 1]
    # nothing left to send: one call, as aiortc's
    state = _association(queued=0)
    asyncio.run(ours(state))
    assert state.sent == [] and state._flight_size == 0


def test_a_receiver_sends_a_sack_per_sack_every_packets_and_one_for_a_lone_packet():
    """The receiving side's wiring, on aiortc's own _send_sack with a recorded association: packets
    handled one loop turn apart, as aiortc's _receive handles them; a gap is reported at once."""
    from aiortc.rtcsctptransport import RTCSctpTransport, SackChunk

    from webrtc import sctp

    batch_sacks()
    state = SimpleNamespace(_sack_needed=False, _sack_misordered=set(), _sack_duplicates=[],
                            _last_received_tsn=0, _advertised_rwnd=1 << 20, sent=[])

    async def send_chunk(chunk) -> None:
        assert isinstance(chunk, SackChunk)
        state.sent.append((chunk.cumulative_tsn, chunk.gaps))

    state._send_chunk = send_chunk

    async def packet(tsn: int) -> None:  # what aiortc's _receive ends with for a packet with DATA
        if tsn == state._last_received_tsn + 1:
            state._last_received_tsn = tsn
        else:
            state._sack_misordered.add(tsn)
        state._sack_needed = True
        await RTCSctpTransport._send_sack(state)
        await asyncio.sleep(0)

    class Loop(asyncio.SelectorEventLoop):
        """A loop on a clock the test moves: SACK_DELAY is 2 ms, and a loaded host (CI under -n 4 with
        busy processes beside it) took longer than that between two loop turns, so the timer fired
        mid-batch. Here it fires only when the test lets that much time pass."""
        now = 0.0

        def time(self) -> float:
            return self.now

    async def elapse(seconds: float) -> None:
        Loop.now += seconds
        for _ in range(3):
            await asyncio.sleep(0)

    async def run() -> None:
        every = sctp.SACK_EVERY
        for tsn in range(1, 2 * every + 1):
            await packet(tsn)
        await asyncio.sleep(0)
        # a SACK each SACK_EVERY packets, not one per packet (the first is built a turn later, so it
        # acknowledges what arrived by then)
        assert len(state.sent) == 2 and state.sent[0][0] >= every and state.sent[1] == (2 * every, []), state.sent
        await packet(2 * every + 1)  # alone: its SACK after SACK_DELAY, not before
        await elapse(sctp.SACK_DELAY / 4)
        assert len(state.sent) == 2
        await elapse(sctp.SACK_DELAY * 2)
        assert state.sent[2:] == [(2 * every + 1, [])]
        await packet(2 * every + 3)  # one lost before it: reported by this packet's SACK
        await asyncio.sleep(0)
        assert state.sent[3:] == [(2 * every + 1, [(2, 2)])]

    with asyncio.Runner(loop_factory=Loop) as runner:
        runner.run(run())


@pytest.mark.parametrize("step", [True, False])
def test_a_due_sack_leaves_from_the_callback_that_finds_it_due(step, monkeypatch):
    """sctp.STEP_SACKS: the SACK is built and sent in the loop turn after the packet that made it
    due (stepped.py), not from a task one turn later still."""
    from aiortc.rtcsctptransport import RTCSctpTransport

    from webrtc import sctp

    batch_sacks()
    monkeypatch.setattr(sctp, "STEP_SACKS", step)
    state = SimpleNamespace(_sack_needed=False, _sack_misordered=set(), _sack_duplicates=[],
                            _last_received_tsn=0, _advertised_rwnd=1 << 20, sent=[])

    async def send_chunk(chunk) -> None:
        state.sent.append(chunk.cumulative_tsn)

    state._send_chunk = send_chunk

    async def run() -> None:
        for tsn in range(1, sctp.SACK_EVERY + 1):  # a run of packets handled in one loop turn
            state._last_received_tsn, state._sack_needed = tsn, True
            await RTCSctpTransport._send_sack(state)
        assert state.sent == []
        await asyncio.sleep(0)
        assert state.sent == ([sctp.SACK_EVERY] if step else [])
        await asyncio.sleep(0)
        assert state.sent == [sctp.SACK_EVERY]

    asyncio.run(run())


def test_packets_per_sack_from_the_environment(caplog):
    from webrtc.sctp import DEFAULT_SACK_EVERY, sack_every

    assert [sack_every(v) for v in (None, "", "4", "1", "64")] == [DEFAULT_SACK_EVERY, DEFAULT_SACK_EVERY, 4, 1, 64]
    assert not caplog.records
    for bad in ("0", "65", "-3", "eight"):
        caplog.clear()
        assert sack_every(bad) == DEFAULT_SACK_EVERY
        assert bad in caplog.records[0].getMessage()


async def test_a_lost_packet_is_reported_by_the_next_sack_not_a_batch_later(nursery, monkeypatch):
    """RFC 9260 6.7: a gap is reported at once. With a SACK per 8 packets held back, the sender would
    see the three SACKs that make it retransmit only 24 packets after the loss."""
    from aiortc.rtcdtlstransport import RTCDtlsTransport
    from aiortc.rtcsctptransport import RTCSctpTransport, SackChunk

    with trio.fail_after(60):
        pair = await connect_pair(await start_echo(nursery))
        try:
            client_dtls = pair.client.conn.pc.sctp.transport
            device_sctp = pair.device.conn.pc.sctp
            lose = {300, 900, 1500}  # the client's n-th DATA packet (chunk type 0 after the 12-byte header)
            seen, lost, gap_sacks = [0], [], []
            send_data, send_chunk = RTCDtlsTransport._send_data, RTCSctpTransport._send_chunk

            async def lossy(self, data: bytes) -> None:
                if self is client_dtls and len(data) > 12 and data[12] == 0:
                    seen[0] += 1
                    if seen[0] in lose:
                        lost.append(seen[0])
                        return
                await send_data(self, data)

            async def watch(self, chunk) -> None:
                if self is device_sctp and isinstance(chunk, SackChunk) and chunk.gaps:
                    # TSNs received above the gap when the SACK went: at once, one or two
                    gap_sacks.append(sum(end - start + 1 for start, end in chunk.gaps))
                await send_chunk(self, chunk)

            monkeypatch.setattr(RTCDtlsTransport, "_send_data", lossy)
            monkeypatch.setattr(RTCSctpTransport, "_send_chunk", watch)
            payload = os.urandom(3 << 20)
            assert await exchange(pair.listen_port, payload) == payload
            assert sorted(lost) == sorted(lose), (lost, seen)
            # each loss: the first SACK after it carries a gap of one or two packets received beyond it
            firsts = [n for i, n in enumerate(gap_sacks) if i == 0 or n <= gap_sacks[i - 1]]
            assert len(firsts) >= len(lose) and max(firsts) <= 2, gap_sacks
        finally:
            await pair.client.close()
            await pair.device.close()


def test_a_receiver_waits_for_no_more_packets_than_its_sender_lets_go():
    from webrtc.sctp import RAISE_AFTER, SackPace

    pace = SackPace(8)
    pace.timed_out(1)  # a lone packet (a keystroke): nothing learnt
    assert (pace.every, pace.stalls) == (8, 0)
    pace.timed_out(4)  # 4 packets, then the sender stopped: it lets 4 go per SACK
    assert (pace.every, pace.stalls) == (4, 1)
    for _ in range(RAISE_AFTER - 1):
        pace.counted(8)
    assert pace.every == 4
    pace.counted(8)  # RAISE_AFTER in a row at the count: one more is tried
    assert pace.every == 5
    pace.timed_out(4)  # and given up on the first stall
    assert (pace.every, pace.stalls) == (4, 2)
    for _ in range(10 * RAISE_AFTER):
        pace.counted(8)
    assert pace.every == 8  # never over SACK_EVERY


async def test_a_sender_that_bursts_4_packets_per_sack_is_not_held_each_round_trip(nursery):
    """A peer of before the SACK per 8 packets (aiortc's own _transmit: 4 x 1,160 bytes a SACK) sending
    to one of today: the receiver comes down to 4 packets per SACK after the first stall, instead of
    making every round trip wait SACK_DELAY for packets that cannot come."""
    from aiortc.rtcsctptransport import RTCSctpTransport

    with trio.fail_after(60):
        pair = await connect_pair(await start_echo(nursery))
        try:
            client_sctp, device_sctp = pair.client.conn.pc.sctp, pair.device.conn.pc.sctp
            aiortcs = RTCSctpTransport._transmit.__wrapped__

            async def as_before() -> None:
                await aiortcs(client_sctp)

            async def old_sender() -> None:
                client_sctp._transmit = as_before  # this association only: aiortc calls self._transmit()
                client_sctp._fleethub_chunk = None  # and aiortc's chunk size

            await pair.client._thread.run(old_sender())
            payload = os.urandom(4 << 20)
            assert await exchange(pair.listen_port, payload) == payload

            async def state() -> tuple[int, int, int]:
                pace = device_sctp._fleethub_pace
                return pace.every, pace.stalls, device_sctp._last_received_tsn

            every, stalls, _ = await pair.device._thread.run(state())
            # 4 MiB there in about 3,600 packets. Without the pace, a stall per SACK (about 900); with
            # it, one per RAISE_AFTER SACKs and what the host's scheduling adds: 28-32 alone, 63-64
            # with 8 busy processes on 2 cores. The count came down from SACK_EVERY (3-5 seen).
            assert every < 8 and stalls <= 3_600 / 4 / 4, (every, stalls)
        finally:
            await pair.client.close()
            await pair.device.close()
