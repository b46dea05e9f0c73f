"""One qualification run's state and its handling of links: the options, the verdict of each rule,
the commands whose replies rule C2 checks, the handshake (answered by the hub's own link side,
device_client/shared/link/hubside.py, so the kit cannot drift from the hub on what a first frame earns)
and ending a link as the hub ends it. The steps (the sibling modules) take a ``Run``."""

from __future__ import annotations

import base64
import hashlib
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...shared import linkcodes, protocol, systemfacts, verbs
from ...shared.link.events import ProtocolViolation
from ...shared.link.hubside import HubSide
from ..link import Conn, Listener, short
from ..rules import RULES

BASE = "/var/lib/fleethub/secrets/qualify"
BOOT_REASON = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


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
    # T2, X5, X7: the least time away the document's "slowest backoff" (a device's backoff cap) may
    # mean; after 4003, after a 401 and after 4426 the device stays away at least this long.
    slowest_backoff: float = 10.0
    memtest_timeout: float = 120.0  # M1: a started quick memory test must end (a result) within this
    verify_seconds: float = 2.0  # A5: how long the interrupted version's health check takes


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


class Run:
    """What one qualification has seen so far, and how it talks to the device."""

    def __init__(self, listener: Listener, options: Options | None = None) -> None:
        self.listener = listener
        self.o = options or Options()
        self.verdicts = {r.id: Verdict(r.id) for r in RULES}
        self.expected_digests: dict[str, str] = {}
        self.config: dict[str, str] = {}  # the configuration version the device last applied
        self.config_files: list[dict[str, Any]] = []  # its files (each new version carries them)
        self.boot_reason: str | None = None  # what every hello must say until the device's next boot

    # ---- recording ----

    def check(self, rule: str, ok: bool, evidence: str, wanted: str | None = None) -> bool:
        """Record an observation; a failed one also says what the document wants (``wanted``), for
        the device maker who reads only the verdict."""
        if not ok and wanted:
            evidence = f"{evidence}; {wanted}"
        self.verdicts[rule].checks.append((bool(ok), evidence))
        return bool(ok)

    def skip(self, rule: str, why: str) -> None:
        """``rule`` cannot be observed (what it needs failed first): NOT RUN, with why."""
        self.verdicts[rule].not_run = why

    def not_run(self, why: str) -> None:
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

    # ---- links ----

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
        # the members the hub keeps only within bounds (it cuts or drops the rest): a device sends them so
        bounds = systemfacts.checked(hello.system)[1]
        if hello.tunnelTargets is not None:
            bounds += protocol.bounded_targets(hello.tunnelTargets.model_dump())[1]
        if len(hello.agentVersion) > protocol.AGENT_VERSION_MAX:
            bounds.append(f"agentVersion: {len(hello.agentVersion)} characters, over {protocol.AGENT_VERSION_MAX}")
        self.check("H2", not bounds, f"hello of {len(first.text)} bytes with {sorted(hello.model_fields_set)}"
                   + (f"; out of bounds: {'; '.join(bounds)}" if bounds else ""))
        self.check("H3", hello.protocol in linkcodes.SUPPORTED_VERSIONS,
                   f"protocol {hello.protocol}{'' if 'protocol' in hello.model_fields_set else ' (absent: 1)'}; "
                   f"supported {list(linkcodes.SUPPORTED_VERSIONS)}")
        self.check("H4", bool(BOOT_REASON.match(hello.bootReason)), f"bootReason {hello.bootReason!r}")
        if refused is not None:  # an unsupported version: closed as the hub closes it (4426)
            await self.end(conn, verdict)
            return None
        await conn.send_text(protocol.encode(protocol.Welcome(deviceId=conn.device_id, heartbeatInterval=self.o.heartbeat)))
        conn.hello = hello
        self.same_boot(hello)
        return hello

    def same_boot(self, hello: protocol.Hello) -> None:
        """R4: a link that is not the first after a boot names the boot's reason, as the first did
        (bootReason is why the device last booted, not why it last connected)."""
        if self.boot_reason is None:
            self.boot_reason = hello.bootReason
            return
        self.check("R4", hello.bootReason == self.boot_reason,
                   f"a reconnect without a reboot: bootReason {hello.bootReason!r}, the boot's {self.boot_reason!r}",
                   "the document wants the boot's reason on every link of that boot (the hello says why the "
                   "device last booted, and it did not boot)")

    def booted(self) -> None:
        """The device was told to reboot: the next hello starts a boot (its reason is checked by the step)."""
        self.boot_reason = None

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
