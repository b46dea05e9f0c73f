"""Steps on the first link: commands and replies (C1-C6), idempotency (I1), key rotation (K1, K2) and
the heartbeat schedule (B1, B2)."""

from __future__ import annotations

import base64

import trio

from ...shared import verbs
from ..link import Conn, short
from .run import BASE, Run, secret

OTHER_DEVICE = "00000000-0000-4000-8000-000000000000"


async def commands(q: Run, conn: Conn) -> Conn:
    reply = await q.cmd(conn, "ping", {})
    pong = q.strict("C1", "ping", reply)
    if pong is not None:
        q.check("C1", True, short(reply.payload))
    reply = await q.cmd(conn, "qualify.no_such_verb", {})
    q.check("C3", reply is not None and not reply.ok and reply.error is not None
            and reply.error.code == "unknown_command", short(reply.model_dump(exclude_none=True)) if reply else "no reply")
    reply = await q.cmd(conn, "ping", {}, addressee=OTHER_DEVICE)
    q.check("C4", reply is not None and not reply.ok and reply.error is not None
            and reply.error.code == "wrong_device", short(reply.model_dump(exclude_none=True)) if reply else "no reply")
    for verb, payload in (("files.put", {"files": "not a list"}), ("config.apply", {"configId": 5}),
                          ("link.drain", {"reconnectAfter": "soon"})):
        reply = await q.cmd(conn, verb, payload)
        q.check("C5", reply is not None and not reply.ok and bool(reply.error and reply.error.code),
                f"{verb} {short(payload)} → {short(reply.model_dump(exclude_none=True)) if reply else 'no reply'}")
    alive = await q.cmd(conn, "ping", {})
    q.check("C5", alive is not None and alive.ok, "a ping after the malformed commands was answered"
            if alive is not None and alive.ok else "no ping answer after the malformed commands")
    await conn.send_text("this is not a frame {")
    await conn.send_text('{"type": "teleport"}')
    alive = await q.cmd(conn, "ping", {})
    q.check("C6", alive is not None and alive.ok and not conn.closed.is_set(),
            "after two undecodable frames the link is up and a ping is answered"
            if alive is not None and alive.ok else f"after an undecodable frame: closed {conn.close_code}")
    return conn


async def idempotency(q: Run, conn: Conn) -> Conn:
    # The same id twice with different contents: the device must answer the first reply and not
    # write the second contents (F6 reads the digest back after the reboot).
    owner, cid = q.o.file_owner, conn.new_id()
    first = secret(f"{BASE}/kept.txt", b"first\n", owner)
    second = {**first, **secret(f"{BASE}/kept.txt", b"second\n", owner), "fileId": first["fileId"]}
    r1 = await q.cmd(conn, "files.put", {"files": [first]}, id=cid)
    r2 = await q.cmd(conn, "files.put", {"files": [second]}, id=cid)
    same = r1 is not None and r2 is not None and r1.model_dump() == r2.model_dump()
    try:
        wrote = [r.sha256 for r in verbs.check_reply("files.put", r1.payload).results] if r1 and r1.ok else []
    except verbs.Malformed:
        wrote = []
    q.check("I1", same and wrote == [first["sha256"]],
            f"id {cid} twice: first {short(r1.payload if r1 else None, 100)}, "
            f"second {short(r2.payload if r2 else None, 100)}")
    # a ping repeated a second later: a device that ran it again would tell a later clock
    cid = conn.new_id()
    p1 = await q.cmd(conn, "ping", {}, id=cid)
    await trio.sleep(1.1)
    p2 = await q.cmd(conn, "ping", {}, id=cid)
    valid = p1 is not None and p1.ok and "deviceClock" in (p1.payload or {})
    q.check("I1", valid and p2 is not None and p1.model_dump() == p2.model_dump(),
            f"ping id {cid} twice, 1.1 s apart: {short(p1.payload if p1 else None, 80)}, "
            f"{short(p2.payload if p2 else None, 80)}")
    q.expected_digests[first["path"]] = first["sha256"]
    return conn


async def keys(q: Run, conn: Conn) -> Conn:
    from nacl.signing import SigningKey

    key = base64.b64encode(bytes(SigningKey.generate().verify_key)).decode()
    reply = await q.cmd(conn, "link.keys", {"hubKeys": {"qualify-1": key}})
    kids = q.strict("K1", "link.keys", reply)
    if kids is not None:
        q.check("K1", kids.kids == ["qualify-1"], f"reply {short(reply.payload)}")
    reply = await q.cmd(conn, "link.keys", {"hubKeys": {"bad": base64.b64encode(b"not a key").decode()}})
    q.check("K2", reply is not None and not reply.ok and reply.error is not None
            and reply.error.code == "invalid_payload", short(reply.model_dump(exclude_none=True)) if reply else "no reply")
    return conn

async def heartbeats(q: Run, conn: Conn) -> Conn:
    interval = q.o.heartbeat
    await trio.sleep_until(conn.opened_at + 3.6 * interval)
    beats = [h.at for h in conn.heartbeats]
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    ok = len(beats) >= 3 and all(0.5 * interval <= g <= 2 * interval for g in gaps)
    q.check("B1", ok, f"{len(beats)} heartbeats in {trio.current_time() - conn.opened_at:.1f} s at interval "
                         f"{interval} s; gaps {short([round(g, 2) for g in gaps], 100)}")
    for h in conn.heartbeats[:5]:
        try:
            verbs.check_event("heartbeat", h.frame.payload)
            q.check("B2", True, f"payload {short(h.frame.payload)}")
        except verbs.Malformed as exc:
            q.check("B2", False, str(exc))
    if not conn.heartbeats:
        q.check("B2", False, "no heartbeat arrived")
    return conn
