"""Steps about secret files (F1-F5) and configurations: apply (A1, A2), a rejected apply (A4) and an
apply the link dropped under (A5)."""

from __future__ import annotations

import uuid
from typing import Any

import trio

from ...shared import protocol, verbs
from ..link import Conn, short
from .reboots import REBOOT_REASON
from .run import BASE, Run, secret


async def files(q: Run, conn: Conn) -> Conn:
    owner = q.o.file_owner
    a, b = secret(f"{BASE}/a.txt", b"alpha\n", owner), secret(f"{BASE}/b.txt", b"beta\n", owner)
    put = q.strict("F1", "files.put", await q.cmd(conn, "files.put", {"files": [a, b]}))
    if put is not None:
        got = [(r.path, r.status, r.sha256) for r in put.results]
        want = [(f["path"], "on_device", f["sha256"]) for f in (a, b)]
        q.check("F1", got == want, f"results {short([r.model_dump(exclude_none=True) for r in put.results])}")
    c = secret(f"{BASE}/c.txt", b"gamma\n", owner)
    bad = secret("/etc/passwd", b"root::0:0::/root:/bin/sh\n", owner)
    put = q.strict("F2", "files.put", await q.cmd(conn, "files.put", {"files": [c, bad]}))
    if put is not None:
        statuses = [(r.path, r.status, bool(r.error)) for r in put.results]
        q.check("F2", statuses == [(c["path"], "on_device", False), ("/etc/passwd", "failed", True)],
                f"results {short([r.model_dump(exclude_none=True) for r in put.results], 240)}")
    big = secret(f"{BASE}/big.bin", b"x" * (64 * 1024 + 1), owner)
    put = q.strict("F3", "files.put", await q.cmd(conn, "files.put", {"files": [big]}))
    if put is not None:
        r = put.results[0] if put.results else None
        q.check("F3", r is not None and r.status == "failed" and bool(r.error),
                f"a 65537-byte file: {short(r.model_dump(exclude_none=True)) if r else 'no result'}")
    deleted = q.strict("F4", "files.delete", await q.cmd(conn, "files.delete", {"paths": [a["path"], b["path"]]}))
    if deleted is not None:
        got = [(r.path, r.status) for r in deleted.results]
        q.check("F4", got == [(a["path"], "removed"), (b["path"], "removed")], f"results {short(got)}")
    wiped = q.strict("F5", "files.wipe", await q.cmd(conn, "files.wipe", {}))
    if wiped is not None:
        q.check("F5", c["path"] in wiped.removed and not wiped.failed, f"removed {short(wiped.removed)}")
    return conn


async def configuration(q: Run, conn: Conn) -> Conn:
    config_id, version_id = str(uuid.uuid4()), str(uuid.uuid4())
    f = secret(f"{BASE}/config.txt", b"from the configuration\n", q.o.file_owner,
               source="configuration", configId=config_id)
    payload = {"configId": config_id, "versionId": version_id, "version": 1, "spec": {}, "files": [f]}
    result = q.strict("A1", "config.apply", await q.cmd(conn, "config.apply", payload, timeout=120))
    if result is not None:
        files = [(r.path, r.status) for r in result.files]
        q.check("A1", result.status == "applied" and result.configId == config_id
                and result.versionId == version_id and files == [(f["path"], "on_device")],
                f"result {short(result.model_dump(exclude_none=True), 240)}")
        q.expected_digests[f["path"]] = f["sha256"]
        q.config = {"configId": config_id, "versionId": version_id}
        q.config_files = [f]
    event = await conn.next(lambda r: isinstance(r.frame, protocol.Event) and r.frame.kind == "config.result"
                            and r.frame.payload.get("versionId") == version_id, q.o.event_timeout)
    if event is None:
        q.check("A2", False, f"no config.result event for the version within {q.o.event_timeout:.0f} s")
    else:
        try:
            verbs.check_event("config.result", event.frame.payload)
            q.check("A2", True, f"event config.result {short(event.frame.payload)}")
        except verbs.Malformed as exc:
            q.check("A2", False, str(exc))
    return conn


def _version(q: Run, spec: dict[str, Any], *, files: bool = True) -> dict[str, Any]:
    """A new version of the configuration A1 applied (its files with it, so they stay the device's)."""
    return {"configId": q.config["configId"], "versionId": str(uuid.uuid4()), "spec": spec,
            "files": q.config_files if files else []}


def _into(q: Run) -> float:
    """How far into a slow version's verification the kit drops the link or sends the reboot."""
    return min(0.3, q.o.verify_seconds / 4)


def _slow_spec(q: Run) -> dict[str, Any]:
    # A workload whose health check takes verify_seconds: the version is being verified that long.
    return {"workload": {"command": ["sleep", "600"],
                         "healthCheck": {"command": ["sleep", f"{q.o.verify_seconds:g}"], "graceSeconds": 0,
                                         "timeoutSeconds": q.o.verify_seconds + 30}}}


