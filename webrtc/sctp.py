"""Changes to aiortc's SCTP. First: acknowledge a batch of packets with one SACK, not every packet.

aiortc (1.16) answers every DATA packet it receives with its own SACK (``_handle_data`` ends with
``_send_sack``). Each SACK is a DTLS record and a UDP datagram the receiver encrypts and sends and
the sender receives, decrypts and processes, so a bulk transfer costs about two packets per 1,189
bytes. RFC 4960 section 6.2 lets a receiver delay the SACK (up to 200 ms, at least every second
packet). We send one SACK per ``SACK_EVERY`` packets, once the asyncio loop has worked off what is
queued (``call_soon``), and a packet that stays alone gets its SACK after ``SACK_DELAY``; each SACK
carries the latest cumulative TSN. Acknowledging once the loop was idle (the first version) still
sent a SACK per 1.9 packets (tests/webrtc/test_fairness.py), as aiortc's receive path hands the
packets over one loop turn at a time; a SACK per 4 packets took the two peers' CPU per MiB from about 101 to 82 ms (5 alternating
32 MiB streams, 19:45 UTC) with keystroke round trips unchanged (bench/tunnel_interactive.py).
A SACK per 8 packets (2026-11-29) took a further 14-16 % (bench/tunnel_ab.py --sack); more than 4 had
lost throughput before only because aiortc lets each SACK release at most 4 x 1,160 bytes
(``_burst_a_sacks_worth`` below). FLEETHUB_SCTP_SACK_EVERY sets it (docs/operations.md). A packet
that leaves a gap, or a duplicate, is acknowledged at once (RFC 9260 6.7), so a loss is reported by
the next packet's SACK, not a batch later. Against a sender that lets fewer packets go per SACK (an
older fleethub, a browser) the count comes down to what it sends (``SackPace``).

bench/tunnel.py measures the effect side by side, the two peers in separate processes: about 25 %
less CPU per MiB forwarded in the two peers (87-98 ms instead of 119-122 ms per MiB on the 2-core
machine) and more MB/s (median 17.0 against 13.4, bench/RESULTS.md). The patch is applied once per process when the first peer is made and
only to the method it expects to find; with another aiortc, check the method still exists and is
only called from ``_handle_data`` before trusting the figures.

A second change keeps the sender from queueing far more than the path needs (``DelayWindow``).
aiortc grows its congestion window until packets are lost; on loopback, or towards a busy peer, the
bottleneck is the receiving process, and everything in flight waits in its socket buffer. A
keystroke sent on another channel waits behind all of it (about 200 KB, 50 ms at 4 MB/s, measured
with bench/tunnel_interactive.py). Like TCP Vegas or LEDBAT, the window is held so that the queueing
delay the association adds (a round trip beyond the smallest one seen lately) stays near
``QUEUE_TARGET``: when a round trip is longer, the window shrinks in proportion, at most once per
window of data. On a long path whose round trip is all propagation the window grows as before.

A third serves the channels in turn (``FairQueue``): aiortc moves messages from its data-channel
queue into SCTP in the order they were sent, so a keystroke waits for every bulk message queued
before it. The queue's ``popleft`` takes the oldest message of the channel served longest ago
instead; each channel's own order is kept.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from dataclasses import dataclass
from typing import Any

from . import stepped
from .closed import closed_send
from .pmtu import chunk_of

log = logging.getLogger("fleethub.webrtc")

_applied = False

DEFAULT_SACK_EVERY = 8
SACK_EVERY = DEFAULT_SACK_EVERY  # packets with DATA per SACK under load (FLEETHUB_SCTP_SACK_EVERY when applied)
FLOOR_PACKETS = 4  # the delay-based window never holds fewer packets in flight than this
BURST_PER_SACK = True  # a SACK's worth per burst, not aiortc's 4 x 1,160 bytes (_burst_a_sacks_worth)
STEP_SACKS = True  # a due SACK sent in the callback that finds it due, not from a task (bench/tunnel_ab.py --sack-step)
SACK_DELAY = 0.002  # seconds a packet alone waits for its SACK (RFC 4960 allows 200 ms)
QUEUE_TARGET = 0.004  # seconds of queueing the association may add to a round trip
MIN_RTT_EPOCH = 256  # round-trip samples per epoch; the smallest is taken over this and the last one


class FairQueue(deque):
    """aiortc's ``_data_channel_queue`` of (channel, protocol, data), served round-robin by channel.

    Bounded buffering in forward.py keeps it short (about a message per channel), so a scan is cheap.
    The turn a channel was last served is kept on the channel, so nothing outlives it here."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self._turn = 0

    def popleft(self) -> Any:
        if len(self) > 1:
            best, best_turn = 0, None
            for i, (channel, _protocol, _data) in enumerate(self):
                turn = getattr(channel, "_fleethub_turn", -1)
                if best_turn is None or turn < best_turn:
                    best, best_turn = i, turn
                    if turn < 0:
                        break  # never served: nobody can be before it
            item = self[best]
            del self[best]
        else:
            item = super().popleft()
        self._turn += 1
        item[0]._fleethub_turn = self._turn
        return item


