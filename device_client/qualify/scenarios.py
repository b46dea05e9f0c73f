"""What the kit does to the device under test, in order, and which rule each observation proves.

One device, several links: the first carries the handshake, heartbeats, commands, secret files, a
configuration and key rotation; then a reboot, a drain, an oversized frame and the hub's closes
(4002, 4004, 4408, 4001) each end a link and the device must come back as the document says. The
kit answers the handshake with the hub's own link side (device_client/link/hubside.py): a first
frame the hub would refuse is closed with the hub's code and reason, and every link the kit ends
gets a close code (never a dropped socket, 1006). Timings are read off the kit's own clock. The kit writes only under
/var/lib/fleethub/secrets/qualify/ and wipes what it put at the end; it applies an empty
configuration (no workload), so run it against a device under test, not one in service.
"""

from __future__ import annotations

import base64
import hashlib
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import trio

from .. import linkcodes, protocol, verbs
from ..link.events import ProtocolViolation
from ..link.hubside import HubSide
from .link import Conn, Listener, short
from .rules import BY_ID, RULES

BASE = "/var/lib/fleethub/secrets/qualify"
OTHER_DEVICE = "00000000-0000-4000-8000-000000000000"
BOOT_REASON = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
REBOOT_REASON = "qualify"


@dataclass
class Options:
    heartbeat: float = 1.0  # welcome.heartbeatInterval the kit gives the device
    hello_timeout: float = 10.0
    first_timeout: float = 600.0  # waiting for the device's first connection
    reconnect_timeout: float = 60.0  # waiting for it to come back after a reboot, drain or close
    superseded_wait: float = linkcodes.SUPERSEDED_BACKOFF
    file_owner: tuple[int, int] = (0, 0)
    drain_after: float = 1.0
    event_timeout: float = 10.0  # waiting for an event the device owes (config.result)
    # X1: links the kit closes with 4002 before its welcome (a device resets its backoff only after a
    # welcome), and the least total time the device must stay away over them and the first reconnect.
    backoff_probes: int = 5
    backoff_min_total: float = 1.0
    drain_window: float = 2.0  # X3: the window the kit's 4004 reason states
    hello_at_once: float = 1.0  # X4: after 4408 the hello comes within this many seconds of the handshake


@dataclass
class Verdict:
    rule: str
    checks: list[tuple[bool, str]] = field(default_factory=list)
    not_run: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(ok for ok, _ in self.checks)

    @property
    def status(self) -> str:
        if not self.checks:
            return "NOT RUN"
        return "PASS" if self.passed else "FAIL"

    @property
    def evidence(self) -> str:
        if not self.checks:
            return self.not_run or "no observation"
        failed = [e for ok, e in self.checks if not ok]
        return failed[0] if failed else self.checks[-1][1]


def secret(path: str, content: bytes, owner: tuple[int, int], **extra: Any) -> dict[str, Any]:
    return {"fileId": str(uuid.uuid4()), "path": path, "mode": 0o600, "uid": owner[0], "gid": owner[1],
            "contentB64": base64.b64encode(content).decode(), "sha256": hashlib.sha256(content).hexdigest(),
            "source": "device", **extra}