async def config_rejected(q: Run, conn: Conn) -> Conn:
    # An invalid spec (an empty workload command) is answered rejected, with the reason and the
    # version the device still runs (rolledBackTo), and the same result as event config.result.
    if not q.config:
        q.skip("A4", "config.apply of a valid version (A1) failed first")
        return conn
    payload = _version(q, {"workload": {"command": []}}, files=False)
    running = q.config["versionId"]
    result = q.strict("A4", "config.apply", await q.cmd(conn, "config.apply", payload, timeout=120))
    if result is not None:
        q.check("A4", result.status == "rejected" and bool(result.error) and result.rolledBackTo == running
                and result.versionId == payload["versionId"],
                f"spec {{workload: {{command: []}}}}: result {short(result.model_dump(exclude_none=True), 200)}",
                f"the document wants status rejected, an error in words and rolledBackTo {running!r} (the "
                f"version the device runs)")
    event = await _result_event(conn, payload["versionId"], q.o.event_timeout)
    q.check("A4", event is not None and event.get("status") == "rejected",
            f"event config.result {short(event)}" if event is not None else
            f"no config.result event for the rejected version within {q.o.event_timeout:.0f} s")
    return conn


async def interrupted_apply(q: Run, conn: Conn) -> Conn | None:
    """A5: an apply the link drops under, then one a reboot comes in on, then an empty version that
    stops the workload they started."""
    if not q.config:
        q.skip("A5", "config.apply of a valid version (A1) failed first")
        return conn
    running, cid = q.config["versionId"], conn.new_id()
    payload = _version(q, _slow_spec(q))
    new = payload["versionId"]
    sent = trio.current_time()
    await conn.send_command("config.apply", payload, id=cid)
    await trio.sleep(_into(q))
    await conn.close(1011, "qualification: the link dropped during config.apply")
    nxt = await q.next_link(conn)
    if nxt is None:
        return None
    said = nxt.hello.configVersionApplied
    early = nxt.opened_at < sent + q.o.verify_seconds  # its health check cannot have passed yet
    q.check("A5", said == running if early else said in (running, new),
            f"the link dropped {_into(q):g} s into a version's verification (its health check is "
            f"sleep {q.o.verify_seconds:g}); the hello {nxt.opened_at - sent:.2f} s after the apply said "
            f"configVersionApplied {said!r}",
            f"the document wants {running!r} (the version it runs) until the new one {new!r} is verified, "
            f"never a version being verified")
    again = q.strict("A5", "config.apply", await q.cmd(nxt, "config.apply", payload, id=cid, timeout=120))
    if again is not None:
        q.check("A5", again.status == "applied" and again.versionId == new,
                f"the apply's id sent again on the next link: {short(again.model_dump(exclude_none=True), 160)}",
                f"the document wants the first apply's result (applied, {new!r}), waited for if it still runs")
        q.config = {"configId": payload["configId"], "versionId": new}
    nxt = await _reboot_during_apply(q, nxt)
    if nxt is None:
        return None
    # the empty version: stop the workload the slow ones run
    payload = _version(q, {})
    result = q.strict("A1", "config.apply", await q.cmd(nxt, "config.apply", payload, timeout=120))
    if result is not None and q.check("A1", result.status == "applied", f"an empty version after A5: "
                                      f"{short(result.model_dump(exclude_none=True), 160)}"):
        q.config = {"configId": payload["configId"], "versionId": payload["versionId"]}
    return nxt


async def _reboot_during_apply(q: Run, conn: Conn) -> Conn | None:
    # The document: a reboot waits for every reply in flight. The apply's result reaches the hub
    # before the link closes, and the hello after the reboot names the version it applied.
    payload = _version(q, _slow_spec(q))
    apply_id, reboot_id = conn.new_id(), conn.new_id()
    await conn.send_command("config.apply", payload, id=apply_id)
    await trio.sleep(_into(q))
    await conn.send_command("reboot", {"reason": REBOOT_REASON}, id=reboot_id)
    applied = await conn.reply(apply_id, 120)
    rebooting = await conn.reply(reboot_id, 15)
    with trio.move_on_after(15):
        await conn.closed.wait()
    ok = applied is not None and applied.ok and (applied.payload or {}).get("status") == "applied"
    q.check("A5", ok and rebooting is not None,
            f"reboot sent {_into(q):g} s into a version's {q.o.verify_seconds:g}-s verification: the apply "
            f"answered {short(applied.payload if applied else 'nothing before the link closed', 120)}, the "
            f"reboot {short(rebooting.payload if rebooting else None, 60)}",
            "the document wants the apply's result (applied) sent before the reboot closes the link")
    q.booted()
    nxt = await q.next_link(conn)
    if nxt is None:
        return None
    if ok:
        q.config = {"configId": payload["configId"], "versionId": payload["versionId"]}
    said = nxt.hello.configVersionApplied
    q.check("A5", said == q.config["versionId"],
            f"after the reboot that waited for the apply, configVersionApplied {said!r}",
            f"the document wants the version applied, {q.config['versionId']!r}")
    return nxt


async def _result_event(conn: Conn, version_id: str, timeout: float) -> dict[str, Any] | None:
    event = await conn.next(lambda r: isinstance(r.frame, protocol.Event) and r.frame.kind == "config.result"
                            and r.frame.payload.get("versionId") == version_id, timeout)
    return event.frame.payload if event is not None else None
