"""One TCP connection ⇄ one data channel labelled ``tcp``, on the asyncio side (loop.py says why).

On a ``tcp`` channel, binary messages are the stream's bytes; text messages are JSON control:

    {"credit": n}   the receiver has taken n more bytes off the channel (flow control)
    {"eof": true}   the sender's TCP peer half-closed: shut down the write side here

Any other JSON object goes to the Pump's ``on_extra`` hook, if set (a ``shell`` channel's resize,
device_client/shell.py); without one it is ignored.

SCTP in aiortc has no receive-side back pressure an application can use (a data channel cannot be
paused), so each direction runs a credit window: a side sends only what the other side has granted,
and grants more only once the bytes left its TCP socket. A slow TCP consumer, or a bandwidth cap
(the device withholds credit until its token bucket allows), then holds the sender back instead of
filling memory. Closing the channel closes the connection; closing the connection closes the channel.

Bounded buffering per channel: aiortc's SCTP keeps one outbound queue for all channels, in FIFO
order (a message waits for every message sent before it, on any channel). A pump therefore writes to
its channel only while the channel's ``bufferedAmount`` is at most ``LOW_WATER`` and resumes on the
channel's ``bufferedamountlow`` event: a bulk copy keeps at most about one message queued ahead of a
keystroke on another channel of the session, instead of up to a megabyte (131 ms p75 under scp,
bench/tunnel_interactive.py). The event fires inside aiortc's flush, as the queued message moves
into SCTP, so the next one is queued at once and the association never runs dry.

Sizes were measured (bench/tunnel.py): smaller messages cost CPU, because aiortc schedules a flush
task per message (16 KiB: about 117 ms CPU per MiB in the two peers, 64 KiB: about 100 ms); a
keystroke also waits for the rest of the message being sent, on any channel, so 32 KiB halves that
wait at little cost (bench/tunnel_interactive.py). A message is cut to whole DATA chunks of its
association (``message_size``): 32 KiB is 23.3 chunks of 1,404 bytes, and the last, a third full,
would cost a whole packet's work in both peers; 23 chunks (32,292 bytes) carry the same bytes in 2.8 %
fewer packets (tests/webrtc/test_pmtu.py counts them). The CPU this saves is under the machine's noise:
``bench/tunnel_ab.py --message --rounds 30`` gave a paired median of -0.2 ms per MiB (2026-11-29).

aiortc calls a channel's handlers from inside its SCTP receive and flush paths: an exception in one
would end the whole association (every connection of the session), so the handlers here catch what a
single connection's failure raises and close only that connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from .pmtu import AIORTC_CHUNK, chunk_of  # noqa: F401 — AIORTC_CHUNK: tests/webrtc/test_pmtu.py

MESSAGE = 32 * 1024  # bytes per data-channel message, at most (message_size)
FIT_MESSAGES = True  # False: MESSAGE whole (bench/tunnel_ab.py --message switches it)
LOW_WATER = 0  # write to a channel only while its bufferedAmount is at most this (see above)
WINDOW = 2 * 1024 * 1024  # credit each receiver grants; also bounds what it may have to buffer
CREDIT_STEP = WINDOW // 4  # grant again once this much was consumed

log = logging.getLogger("fleethub.webrtc")


def message_size(channel: Any) -> int:
    """Bytes in the next message on ``channel``: MESSAGE cut to whole DATA chunks of its association,
    at the size pmtu.py confirmed (``_fleethub_chunk``, which may arrive after the channel opened)."""
    if not FIT_MESSAGES:
        return MESSAGE
    chunk = chunk_of(getattr(channel, "transport", None))
    return MESSAGE - MESSAGE % chunk if chunk < MESSAGE else MESSAGE


class TokenBucket:
    """``rate`` bytes a second with bursts of ``burst`` bytes. Pure: time is the ``now`` argument."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = now

    def take(self, n: int, now: float) -> float:
        """Spend ``n`` bytes (the balance may go negative); the seconds until it is back at zero."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate) - n
        self.stamp = now
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def wait(self, now: float) -> float:
        """Seconds until the balance is back at zero, without spending."""
        return self.take(0, now)

    def set_rate(self, rate: float, burst: float, now: float) -> None:
        self.take(0, now)
        self.rate, self.burst = float(rate), float(burst)
        self.tokens = min(self.tokens, self.burst)


def bucket_for(bandwidth_bps: int | None, now: float) -> TokenBucket | None:
    if not bandwidth_bps:
        return None
    # a quarter second of burst, but at least one message so a slow cap still moves whole messages
    return TokenBucket(bandwidth_bps, max(MESSAGE, bandwidth_bps / 4), now)


@dataclass
class Counters:
    """Bytes of one session. ``received``: off the channels (from the peer); ``sent``: onto them."""

    received: int = 0
    sent: int = 0
    connections: int = 0


class Pump(asyncio.Protocol):
    """Copies between ``transport`` (a TCP socket) and ``channel`` (an open aiortc data channel)."""

    def __init__(self, channel: Any, counters: Counters, *, limit_out: TokenBucket | None = None,
                 limit_in: TokenBucket | None = None, on_closed: Callable[["Pump"], None] | None = None) -> None:
        self.channel = channel
        self.counters = counters
        self.limit_out = limit_out  # what we read from TCP and send (device: towards the CLI)
        self.limit_in = limit_in  # what we receive and write to TCP (device: towards the target)
        self.on_closed = on_closed
        self.on_extra: Callable[[dict[str, Any]], None] | None = None  # other JSON messages (see above)
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_event_loop()
        self._pending = bytearray()  # read from TCP, not yet sent (no credit, or rate-limited)
        self._early: list[bytes] = []  # from the channel before the TCP connection was up
        self._credit = 0  # bytes the peer lets us send
        self._uncredited = 0  # bytes we wrote to TCP and have not granted back yet
        self._credit_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._reading = True
        self._write_paused = False
        self._tcp_eof = False  # our TCP peer half-closed
        self._tcp_lost = False  # the socket is gone; what it sent before may still be pending
        self._eof_sent = False
        self._eof_received = False
        self._closed = False
        channel.bufferedAmountLowThreshold = LOW_WATER
        channel.on("message", self._guarded(self._on_message))
        channel.on("bufferedamountlow", self._guarded(self._flush))
        channel.on("close", self._guarded(self._on_channel_close))
        channel.on("open", self._guarded(self._announce))
        self._announced = False
        counters.connections += 1

    def _guarded(self, handler: Callable[..., None]) -> Callable[..., None]:
        """``handler`` as aiortc may call it: a failure closes this connection, not the association."""

        def run(*args: Any) -> None:
            try:
                handler(*args)
            except Exception as exc:  # noqa: BLE001 — raised into aiortc it would abort the association
                log.info("tunnel connection closed: %s", exc)
                self.close()

        return run

    # ---- TCP side (asyncio.Protocol) ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._closed:
            # asyncio makes the protocol at accept and connects it a loop turn later: a session closed
            # in between closed this pump with no socket to close, and the socket would stay open
            # forever (its client waiting on a tunnel that is gone).
            transport.close()
            return
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WINDOW // 2)  # type: ignore[attr-defined]
        self._announce()
        for data in self._early:
            self._deliver(data)
        self._early.clear()
        self._flush()

    def _announce(self) -> None:
        # the first grant, once both ends of this pump exist: the socket and an open channel
        if not self._announced and self.transport is not None and self.channel.readyState == "open":
            self._announced = True
            self._control({"credit": WINDOW})
            self._flush()

    def data_received(self, data: bytes) -> None:
        self._pending += data
        self._flush()

    def eof_received(self) -> bool:
        self._tcp_eof = True
        self._flush()
        return True  # keep the write side open: the other direction may still be running

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._grant()

    def connection_lost(self, exc: Exception | None) -> None:
        # bytes read before the close still go out (as credit allows), then the channel closes
        self._tcp_lost = self._tcp_eof = True
        self._flush()

    # ---- channel side ----

    def _on_message(self, message: bytes | str) -> None:
        if isinstance(message, str):
            try:
                control = json.loads(message)
            except ValueError:
                control = None
            if not isinstance(control, dict):
                self.close()
                return
            if isinstance(control.get("credit"), int):
                self._credit += control["credit"]
                self._flush()
            if control.get("eof"):
                self._eof_received = True
                if self.transport is not None and not self._tcp_lost and self.transport.can_write_eof():
                    self.transport.write_eof()
                self._maybe_done()
            if self.on_extra is not None and not ({"credit", "eof"} & control.keys()):
                self.on_extra(control)
            return
        self.counters.received += len(message)
        if self.transport is None:
            self._early.append(message)
        else:
            self._deliver(message)

    def _deliver(self, data: bytes) -> None:
        assert self.transport is not None
        if self._tcp_lost:
            return  # nobody left to read it
        self.transport.write(data)
        self._uncredited += len(data)
        if self.limit_in is not None:
            self.limit_in.take(len(data), self._loop.time())
        self._grant()

    def _grant(self) -> None:
        if self._closed or self._write_paused or self._uncredited < CREDIT_STEP or self._credit_timer:
            return
        if self.limit_in is not None:
            wait = self.limit_in.wait(self._loop.time())
            if wait > 0:
                self._credit_timer = self._loop.call_later(wait, self._credit_due)
                return
        amount, self._uncredited = self._uncredited, 0
        self._control({"credit": amount})

    def _credit_due(self) -> None:
        self._credit_timer = None
        self._grant()

    def _flush(self) -> None:
        if self._closed or self._send_timer is not None:
            return
        channel = self.channel
        if channel.readyState != "open":
            return  # not open yet (the announce flushes) or closing (close() follows)
        size = message_size(channel)
        while self._pending and self._credit > 0 and channel.bufferedAmount <= LOW_WATER:
            n = min(len(self._pending), self._credit, size)
            chunk = bytes(self._pending[:n])
            del self._pending[:n]
            self._credit -= n
            self.counters.sent += n
            channel.send(chunk)
            if self.limit_out is not None:
                wait = self.limit_out.take(n, self._loop.time())
                if wait > 0:
                    self._send_timer = self._loop.call_later(wait, self._send_due)
                    break
        if self._tcp_eof and not self._pending and not self._eof_sent:
            self._eof_sent = True
            self._control({"eof": True})
            self._maybe_done()
        if self._tcp_lost and not self._pending:
            self.close()
            return
        self._set_reading(len(self._pending) < MESSAGE and self._send_timer is None)

    def _send_due(self) -> None:
        self._send_timer = None
        self._flush()

    def _set_reading(self, on: bool) -> None:
        if self.transport is None or on == self._reading or self._tcp_lost or self.transport.is_closing():
            return
        self._reading = on
        if on:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    def _control(self, message: dict[str, Any]) -> None:
        if self.channel.readyState == "open":
            self.channel.send(json.dumps(message, separators=(",", ":")))

    def _maybe_done(self) -> None:
        if self._eof_sent and self._eof_received:
            self.close()

    def _on_channel_close(self) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for timer in (self._credit_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        if self.transport is not None:
            self.transport.close()
        if self.channel.readyState not in ("closing", "closed"):
            self.channel.close()
        if self.on_closed is not None:
            self.on_closed(self)
