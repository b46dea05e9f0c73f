"""Steps that end a link and watch the device come back: link.drain (D1), a frame over its limit
(L1), and the hub's closes 4002 (X1), 4004 (X3), 4408 (X4) and 4001 (X2)."""

from __future__ import annotations

import trio

from ...shared import linkcodes, protocol
from ..link import Conn, short
from .run import Run


async def drain(q: Run, conn: Conn) -> Conn | None:
    after = q.o.drain_after
    reply = await q.cmd(conn, "link.drain", {"reconnectAfter": after})
    drained = q.strict("D1", "link.drain", reply)
    with trio.move_on_after(10):
        await conn.closed.wait()
    if drained is not None:
        q.check("D1", conn.close_code == linkcodes.Close.GOING_AWAY,
                f"closed with {conn.close_code} {conn.close_reason!r}" if conn.closed.is_set() else
                "the link was still open 10 s after link.drain")
    nxt = await q.next_link(conn)
    if nxt is not None and conn.closed_at is not None:
        gap = nxt.opened_at - conn.closed_at
        q.check("D1", gap <= after + 2.0, f"reconnected {gap:.2f} s after the close (reconnectAfter {after} s)")
    return nxt

async def oversized(q: Run, conn: Conn) -> Conn | None:
    # The document's close-code table: a frame over the receiver's limit is answered by closing
    # with 1009 and a reason; the frame is not acted on (no reply), and the device comes back.
    cid = "qualify-oversized"
    pad = "x" * (protocol.MAX_FRAME_BYTES + 1024)
    await conn.send_command("ping", {"pad": pad}, id=cid)
    late = await conn.reply(cid, 5)
    with trio.move_on_after(5):
        await conn.closed.wait()
    size = f"a {len(pad) + 100}-byte command"
    if late is not None:
        q.check("L1", False, f"{size} was answered: {short(late.model_dump(exclude_none=True))}")
    if not conn.closed.is_set():
        q.check("L1", False, f"{size}: the link was still open 10 s later (the device must close with 1009)")
        await q.end(conn)
        return await q.next_link(conn)
    q.check("L1", conn.close_code == linkcodes.Close.TOO_BIG and bool(conn.close_reason),
            f"{size}: the device closed with {conn.close_code} {conn.close_reason!r}")
    nxt = await q.next_link(conn)
    q.check("L1", nxt is not None, "it reconnected" if nxt else
            f"no reconnect within {q.o.reconnect_timeout:.0f} s of the 1009")
    return nxt

async def heartbeat_timeout_close(q: Run, conn: Conn) -> Conn | None:
    # Backoff, measured: after 4002 the kit closes the next links with 4002 again as soon as their
    # hello is in, before any welcome (a device may reset its backoff after a welcome, never
    # before). A device that comes straight back each time adds up to almost nothing.
    reason = "heartbeat timeout: no heartbeat for 3 intervals"
    closed_at, gaps = await conn.close(linkcodes.Close.HEARTBEAT_TIMEOUT, reason), []
    conn.done.set()
    for _ in range(q.o.backoff_probes):
        probe = await q.listener.next_conn(q.o.reconnect_timeout)
        if probe is None:
            q.check("X1", False, f"no reconnect within {q.o.reconnect_timeout:.0f} s of close 4002 "
                                    f"(after {len(gaps)} reconnects)")
            return None
        gaps.append(probe.opened_at - closed_at)
        await probe.next(lambda r: True, q.o.hello_timeout)  # its hello, unanswered
        closed_at = await probe.close(linkcodes.Close.HEARTBEAT_TIMEOUT, reason)
        probe.done.set()
    nxt = await q.listener.next_conn(q.o.reconnect_timeout)
    if nxt is None:
        q.check("X1", False, f"no reconnect within {q.o.reconnect_timeout:.0f} s of close 4002")
        return None
    gaps.append(nxt.opened_at - closed_at)
    total = sum(gaps)
    q.check("X1", total >= q.o.backoff_min_total,
            f"{len(gaps)} reconnects after close 4002 ({q.o.backoff_probes} closed before the welcome): "
            f"away {total:.2f} s in all (at least {q.o.backoff_min_total:g} s); gaps "
            f"{short([round(g, 3) for g in gaps], 100)}")
    return nxt if await q.handshake(nxt) is not None else None

async def draining_close(q: Run, conn: Conn) -> Conn | None:
    window = q.o.drain_window
    closed_at = await conn.close(linkcodes.Close.DRAINING, f"the hub is shutting down; reconnect within {window:g} s")
    nxt = await q.next_link(conn)
    if nxt is None:
        q.check("X3", False, f"no reconnect within {q.o.reconnect_timeout:.0f} s of close 4004")
        return None
    gap = nxt.opened_at - closed_at
    q.check("X3", gap <= window + 1.0, f"reconnected {gap:.2f} s after close 4004 whose reason said "
                                          f"within {window:g} s")
    return nxt

async def hello_timeout_close(q: Run, conn: Conn) -> Conn | None:
    await conn.close(linkcodes.Close.HELLO_TIMEOUT, f"no hello within {q.o.hello_timeout:g} s")
    conn.done.set()
    nxt = await q.listener.next_conn(q.o.reconnect_timeout)
    if nxt is None:
        q.check("X4", False, f"no reconnect within {q.o.reconnect_timeout:.0f} s of close 4408")
        return None
    hello = await nxt.next(lambda r: True, q.o.hello_at_once)
    if hello is not None:
        hello.taken = False  # only looked at: the handshake reads it
    q.check("X4", hello is not None and isinstance(hello.frame, protocol.Hello),
            f"after close 4408 the first frame came {hello.at - nxt.opened_at:.2f} s after the handshake"
            if hello is not None else f"no frame within {q.o.hello_at_once:g} s of the handshake after 4408")
    return nxt if await q.handshake(nxt) is not None else None

async def superseded_close(q: Run, conn: Conn) -> Conn | None:
    closed_at = await conn.close(linkcodes.Close.SUPERSEDED, "qualification: superseded")
    nxt = await q.next_link(conn, 2 * q.o.superseded_wait + q.o.reconnect_timeout)
    if nxt is None:
        q.check("X2", False, "no reconnect after close 4001")
        return None
    gap = nxt.opened_at - closed_at
    q.check("X2", gap >= q.o.superseded_wait,
            f"reconnected {gap:.2f} s after close 4001 (at least {q.o.superseded_wait:.0f} s)")
    return nxt
