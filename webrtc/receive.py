"""A datagram of an established DTLS association is handled in the callback that received it.

aiortc receives through a queue: aioice's ``Connection.data_received`` puts each datagram on an
``asyncio.Queue`` and the DTLS transport's own task takes it off (``_recv_next``), decrypts it and
awaits SCTP's ``_handle_data``. Each datagram so costs a future, a task wake-up and a loop turn on
top of its own work, and a bulk copy has about 874 DATA packets per MiB (one 1,200-byte chunk each)
and a SACK for every few. Once the handshake is done, nothing in that path waits for anything (SCTP
and DTLS only ever send, and a send is a ``sendto``), so ``Inline`` does the same work straight from
the datagram callback: decrypt, flush what OpenSSL has to send, hand the plaintext to SCTP.

Order and aiortc's semantics are kept:
- a datagram goes inline only when the transport's task is idle (waiting on an empty queue), so it
  never overtakes one queued before it; otherwise it is queued as before;
- the handler is run as a coroutine stepped by hand; should it ever wait (a path not seen in a
  tunnel), the rest runs as a task and the datagrams arriving meanwhile wait in order behind it;
- a peer's close_notify, or an error the transport's task would have ended on, ends that task the
  same way (aioice's "connection lost" sentinel on the queue): the state goes to closed and the
  receivers are told, as aiortc does.
Before the handshake is done (its retransmission timer lives in the task), and for anything but a
DTLS record, the queue is used.

More than one datagram per readiness of the socket (``read_while_idle``): asyncio's datagram
transport reads one per poll, so each costs an ``epoll_wait`` and a loop turn besides its own work.
Once the association is up, the socket's reader takes up to ``MAX_READS`` in a row, but only while
the loop has nothing else to run: a run ends at the first datagram after which anything is ready
(a SACK due, a task woken, a flush, another socket's event), and the loop runs it before the next
read. Reading on regardless, or until the run itself scheduled something, was tried first
(2026-11-28 with 4 and 64; 2026-11-30 with 16): scp fell from 11.6 to 5.0-5.4 MB/s, and from 12 to
8-9. A due SACK left two loop turns after it was due (``call_soon``, its task's step, the outbox's
flush; the task's step scheduled by the first, not by the run), so every datagram read in between
delayed it, and the sender's delay-based window (sctp.py ``DelayWindow``) took the longer round
trips for a queue and shrank. Stopping while anything at all is ready brought scp back (12-14 MB/s)
with about 2 datagrams per readiness under a copy (measured in docs/tunnel-performance.md). The SACK
now leaves a turn sooner (sctp.py ``STEP_SACKS``: no task), still through a ``call_soon`` and the
outbox's flush, so the rule is still what keeps its timing.
FLEETHUB_RECEIVE_ONE=1 leaves asyncio's reader (the A/B's "before"; bench/tunnel_ab.py --reads).

FLEETHUB_AIORTC_AS_IS=1 leaves aiortc's own (packets.py's switch). Measured A/B with two peers in
one process (docs/tunnel-performance.md, packets.py's docstring).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from typing import Any

from . import stepped
from .records import open_record

log = logging.getLogger("fleethub.webrtc")

_applied = False


def receive_inline() -> None:
    global _applied
    # FLEETHUB_RECEIVE_QUEUED=1 leaves this one out (the A/B's "before" for it alone)
    if _applied or os.environ.get("FLEETHUB_AIORTC_AS_IS") or os.environ.get("FLEETHUB_RECEIVE_QUEUED"):
        return
    from aioice.ice import Connection
    from aiortc.rtcdtlstransport import RTCDtlsTransport

    data_received = Connection.data_received

    def receive(self: Any, data: bytes, component: int) -> None:
        inline = getattr(self, "_fleethub_inline", None)
        if inline is None or not inline.take(data):
            data_received(self, data, component)

    receive.__wrapped__ = data_received  # type: ignore[attr-defined]
    Connection.data_received = receive  # type: ignore[method-assign]

    set_state = RTCDtlsTransport._set_state

    def set_state_and_attach(self: Any, state: Any) -> None:
        set_state(self, state)
        connection = getattr(self.transport, "_connection", None)
        if connection is not None:  # a closed transport's datagrams go to aiortc's queue, as before
            connection._fleethub_inline = Inline(self, connection) if state.name == "CONNECTED" else None
            if state.name == "CONNECTED" and not os.environ.get("FLEETHUB_RECEIVE_ONE"):
                pair = connection._nominated.get(1)
                read_while_idle(getattr(getattr(pair, "protocol", None), "transport", None))

    set_state_and_attach.__wrapped__ = set_state  # type: ignore[attr-defined]
    RTCDtlsTransport._set_state = set_state_and_attach  # type: ignore[method-assign]
    _applied = True


class Inline:
    """One DTLS transport's receive path, run from aioice's datagram callback."""

    def __init__(self, dtls: Any, connection: Any) -> None:
        from aiortc.rtcdtlstransport import State
        from OpenSSL import SSL

        self.dtls = dtls
        self.connection = connection
        self.backlog: deque[bytes] = deque()
        self.busy = False  # a datagram's handler is waiting; later ones queue behind it
        self.handled = 0  # datagrams taken here (tests/webrtc/test_receive.py)
        self._connected = State.CONNECTED
        self._ssl_errors = SSL.ZeroReturnError, SSL.Error

    def take(self, data: bytes) -> bool:
        """Handle ``data`` here (True) or leave it to aiortc's queue (False)."""
        if self.busy:
            self.backlog.append(data)
            return True
        dtls = self.dtls
        if (not data or not 19 < data[0] < 64 or dtls._state is not self._connected
                or not dtls._RTCDtlsTransport__handshake_done):
            return False
        # the task waits on the queue: it holds nothing (each put wakes a waiter, taking it off
        # _getters), so this datagram overtakes none. A loop, not any() over a generator: this runs
        # per datagram, and the generator was 2 % of a receiving peer's CPU
        for getter in self.connection._queue._getters:
            if not getter.done():
                self._run(data)
                return True
        return False

    def _run(self, data: bytes) -> None:
        self.handled += 1
        try:
            task = stepped.start(self._handle(data))
        except BaseException as exc:  # noqa: BLE001 — the transport's task would have ended on it
            self._end(exc)
            return
        if task is not None:
            self.busy = True
            task.add_done_callback(self._rest_done)

    def _rest_done(self, task: asyncio.Task[None]) -> None:
        self.busy = False
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            self._end(exc)
            return
        while self.backlog and not self.busy:
            if self.dtls._state is not self._connected:
                self.backlog.clear()
                return
            self._run(self.backlog.popleft())

    def _end(self, exc: BaseException) -> None:
        self.backlog.clear()
        if not isinstance(exc, ConnectionError):
            log.warning("DTLS receive failed: %r", exc)
        self.connection._queue.put_nowait(None)

    async def _handle(self, data: bytes) -> None:
        # aiortc's _recv_next for a DTLS record, after its queue
        dtls = self.dtls
        dtls._RTCDtlsTransport__rx_bytes += len(data)
        dtls._RTCDtlsTransport__rx_packets += 1
        plain: bytes | None
        try:
            plain = open_record(dtls._ssl, data)  # records.py: raises what bio_write and recv raise
        except self._ssl_errors[0]:
            plain = None
        except self._ssl_errors[1]:
            plain = b""
        await dtls._write_ssl()
        if plain is None:
            raise ConnectionError("DTLS shutdown by remote party")
        if plain and dtls._data_receiver:
            await dtls._data_receiver._handle_data(plain)