class Qualification:
    def __init__(self, listener: Listener, options: Options | None = None) -> None:
        self.listener = listener
        self.o = options or Options()
        self.verdicts = {r.id: Verdict(r.id) for r in RULES}
        self.expected_digests: dict[str, str] = {}
        self.config: dict[str, str] = {}

    # ---- recording ----

    def check(self, rule: str, ok: bool, evidence: str) -> bool:
        self.verdicts[rule].checks.append((bool(ok), evidence))
        return bool(ok)

    def _not_run(self, why: str) -> None:
        for v in self.verdicts.values():
            if not v.checks and v.not_run is None:
                v.not_run = why

    async def cmd(self, conn: Conn, verb: str, payload: dict[str, Any] | None = None, **kw: Any) -> protocol.Reply | None:
        """A command whose reply C2 checks: a reply frame with the id, ok, and a payload or an error."""
        cid = kw.pop("id", None) or conn.new_id()
        reply = await conn.command(verb, payload, id=cid, **kw)
        if reply is None:
            self.check("C2", False, f"{verb} (id {cid}): no reply within {kw.get('timeout', 15.0)} s")
        else:
            self.check("C2", reply.ok is not None and (reply.ok or reply.error is not None),
                       f"{verb} (id {cid}): {short(reply.model_dump(exclude_none=True))}")
        return reply

    def strict(self, rule: str, verb: str, reply: protocol.Reply | None) -> Any:
        """The reply's payload as its verb's model, or None (a failed check of ``rule``)."""
        if reply is None or not reply.ok:
            self.check(rule, False, f"{verb}: {short(reply.model_dump(exclude_none=True)) if reply else 'no reply'}")
            return None
        try:
            return verbs.check_reply(verb, reply.payload)
        except verbs.Malformed as exc:
            self.check(rule, False, f"{exc} (payload {short(reply.payload)})")
            return None

    # ---- the run ----

    async def run(self) -> dict[str, Verdict]:
        conn = await self.listener.next_conn(self.o.first_timeout)
        if conn is None:
            if self.listener.refused:  # it tried: say why it was turned away, not just "not run"
                self.check("T1", False, f"handshake refused {len(self.listener.refused)}x, last: "
                                        f"{self.listener.refused[-1]}")
            self._not_run(f"no device connected within {self.o.first_timeout:.0f} s")
            return self.verdicts
        hello = await self.handshake(conn)
        if hello is None:
            self._not_run("the handshake failed")
            return self.verdicts
        steps = [self.commands, self.files, self.idempotency, self.configuration, self.keys, self.heartbeats,
                 self.reboot, self.drain, self.oversized, self.heartbeat_timeout_close, self.draining_close,
                 self.hello_timeout_close, self.superseded_close]
        for step in steps:
            nxt = await step(conn)
            if nxt is None:
                self._not_run(f"the device did not come back after {step.__name__.replace('_', ' ')}")
                return self.verdicts
            conn = nxt
        await self.cmd(conn, "files.wipe", {})  # leave nothing of ours on the device
        await self.end(conn)
        return self.verdicts

    async def handshake(self, conn: Conn) -> protocol.Hello | None:
        self.check("T1", bool(conn.authorization) and conn.authorization.lower().startswith("bearer "),
                   f"Authorization: {'Bearer …' if conn.authorization else 'missing'}")
        # The hub's own link side decides what a first frame earns (the code and reason a hub closes
        # with), so the kit cannot drift from the hub on what it accepts.
        side = HubSide(conn.opened_at, hello_timeout=self.o.hello_timeout)
        first = await conn.next(lambda r: True, self.o.hello_timeout)
        if first is None:
            self.check("H1", False, f"no frame within {self.o.hello_timeout:.0f} s")
            await self.end(conn, side.tick(conn.opened_at + self.o.hello_timeout))
            return None
        delay = first.at - conn.opened_at
        verdict = side.receive(first.text, first.at)
        refused = next((e for e in verdict if isinstance(e, ProtocolViolation)), None)
        is_hello = isinstance(first.frame, protocol.Hello)
        if not self.check("H1", is_hello and delay <= self.o.hello_timeout,
                          f"first frame after {delay:.2f} s: {short(first.text, 120)}"):
            self.check("H2", False, f"closed {refused.code} {refused.reason!r}" if refused else
                       f"a {getattr(first.frame, 'type', '?')} frame, not a hello")
            await self.end(conn, verdict)
            return None
        hello: protocol.Hello = first.frame
        self.check("H2", True, f"hello of {len(first.text)} bytes with {sorted(hello.model_fields_set)}")
        self.check("H3", hello.protocol in linkcodes.SUPPORTED_VERSIONS,
                   f"protocol {hello.protocol}{'' if 'protocol' in hello.model_fields_set else ' (absent: 1)'}; "
                   f"supported {list(linkcodes.SUPPORTED_VERSIONS)}")
        self.check("H4", bool(BOOT_REASON.match(hello.bootReason)), f"bootReason {hello.bootReason!r}")
        if refused is not None:  # an unsupported version: closed as the hub closes it (4426)
            await self.end(conn, verdict)
            return None
        await conn.send_text(protocol.encode(protocol.Welcome(deviceId=conn.device_id, heartbeatInterval=self.o.heartbeat)))
        conn.hello = hello
        return hello

    async def end(self, conn: Conn, verdict: list[object] | None = None) -> None:
        """Close ``conn`` as the hub would: with the violation's code and reason when ``verdict`` holds
        one, else 1000; then release it to the listener."""
        refused = next((e for e in verdict or [] if isinstance(e, ProtocolViolation)), None)
        if not conn.closed.is_set():
            if refused is not None:
                await conn.close(refused.code, refused.reason)
            else:
                await conn.close(1000, "qualification finished")
        conn.done.set()

    async def next_link(self, previous: Conn, timeout: float | None = None) -> Conn | None:
        previous.done.set()
        conn = await self.listener.next_conn(timeout or self.o.reconnect_timeout)
        if conn is None:
            return None
        return conn if await self.handshake(conn) is not None else None

    # ---- steps on a live link: each returns the link to go on with ----

    async def commands(self, conn: Conn) -> Conn:
        reply = await self.cmd(conn, "ping", {})
        pong = self.strict("C1", "ping", reply)
        if pong is not None:
            self.check("C1", True, short(reply.payload))
        reply = await self.cmd(conn, "qualify.no_such_verb", {})
        self.check("C3", reply is not None and not reply.ok and reply.error is not None
                   and reply.error.code == "unknown_command", short(reply.model_dump(exclude_none=True)) if reply else "no reply")
        reply = await self.cmd(conn, "ping", {}, addressee=OTHER_DEVICE)
        self.check("C4", reply is not None and not reply.ok and reply.error is not None
                   and reply.error.code == "wrong_device", short(reply.model_dump(exclude_none=True)) if reply else "no reply")
        for verb, payload in (("files.put", {"files": "not a list"}), ("config.apply", {"configId": 5}),
                              ("link.drain", {"reconnectAfter": "soon"})):
            reply = await self.cmd(conn, verb, payload)
            self.check("C5", reply is not None and not reply.ok and bool(reply.error and reply.error.code),
                       f"{verb} {short(payload)} → {short(reply.model_dump(exclude_none=True)) if reply else 'no reply'}")
        alive = await self.cmd(conn, "ping", {})
        self.check("C5", alive is not None and alive.ok, "a ping after the malformed commands was answered"
                   if alive is not None and alive.ok else "no ping answer after the malformed commands")
        await conn.send_text("this is not a frame {")
        await conn.send_text('{"type": "teleport"}')
        alive = await self.cmd(conn, "ping", {})
        self.check("C6", alive is not None and alive.ok and not conn.closed.is_set(),
                   "after two undecodable frames the link is up and a ping is answered"
                   if alive is not None and alive.ok else f"after an undecodable frame: closed {conn.close_code}")
        return conn

    async def files(self, conn: Conn) -> Conn:
        owner = self.o.file_owner
        a, b = secret(f"{BASE}/a.txt", b"alpha\n", owner), secret(f"{BASE}/b.txt", b"beta\n", owner)
        put = self.strict("F1", "files.put", await self.cmd(conn, "files.put", {"files": [a, b]}))
        if put is not None:
            got = [(r.path, r.status, r.sha256) for r in put.results]
            want = [(f["path"], "on_device", f["sha256"]) for f in (a, b)]
            self.check("F1", got == want, f"results {short([r.model_dump(exclude_none=True) for r in put.results])}")
        c = secret(f"{BASE}/c.txt", b"gamma\n", owner)
        bad = secret("/etc/passwd", b"root::0:0::/root:/bin/sh\n", owner)
        put = self.strict("F2", "files.put", await self.cmd(conn, "files.put", {"files": [c, bad]}))
        if put is not None:
            statuses = [(r.path, r.status, bool(r.error)) for r in put.results]
            self.check("F2", statuses == [(c["path"], "on_device", False), ("/etc/passwd", "failed", True)],
                       f"results {short([r.model_dump(exclude_none=True) for r in put.results], 240)}")
        big = secret(f"{BASE}/big.bin", b"x" * (64 * 1024 + 1), owner)
        put = self.strict("F3", "files.put", await self.cmd(conn, "files.put", {"files": [big]}))
        if put is not None:
            r = put.results[0] if put.results else None
            self.check("F3", r is not None and r.status == "failed" and bool(r.error),
                       f"a 65537-byte file: {short(r.model_dump(exclude_none=True)) if r else 'no result'}")
        deleted = self.strict("F4", "files.delete", await self.cmd(conn, "files.delete", {"paths": [a["path"], b["path"]]}))
        if deleted is not None:
            got = [(r.path, r.status) for r in deleted.results]
            self.check("F4", got == [(a["path"], "removed"), (b["path"], "removed")], f"results {short(got)}")
        wiped = self.strict("F5", "files.wipe", await self.cmd(conn, "files.wipe", {}))
        if wiped is not None:
            self.check("F5", c["path"] in wiped.removed and not wiped.failed, f"removed {short(wiped.removed)}")
        return conn

    async def idempotency(self, conn: Conn) -> Conn:
        # The same id twice with different contents: the device must answer the first reply and not
        # write the second contents (F6 reads the digest back after the reboot).
        owner, cid = self.o.file_owner, conn.new_id()
        first = secret(f"{BASE}/kept.txt", b"first\n", owner)
        second = {**first, **secret(f"{BASE}/kept.txt", b"second\n", owner), "fileId": first["fileId"]}
        r1 = await self.cmd(conn, "files.put", {"files": [first]}, id=cid)
        r2 = await self.cmd(conn, "files.put", {"files": [second]}, id=cid)
        same = r1 is not None and r2 is not None and r1.model_dump() == r2.model_dump()
        try:
            wrote = [r.sha256 for r in verbs.check_reply("files.put", r1.payload).results] if r1 and r1.ok else []
        except verbs.Malformed:
            wrote = []
        self.check("I1", same and wrote == [first["sha256"]],
                   f"id {cid} twice: first {short(r1.payload if r1 else None, 100)}, "
                   f"second {short(r2.payload if r2 else None, 100)}")
        # a ping repeated a second later: a device that ran it again would tell a later clock
        cid = conn.new_id()
        p1 = await self.cmd(conn, "ping", {}, id=cid)
        await trio.sleep(1.1)
        p2 = await self.cmd(conn, "ping", {}, id=cid)
        valid = p1 is not None and p1.ok and "deviceClock" in (p1.payload or {})
        self.check("I1", valid and p2 is not None and p1.model_dump() == p2.model_dump(),
                   f"ping id {cid} twice, 1.1 s apart: {short(p1.payload if p1 else None, 80)}, "
                   f"{short(p2.payload if p2 else None, 80)}")
        self.expected_digests[first["path"]] = first["sha256"]
        return conn

    async def configuration(self, conn: Conn) -> Conn:
        config_id, version_id = str(uuid.uuid4()), str(uuid.uuid4())
        f = secret(f"{BASE}/config.txt", b"from the configuration\n", self.o.file_owner,
                   source="configuration", configId=config_id)
        payload = {"configId": config_id, "versionId": version_id, "version": 1, "spec": {}, "files": [f]}
        result = self.strict("A1", "config.apply", await self.cmd(conn, "config.apply", payload, timeout=120))
        if result is not None:
            files = [(r.path, r.status) for r in result.files]
            self.check("A1", result.status == "applied" and result.configId == config_id
                       and result.versionId == version_id and files == [(f["path"], "on_device")],
                       f"result {short(result.model_dump(exclude_none=True), 240)}")
            self.expected_digests[f["path"]] = f["sha256"]
            self.config = {"configId": config_id, "versionId": version_id}
        event = await conn.next(lambda r: isinstance(r.frame, protocol.Event) and r.frame.kind == "config.result"
                                and r.frame.payload.get("versionId") == version_id, self.o.event_timeout)
        if event is None:
            self.check("A2", False, f"no config.result event for the version within {self.o.event_timeout:.0f} s")
        else:
            try:
                verbs.check_event("config.result", event.frame.payload)
                self.check("A2", True, f"event config.result {short(event.frame.payload)}")
            except verbs.Malformed as exc:
                self.check("A2", False, str(exc))
        return conn

    async def keys(self, conn: Conn) -> Conn:
        from nacl.signing import SigningKey

        key = base64.b64encode(bytes(SigningKey.generate().verify_key)).decode()
        reply = await self.cmd(conn, "link.keys", {"hubKeys": {"qualify-1": key}})
        kids = self.strict("K1", "link.keys", reply)
        if kids is not None:
            self.check("K1", kids.kids == ["qualify-1"], f"reply {short(reply.payload)}")
        reply = await self.cmd(conn, "link.keys", {"hubKeys": {"bad": base64.b64encode(b"not a key").decode()}})
        self.check("K2", reply is not None and not reply.ok and reply.error is not None
                   and reply.error.code == "invalid_payload", short(reply.model_dump(exclude_none=True)) if reply else "no reply")
        return conn

    async def heartbeats(self, conn: Conn) -> Conn:
        interval = self.o.heartbeat
        await trio.sleep_until(conn.opened_at + 3.6 * interval)
        beats = [h.at for h in conn.heartbeats]
        gaps = [b - a for a, b in zip(beats, beats[1:])]
        ok = len(beats) >= 3 and all(0.5 * interval <= g <= 2 * interval for g in gaps)
        self.check("B1", ok, f"{len(beats)} heartbeats in {trio.current_time() - conn.opened_at:.1f} s at interval "
                             f"{interval} s; gaps {short([round(g, 2) for g in gaps], 100)}")
        for h in conn.heartbeats[:5]:
            try:
                verbs.check_event("heartbeat", h.frame.payload)
                self.check("B2", True, f"payload {short(h.frame.payload)}")
            except verbs.Malformed as exc:
                self.check("B2", False, str(exc))
        if not conn.heartbeats:
            self.check("B2", False, "no heartbeat arrived")
        return conn

    async def reboot(self, conn: Conn) -> Conn | None:
        cid = conn.new_id()
        reply = await self.cmd(conn, "reboot", {"reason": REBOOT_REASON}, id=cid)
        answered = self.strict("R1", "reboot", reply)
        with trio.move_on_after(15):
            await conn.closed.wait()
        if answered is not None:
            self.check("R1", conn.closed.is_set(), f"reply {short(reply.payload)}; the device closed the link "
                       f"({conn.close_code} {conn.close_reason!r})" if conn.closed.is_set() else
                       "answered, but the link was still open 15 s later")
        nxt = await self.next_link(conn)
        if nxt is None:
            return None
        hello: protocol.Hello = nxt.hello
        self.check("R2", hello.bootReason == REBOOT_REASON, f"bootReason {hello.bootReason!r} after reboot "
                                                            f"{{reason: {REBOOT_REASON!r}}}")
        digests = {p: hello.secretFileDigests.get(p) for p in self.expected_digests}
        self.check("F6", digests == self.expected_digests,
                   f"secretFileDigests {short(digests, 240)}; expected {short(self.expected_digests, 240)}")
        if self.config:
            self.check("A3", hello.configVersionApplied == self.config["versionId"],
                       f"configVersionApplied {hello.configVersionApplied!r}, applied {self.config['versionId']!r}")
        again = await self.cmd(nxt, "reboot", {"reason": REBOOT_REASON}, id=cid)
        with trio.move_on_after(2):
            await nxt.closed.wait()
        self.check("R3", again is not None and again.ok and again.payload == reply.payload and not nxt.closed.is_set(),
                   f"the reboot id again: {short(again.model_dump(exclude_none=True)) if again else 'no reply'}; "
                   f"link {'closed' if nxt.closed.is_set() else 'still up 2 s later'}" if reply else "no first reply")
        return nxt

    async def drain(self, conn: Conn) -> Conn | None:
        after = self.o.drain_after
        reply = await self.cmd(conn, "link.drain", {"reconnectAfter": after})
        drained = self.strict("D1", "link.drain", reply)
        with trio.move_on_after(10):
            await conn.closed.wait()
        if drained is not None:
            self.check("D1", conn.close_code == linkcodes.Close.GOING_AWAY,
                       f"closed with {conn.close_code} {conn.close_reason!r}" if conn.closed.is_set() else
                       "the link was still open 10 s after link.drain")
        nxt = await self.next_link(conn)
        if nxt is not None and conn.closed_at is not None:
            gap = nxt.opened_at - conn.closed_at
            self.check("D1", gap <= after + 2.0, f"reconnected {gap:.2f} s after the close (reconnectAfter {after} s)")
        return nxt

    async def oversized(self, conn: Conn) -> Conn | None:
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
            self.check("L1", False, f"{size} was answered: {short(late.model_dump(exclude_none=True))}")
        if not conn.closed.is_set():
            self.check("L1", False, f"{size}: the link was still open 10 s later (the device must close with 1009)")
            await self.end(conn)
            return await self.next_link(conn)
        self.check("L1", conn.close_code == linkcodes.Close.TOO_BIG and bool(conn.close_reason),
                   f"{size}: the device closed with {conn.close_code} {conn.close_reason!r}")
        nxt = await self.next_link(conn)
        self.check("L1", nxt is not None, "it reconnected" if nxt else
                   f"no reconnect within {self.o.reconnect_timeout:.0f} s of the 1009")
        return nxt

    async def heartbeat_timeout_close(self, conn: Conn) -> Conn | None:
        # Backoff, measured: after 4002 the kit closes the next links with 4002 again as soon as their
        # hello is in, before any welcome (a device may reset its backoff after a welcome, never
        # before). A device that comes straight back each time adds up to almost nothing.
        reason = "heartbeat timeout: no heartbeat for 3 intervals"
        await conn.close(linkcodes.Close.HEARTBEAT_TIMEOUT, reason)
        conn.done.set()
        closed_at, gaps = trio.current_time(), []
        for _ in range(self.o.backoff_probes):
            probe = await self.listener.next_conn(self.o.reconnect_timeout)
            if probe is None:
                self.check("X1", False, f"no reconnect within {self.o.reconnect_timeout:.0f} s of close 4002 "
                                        f"(after {len(gaps)} reconnects)")
                return None
            gaps.append(probe.opened_at - closed_at)
            await probe.next(lambda r: True, self.o.hello_timeout)  # its hello, unanswered
            await probe.close(linkcodes.Close.HEARTBEAT_TIMEOUT, reason)
            probe.done.set()
            closed_at = trio.current_time()
        nxt = await self.listener.next_conn(self.o.reconnect_timeout)
        if nxt is None:
            self.check("X1", False, f"no reconnect within {self.o.reconnect_timeout:.0f} s of close 4002")
            return None
        gaps.append(nxt.opened_at - closed_at)
        total = sum(gaps)
        self.check("X1", total >= self.o.backoff_min_total,
                   f"{len(gaps)} reconnects after close 4002 ({self.o.backoff_probes} closed before the welcome): "
                   f"away {total:.2f} s in all (at least {self.o.backoff_min_total:g} s); gaps "
                   f"{short([round(g, 3) for g in gaps], 100)}")
        return nxt if await self.handshake(nxt) is not None else None

    async def draining_close(self, conn: Conn) -> Conn | None:
        window = self.o.drain_window
        await conn.close(linkcodes.Close.DRAINING, f"the hub is shutting down; reconnect within {window:g} s")
        closed_at = trio.current_time()
        nxt = await self.next_link(conn)
        if nxt is None:
            self.check("X3", False, f"no reconnect within {self.o.reconnect_timeout:.0f} s of close 4004")
            return None
        gap = nxt.opened_at - closed_at
        self.check("X3", gap <= window + 1.0, f"reconnected {gap:.2f} s after close 4004 whose reason said "
                                              f"within {window:g} s")
        return nxt

    async def hello_timeout_close(self, conn: Conn) -> Conn | None:
        await conn.close(linkcodes.Close.HELLO_TIMEOUT, f"no hello within {self.o.hello_timeout:g} s")
        conn.done.set()
        nxt = await self.listener.next_conn(self.o.reconnect_timeout)
        if nxt is None:
            self.check("X4", False, f"no reconnect within {self.o.reconnect_timeout:.0f} s of close 4408")
            return None
        hello = await nxt.next(lambda r: True, self.o.hello_at_once)
        if hello is not None:
            hello.taken = False  # only looked at: the handshake reads it
        self.check("X4", hello is not None and isinstance(hello.frame, protocol.Hello),
                   f"after close 4408 the first frame came {hello.at - nxt.opened_at:.2f} s after the handshake"
                   if hello is not None else f"no frame within {self.o.hello_at_once:g} s of the handshake after 4408")
        return nxt if await self.handshake(nxt) is not None else None

    async def superseded_close(self, conn: Conn) -> Conn | None:
        await conn.close(linkcodes.Close.SUPERSEDED, "qualification: superseded")
        closed_at = trio.current_time()
        nxt = await self.next_link(conn, 2 * self.o.superseded_wait + self.o.reconnect_timeout)
        if nxt is None:
            self.check("X2", False, "no reconnect after close 4001")
            return None
        gap = nxt.opened_at - closed_at
        self.check("X2", gap >= self.o.superseded_wait,
                   f"reconnected {gap:.2f} s after close 4001 (at least {self.o.superseded_wait:.0f} s)")
        return nxt


def rule_text(rule_id: str) -> str:
    return BY_ID[rule_id].text