@dataclass
class DelayWindow:
    """The delay-based cap on one association's congestion window. Pure: round trips come in."""

    floor: int  # never below this many bytes (a few packets)
    target: float = QUEUE_TARGET
    _min_now: float = float("inf")
    _min_before: float = float("inf")
    _samples: int = 0

    @property
    def base_rtt(self) -> float:
        return min(self._min_now, self._min_before)

    def sample(self, rtt: float, cwnd: int) -> int | None:
        """A new round trip; the window to use instead of ``cwnd``, or None to leave it."""
        # the smallest round trip of the last one or two epochs: a path that got longer (a relay,
        # a new route) is learnt within two epochs instead of being taken for queueing for ever
        self._samples += 1
        if self._samples > MIN_RTT_EPOCH:
            self._samples, self._min_before, self._min_now = 1, self._min_now, float("inf")
        self._min_now = min(self._min_now, rtt)
        allowed = self.base_rtt + self.target
        if rtt <= allowed:
            return None
        # at most halved at a time, as for a loss: one late round trip (jitter on a radio link, a
        # scheduling stall) costs no more than a lost packet would
        return max(self.floor, cwnd // 2, min(cwnd, int(cwnd * allowed / rtt)))


RAISE_AFTER = 16  # SACKs in a row at the full count before a receiver waits for one packet more


@dataclass
class SackPace:
    """How many packets one association's receiver waits for before it sends a SACK. Pure.

    A sender that lets fewer packets go per SACK than this receiver waits for (a fleethub before
    2026-11-29 or aiortc as it is: 4 x 1,160 bytes; a browser's stack) would stop each round trip
    until SACK_DELAY runs out, and a copy would fall to about 2 MB/s. So when the delay runs out
    with two or more packets waiting, fewer than the count, the count becomes what arrived; after
    RAISE_AFTER SACKs in a row at the count it grows by one, up to SACK_EVERY. Against such a sender
    that costs one SACK_DELAY per RAISE_AFTER round trips; a pause in a copy from a sender of today's
    lowers the count for the next few hundred packets, which costs SACKs, not throughput. So does a
    sender's thread that is not scheduled within SACK_DELAY: a bulk copy between two peers on a host
    with more busy processes than cores sent 0.4 SACKs per packet instead of 0.27
    (tests/webrtc/test_fairness.py)."""

    every: int
    full: int = 0
    stalls: int = 0  # times the delay ran out with packets waiting (tests/webrtc/test_fairness.py)

    def timed_out(self, waiting: int) -> None:
        if 2 <= waiting < self.every:
            self.every, self.full = waiting, 0
            self.stalls += 1

    def counted(self, most: int) -> None:
        self.full += 1
        if self.full >= RAISE_AFTER:
            self.full = 0
            self.every = min(most, self.every + 1)


def sack_every(value: str | None) -> int:
    """FLEETHUB_SCTP_SACK_EVERY: packets per SACK, 1 to 64; unset, DEFAULT_SACK_EVERY; anything else
    is said in the log and the default used."""
    if not value:
        return DEFAULT_SACK_EVERY
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= 64:
        log.warning("FLEETHUB_SCTP_SACK_EVERY=%r is not a number from 1 to 64: a SACK every %d packets",
                    value, DEFAULT_SACK_EVERY)
        return DEFAULT_SACK_EVERY
    return n


def batch_sacks() -> None:
    global _applied
    # FLEETHUB_SCTP_SACK_EVERY_PACKET=1 keeps aiortc's behaviour: bench/tunnel.py compares the two
    if _applied or os.environ.get("FLEETHUB_SCTP_SACK_EVERY_PACKET"):
        return
    from aiortc.rtcsctptransport import RTCSctpTransport

    send_now = RTCSctpTransport._send_sack

    async def send_or_drop(self: Any) -> None:
        # a SACK scheduled just before the association or DTLS closed has nobody to go to; nobody
        # awaits this task, so an exception here would be "Task exception was never retrieved"
        try:
            await send_now(self)
        except Exception as exc:  # noqa: BLE001 — see closed.closed_send
            if not closed_send(exc):
                raise

    async def send_later(self: Any) -> None:
        # called once per packet that carried DATA: acknowledge every SACK_EVERY packets once the
        # loop has worked off what is queued, and a packet that stays alone after SACK_DELAY
        self._fleethub_unacked = getattr(self, "_fleethub_unacked", 0) + 1
        handle = getattr(self, "_fleethub_sack_handle", None)
        soon = getattr(self, "_fleethub_sack_soon", False)
        pace = getattr(self, "_fleethub_pace", None)
        if pace is None:
            pace = self._fleethub_pace = SackPace(SACK_EVERY)
        # a gap or a duplicate is reported at once (RFC 9260 6.7): the sender retransmits a lost
        # chunk after three SACKs that miss it, and should not wait 3 x SACK_EVERY packets for them
        counted = self._fleethub_unacked >= min(pace.every, SACK_EVERY)
        due = counted or self._sack_misordered or self._sack_duplicates
        if soon or (handle is not None and not due):
            return
        if handle is not None:
            handle.cancel()
        loop = asyncio.get_running_loop()

        def fire(timed: bool) -> None:
            waiting = self._fleethub_unacked
            self._fleethub_sack_handle, self._fleethub_sack_soon, self._fleethub_unacked = None, False, 0
            if timed:
                pace.timed_out(waiting)
            elif waiting >= pace.every:
                pace.counted(SACK_EVERY)
            if self._sack_needed:
                # sent now, not from a task a loop turn later (stepped.py): one Task fewer per SACK,
                # and the SACK leaves a turn sooner
                if STEP_SACKS:
                    stepped.start(send_or_drop(self))
                else:
                    asyncio.ensure_future(send_or_drop(self))

        if due:
            self._fleethub_sack_soon = True
            self._fleethub_sack_handle = loop.call_soon(fire, False)
        else:
            self._fleethub_sack_handle = loop.call_later(SACK_DELAY, fire, True)

    global SACK_EVERY, STEP_SACKS
    SACK_EVERY = sack_every(os.environ.get("FLEETHUB_SCTP_SACK_EVERY"))
    STEP_SACKS = not os.environ.get("FLEETHUB_SCTP_SACK_TASK")  # the A/B's "before", across processes
    RTCSctpTransport._send_sack = send_later
    _burst_a_sacks_worth(RTCSctpTransport)
    if not os.environ.get("FLEETHUB_SCTP_LOSS_BASED_ONLY"):  # bench/tunnel_interactive.py compares
        _hold_queueing_delay(RTCSctpTransport)
    if not os.environ.get("FLEETHUB_SCTP_FIFO"):  # bench/tunnel_interactive.py compares
        _serve_channels_in_turn(RTCSctpTransport)
    _applied = True


def _hold_queueing_delay(cls: Any) -> None:
    from aiortc.rtcsctptransport import tsn_minus_one, uint32_gte

    update_rto = cls._update_rto

    def update_rto_and_window(self: Any, rtt: float) -> None:
        update_rto(self, rtt)
        window = getattr(self, "_fleethub_delay", None)
        if window is None:
            window = self._fleethub_delay = DelayWindow(floor=0)
        # never below FLOOR_PACKETS packets of the association's chunk size (the probed one once
        # known, which may be after the first sample); a receiver that waits for more per SACK comes
        # down to what it gets (SackPace)
        window.floor = FLOOR_PACKETS * chunk_of(self)
        cwnd = window.sample(rtt, self._cwnd)
        # once per window of data, as for a loss: the samples of the packets already in flight
        # still carry the queue the last reduction is draining
        until = getattr(self, "_fleethub_delay_until", None)
        if cwnd is None or (until is not None and not uint32_gte(self._last_sacked_tsn, until)):
            return
        self._cwnd = cwnd
        self._ssthresh = min(self._ssthresh, cwnd)  # grow again by congestion avoidance, not slow start
        self._partial_bytes_acked = 0
        self._fleethub_delay_until = tsn_minus_one(self._local_tsn)

    cls._update_rto = update_rto_and_window


def _burst_a_sacks_worth(cls: Any) -> None:
    transmit = cls._transmit

    async def transmit_a_sacks_worth(self: Any) -> None:
        # aiortc sends at most 4 x 1,160 bytes per call (RFC 9260's Max.Burst of 4 packets, at its
        # chunk size): with one SACK per SACK_EVERY packets, each SACK would let fewer packets go than
        # it acknowledged, the flight would shrink to less than a SACK's worth and every round trip
        # would wait SACK_DELAY. So after aiortc's call, more calls while there is data, room in the
        # window and less than a SACK's worth sent; in fast recovery aiortc's smaller burst stands.
        before = self._flight_size
        await transmit(self)
        if not BURST_PER_SACK or self._fast_recovery_exit is not None:
            return
        burst = max(4, SACK_EVERY) * chunk_of(self)
        while self._outbound_queue and self._flight_size < self._cwnd and self._flight_size - before < burst:
            flight = self._flight_size
            await transmit(self)
            if self._flight_size == flight:
                return

    transmit_a_sacks_worth.__wrapped__ = transmit  # type: ignore[attr-defined]
    cls._transmit = transmit_a_sacks_worth


def _serve_channels_in_turn(cls: Any) -> None:
    init = cls.__init__

    def init_with_fair_queue(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._data_channel_queue = FairQueue(self._data_channel_queue)

    cls.__init__ = init_with_fair_queue
