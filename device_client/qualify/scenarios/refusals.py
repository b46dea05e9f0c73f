"""Steps where the hub refuses the device, and the device must not hammer it: close 4003 (its token
revoked: X5) followed by a handshake answered 401 (T2), close 4409 (a frame out of order: X6) and
close 4426 (its protocol version no longer spoken: X7).

The document's "slowest backoff" is the device's own backoff cap (ours: 30 s), which the kit cannot
see; it is judged as at least ``Options.slowest_backoff`` (``--slowest-backoff``, default 10 s)."""

from __future__ import annotations

import trio

from ...shared import linkcodes, protocol
from ..link import Conn, short
from .run import Run


def _away_limit(q: Run) -> float:
    """How long the kit waits for a device that must stay away the slowest backoff."""
    return max(q.o.reconnect_timeout, 3 * q.o.slowest_backoff)


async def revoked(q: Run, conn: Conn) -> Conn | None:
    # 4003 says the token will not work again soon; the kit then answers the next handshake 401, as a
    # hub does for a revoked token, and accepts the one after (the operator gave the token back).
    slowest = q.o.slowest_backoff
    q.listener.refuse_next = 1
    closed_at = await conn.close(linkcodes.Close.CREDENTIAL_REVOKED, "the device's token was revoked")
    conn.done.set()
    refused_at = await q.listener.next_refusal(_away_limit(q))
    if refused_at is None:
        q.listener.refuse_next = 0
        q.check("X5", False, f"no handshake within {_away_limit(q):.0f} s of close 4003: the document wants the "
                             f"device back with its slowest backoff, not gone for good")
        q.check("T2", False, "not run: the device did not come back after close 4003")
        return None
    gap = refused_at - closed_at
    q.check("X5", gap >= slowest,
            f"the next handshake came {gap:.2f} s after close 4003",
            f"the document wants the slowest backoff (the device's backoff cap; the kit wants at least "
            f"{slowest:g} s): the token will not work sooner")
    nxt = await q.listener.next_conn(_away_limit(q))
    if nxt is None:
        q.check("T2", False, f"no handshake within {_away_limit(q):.0f} s of the 401")
        return None
    gap = nxt.opened_at - refused_at
    q.check("T2", gap >= slowest,
            f"the handshake after a 401 came {gap:.2f} s after it",
            f"the document wants no retry of a 401 sooner than the slowest backoff (the device's backoff cap; "
            f"the kit wants at least {slowest:g} s)")
    return nxt if await q.handshake(nxt) is not None else None


async def out_of_order(q: Run, conn: Conn) -> Conn | None:
    # As if the device had sent a second hello: it reconnects and says hello once on the new link.
    await conn.close(linkcodes.Close.OUT_OF_ORDER, "a hello after the link's hello")
    nxt = await q.next_link(conn)
    if nxt is None:
        q.check("X6", False, f"no reconnect within {q.o.reconnect_timeout:.0f} s of close 4409")
        return None
    await trio.sleep(max(1.0, 2 * q.o.heartbeat))
    wrong = [r for r in nxt.frames[1:] if isinstance(r.frame, (protocol.Hello, protocol.Welcome, protocol.Command))]
    q.check("X6", not wrong and not nxt.closed.is_set(),
            f"after close 4409 the device reconnected and sent {short([r.text for r in wrong], 160)} after its "
            f"hello; the document wants the hello once per link and no welcome or command from the device"
            if wrong else "after close 4409 the device reconnected with one hello and nothing out of order"
            if not nxt.closed.is_set() else f"after close 4409 the new link closed ({nxt.close_code})")
    return nxt


async def unknown_version(q: Run, conn: Conn) -> Conn | None:
    # A hub that no longer speaks the device's version: come back with a version the reason lists,
    # or with the slowest backoff, not straight back with the refused one.
    version = conn.hello.protocol if conn.hello is not None else 1
    spoken = version + 1
    reason = f"hello.protocol: version {version} is not supported; this hub speaks {spoken}"
    closed_at = await conn.close(linkcodes.Close.UNKNOWN_VERSION, reason)
    conn.done.set()
    nxt = await q.listener.next_conn(_away_limit(q))
    if nxt is None:
        q.check("X7", False, f"no reconnect within {_away_limit(q):.0f} s of close 4426")
        return None
    first = await nxt.next(lambda r: True, q.o.hello_timeout)
    if first is not None:
        first.taken = False  # only looked at: the handshake reads it
    said = first.frame.protocol if first is not None and isinstance(first.frame, protocol.Hello) else None
    gap = nxt.opened_at - closed_at
    q.check("X7", said == spoken or gap >= q.o.slowest_backoff,
            f"after close 4426 {reason!r} the device came back {gap:.2f} s later with protocol {said}",
            f"the document wants a version the reason lists ({spoken}) or the slowest backoff (the device's "
            f"backoff cap; the kit wants at least {q.o.slowest_backoff:g} s)")
    return nxt if await q.handshake(nxt) is not None else None
