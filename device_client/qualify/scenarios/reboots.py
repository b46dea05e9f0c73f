"""Steps about reboots: the reboot and its resent id (R1-R3, and what the hello after it holds: F6,
A3), and a second reboot without a reason (R4)."""

from __future__ import annotations

import trio

from ...shared import protocol
from ..link import Conn, short
from .run import Run

REBOOT_REASON = "qualify"
DEFAULT_REASON = "reboot"  # a reboot command without a reason


async def reboot(q: Run, conn: Conn) -> Conn | None:
    cid = conn.new_id()
    reply = await q.cmd(conn, "reboot", {"reason": REBOOT_REASON}, id=cid)
    answered = q.strict("R1", "reboot", reply)
    with trio.move_on_after(15):
        await conn.closed.wait()
    if answered is not None:
        q.check("R1", conn.closed.is_set(), f"reply {short(reply.payload)}; the device closed the link "
                f"({conn.close_code} {conn.close_reason!r})" if conn.closed.is_set() else
                "answered, but the link was still open 15 s later")
    q.booted()
    nxt = await q.next_link(conn)
    if nxt is None:
        return None
    hello: protocol.Hello = nxt.hello
    q.check("R2", hello.bootReason == REBOOT_REASON, f"bootReason {hello.bootReason!r} after reboot "
                                                        f"{{reason: {REBOOT_REASON!r}}}")
    digests = {p: hello.secretFileDigests.get(p) for p in q.expected_digests}
    q.check("F6", digests == q.expected_digests,
            f"secretFileDigests {short(digests, 240)}; expected {short(q.expected_digests, 240)}")
    if q.config:
        q.check("A3", hello.configVersionApplied == q.config["versionId"],
                f"configVersionApplied {hello.configVersionApplied!r}, applied {q.config['versionId']!r}")
    again = await q.cmd(nxt, "reboot", {"reason": REBOOT_REASON}, id=cid)
    with trio.move_on_after(2):
        await nxt.closed.wait()
    q.check("R3", again is not None and again.ok and again.payload == reply.payload and not nxt.closed.is_set(),
            f"the reboot id again: {short(again.model_dump(exclude_none=True)) if again else 'no reply'}; "
            f"link {'closed' if nxt.closed.is_set() else 'still up 2 s later'}" if reply else "no first reply")
    return nxt


async def reboot_without_reason(q: Run, conn: Conn) -> Conn | None:
    # R2's reboot named a reason; this one names none, so the document's default (reboot) is due.
    # A device that keeps the reason of the boot before (qualify, from R2's reboot) in the hello, or
    # reports a reconnect as a boot, tells the hub a story that did not happen.
    before = conn.hello.bootReason if conn.hello is not None else None
    reply = await q.cmd(conn, "reboot", {})
    if q.strict("R1", "reboot", reply) is None:
        return await _back_after_refused_reboot(q, conn)
    with trio.move_on_after(15):
        await conn.closed.wait()
    q.booted()
    nxt = await q.next_link(conn)
    if nxt is None:
        return None
    said = nxt.hello.bootReason
    q.check("R4", said == DEFAULT_REASON,
            f"after reboot {{}} (no reason) the hello said bootReason {said!r}; the document's default is "
            f"{DEFAULT_REASON!r}" + (f" (the boot before said {before!r})" if said == before else ""))
    return nxt


async def _back_after_refused_reboot(q: Run, conn: Conn) -> Conn | None:
    q.check("R4", False, "reboot {} (no reason) was not answered {rebooting: true}")
    return conn if not conn.closed.is_set() else await q.next_link(conn)