MAX_READS = 16  # datagrams one readiness may take: bounds what the loop's other sockets and timers wait
READ_MORE = True  # False: one datagram per readiness, as asyncio reads (bench/tunnel_ab.py --reads)


def read_while_idle(transport: Any) -> bool:
    """Give ``transport``'s socket a reader that takes up to ``MAX_READS`` datagrams per readiness
    while the loop has nothing else ready. asyncio's ``_SelectorDatagramTransport._read_ready`` for
    one datagram, its errors handled as it handles them; only a plain UDP socket transport on a
    selector loop (a relayed pair's TURN transport, another loop: nothing changes). True if it did.
    The transport's own close removes this reader as it would have removed asyncio's."""
    from asyncio.selector_events import _SelectorDatagramTransport  # type: ignore[attr-defined]

    if type(transport) is not _SelectorDatagramTransport or transport.is_closing():
        return False
    if getattr(transport, "_fleethub_reads", None) is not None:
        return True  # one reader per socket: a second DTLS state change finds it there
    loop = transport._loop
    sock, protocol, ready, size = transport._sock, transport._protocol, loop._ready, transport.max_size
    counts = transport._fleethub_reads = [0, 0]  # readinesses, datagrams (tests/webrtc/test_receive.py)

    def read_ready() -> None:
        counts[0] += 1
        for _ in range(MAX_READS if READ_MORE else 1):
            if transport._conn_lost or transport._closing:
                return
            try:
                data, addr = sock.recvfrom(size)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                protocol.error_received(exc)
                return
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:  # noqa: BLE001 — as asyncio's reader ends on it
                transport._fatal_error(exc, "Fatal read error on datagram transport")
                return
            counts[1] += 1
            protocol.datagram_received(data, addr)
            # Anything ready to run (scheduled by this datagram, or still to run this loop turn, as
            # the step of the task a SACK due a turn ago started) runs before the next read: "more
            # than when this began" is not enough, as that task's step would wait behind the run.
            if ready:
                return

    loop._add_reader(transport._sock_fd, read_ready)  # replaces asyncio's handle for this socket
    return True
