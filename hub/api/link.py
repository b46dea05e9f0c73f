"""The device link: ``GET /v1/device/link`` upgraded to a WebSocket (DESIGN.md section 9).

One handler per connected device, served on plain ASGI in front of Quart (hub/app.py ``HubApp``,
hub/asgi_websocket.py: about 15 KiB less per connected device than a Quart WebSocket). It authenticates the device token before accepting, waits for the
hello, registers the link, subscribes ``cmd.<device_id>.>`` on the bus (the newest connection of a
device wins) and then relays: replies resolve pending commands, heartbeats and events go to the
device's actor. Handlers elsewhere never touch this socket; they ask the actor or the bus.

A device can slow only itself: when its actor's mailbox is full the handler waits for room (it stops
reading that socket; TCP pushes back on the device) rather than dropping events, and its tunnel.usage
records in flight are bounded. A frame with a string the hub could not store (NUL) or an event kind
outside ``protocol.EVENT_KIND_PATTERN`` closes the link with 4400 and a reason naming the field.

Every way the hub ends a link has its own close code and a reason cut at a word
(device_client/shared/linkcodes.py): a hello timeout 4408, an unknown protocol version 4426, a newer link of
the same device 4001 (superseded), silence 4002, a revoked token 4003, shutdown 4004. A takeover
soon after others (two holders of one token) is held back before it is accepted, and counted for the
device's diagnosis (hub/linkhealth.py). A hello that omits a fact (firmware, architecture) leaves it
as it was; facts past their bounds (agentVersion, tunnelTargets, system) are cut, never the link, and
the cut is counted for the diagnosis like a protocol error.
"""

from __future__ import annotations

import logging
import math
import uuid
from typing import Any

import trio
from pydantic import BaseModel, ConfigDict
from quart import Blueprint
from quart_schema import hide

from actors.device import DeviceEvent, Hello
from actors.machines.connection import Heartbeat, LinkDown, LinkUp
from actors.runtime import ActorError, MailboxFull, Reply
from device_client.shared import protocol as p
from device_client.shared import systemfacts
from device_client.shared.clock import rfc3339
from device_client.shared.link import EventReceived, HeartbeatReceived, HubSide, ProtocolViolation, ReplyReceived
from device_client.shared.link.hubside import HELLO_TIMEOUT, LinkClosedError
from device_client.shared.linkcodes import Close
from hub import frames
from hub.api.common import services
from hub.api.validation import responds
from hub.asgi_websocket import AsgiWebSocket
from hub.auth.routes import public
from hub.auth.device import device_row, unauthenticated as device_unauthenticated
from hub.auth.schemes import bearer_of
from hub.errors import DeviceError, DeviceOffline, FleethubError, general_body
from hub.services import Link

log = logging.getLogger("fleethub.link")
bp = Blueprint("link", __name__)

# WebSocket close codes of the link, one per cause (device_client/shared/linkcodes.py, docs/device-protocol.md):
# a frame that is not JSON or not a frame; one out of order (a second hello, a welcome or a command
# from a device). Frames over MAX_FRAME_BYTES are closed with 1009 and a reason. Which frame gets
# which code is the protocol's (device_client/shared/link/hubside.py); this handler is its IO shell.
CLOSE_BAD_FRAME = Close.BAD_FRAME
CLOSE_OUT_OF_ORDER = Close.OUT_OF_ORDER
# Hello facts a hello may leave out: the hub keeps what it had (a partial hello blanks nothing).
KEPT_UNLESS_SENT = ("firmware", "architecture", "agentVersion", "tunnelPublicKey")
MAX_FRAME_BYTES = p.MAX_FRAME_BYTES
# tunnel.usage records of one link in flight at once (a session reports every 30 s): past it the link
# waits, i.e. stops reading that device's socket.
USAGE_IN_FLIGHT = 2
# How long a closing link waits for room in its actor's mailbox to say LinkDown.
LINK_DOWN_WITHIN = 5.0


class ProtocolDocument(BaseModel):
    """JSON Schema of the device link: every frame, verb payload and reply, event payload; close codes
    and limits (docs/device-protocol.md)."""
    model_config = ConfigDict(extra="allow")
    title: str
    protocolVersion: int
    supportedVersions: list[int]
    frames: dict[str, Any]
    verbs: dict[str, Any]
    events: dict[str, Any]
    closeCodes: list[dict[str, Any]]
    limits: dict[str, Any]


@bp.get("/v1/device/protocol.json")
@public
@responds(ProtocolDocument)
async def device_protocol():
    """The device link's contract as JSON Schema, for device makers and their tools (no credential).
    Built once, off the event loop (hub/documents.py), with an ETag."""
    return await services().protocol_document.response()


def _bound_facts(s, device_id: uuid.UUID, facts: dict[str, Any]) -> None:
    """The hello's facts as the hub keeps them: the agent version and the tunnel targets cut, the system
    facts within their bounds (device_client/shared/systemfacts.py) and stamped with when the hub heard
    them. What had to change is a protocol error for the device's diagnosis and a log line; the link
    goes on."""
    notes = []
    version = facts.get("agentVersion")
    if isinstance(version, str) and len(version) > p.AGENT_VERSION_MAX:
        facts["agentVersion"] = version[:p.AGENT_VERSION_MAX]
        notes.append(f"agentVersion: {len(version)} characters, the first {p.AGENT_VERSION_MAX} kept")
    if isinstance(facts.get("tunnelTargets"), dict):
        facts["tunnelTargets"], cut = p.bounded_targets(facts["tunnelTargets"])
        notes += cut
    system, system_notes = systemfacts.checked(facts.get("system"))
    facts["system"] = None if system is None else {**system, "at": rfc3339(s.clock.now())}
    notes += system_notes
    if notes:
        what = "hello: " + "; ".join(notes)
        log.warning("device %s: %s", device_id, what)
        s.link_health.protocol_error(device_id, what, s.clock.now())


@bp.get(p.LINK_PATH)
@public
@hide  # not an operation of the REST API: docs/device-protocol.md is the link's contract
async def device_link_without_upgrade():
    """The device link is a WebSocket (docs/device-protocol.md): a plain GET is answered 426."""
    raise FleethubError("GET /v1/device/link is the device link: open it as a WebSocket (docs/device-protocol.md)",
                        code="upgrade_required", status=426)


async def _feed(ws: AsgiWebSocket, side: HubSide) -> list[object]:
    """One turn of the IO shell: read a frame (or wait out the side's deadline) and feed it."""
    deadline = side.deadline()
    message = None
    with trio.move_on_at(math.inf if deadline is None else deadline):
        message = await ws.receive()
    now = trio.current_time()
    return side.tick(now) if message is None else side.receive(message, now)


async def _refuse(s, ws, device_id: uuid.UUID, violation: ProtocolViolation) -> None:
    """Close the link as the protocol said: the code and the reason naming what was refused."""
    if violation.code == p.CLOSE_TOO_BIG:
        s.metrics.frame_refused(device_id, violation.frame, violation.size, s.clock.now())
    # A device that sends what is not a frame is broken or hostile: end the link with the reason (it
    # reconnects and starts over); nothing else is affected.
    log.info("device %s: link closed (%d): %s", device_id, violation.code, violation.reason)
    await ws.close(violation.code, violation.reason)


class _Session:
    """What one live link keeps between frames, in slots: tens of thousands of links live for days, and
    every closure, cell, lock and dict they would otherwise hold is counted per device
    (bench/memory_profile.py). The send lock, the pending-command table and the tunnel.usage slots
    exist only while they are used."""

    __slots__ = ("_send_lock", "_usage_slots", "pending", "side", "ws")

    def __init__(self, ws: AsgiWebSocket, side: HubSide) -> None:
        self.ws, self.side = ws, side
        self.pending: dict[str, Reply] | None = None  # command id -> the caller waiting for its reply
        self._send_lock: trio.Lock | None = None
        self._usage_slots: trio.Semaphore | None = None

    async def send(self, text: str) -> None:
        # One sender at a time (the welcome here, commands from bus handlers in other tasks): wsproto
        # makes each frame before hypercorn's own lock, and a compressed link's frames must go out in
        # the order they were made. The lock is dropped once nobody holds it (trio hands a released
        # lock straight to the next waiter, so "not locked" means nobody waits either).
        lock = self._send_lock
        if lock is None:
            lock = self._send_lock = trio.Lock()
        try:
            async with lock:
                await self.ws.send(text)
        finally:
            if self._send_lock is lock and not lock.locked():
                self._send_lock = None

    def usage_slots(self) -> trio.Semaphore:
        """The bound on this link's tunnel.usage records in flight (made at the first one: few devices
        have tunnels)."""
        if self._usage_slots is None:
            self._usage_slots = trio.Semaphore(USAGE_IN_FLIGHT)
        return self._usage_slots

    async def on_command(self, subject: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The bus handler of ``cmd.<device_id>.>``: send the command, wait for the device's reply."""
        command = p.Command(id=uuid.uuid4().hex, subject=subject, payload=payload)
        try:
            text = self.side.command(command)
        except p.FrameTooLarge as exc:
            # never sent: the device would close the link (1009); the caller hears why instead
            raise DeviceError(str(exc), code="frame_too_large") from None
        except LinkClosedError:
            raise DeviceOffline("the device's link is closing") from None
        pending = self.pending
        if pending is None:
            pending = self.pending = {}
        reply = pending[command.id] = Reply()
        try:
            await self.send(text)
            answer: p.Reply = await reply.wait()
        finally:
            pending.pop(command.id, None)
            if not pending and self.pending is pending:
                self.pending = None
        if not answer.ok:
            err = answer.error or p.ReplyError(code="internal", message="the device reported an error")
            raise DeviceError(err.message or err.code, code=err.code)
        return answer.payload or {}

    def reply_received(self, reply: p.Reply) -> None:
        waiting = self.pending.get(reply.id) if self.pending else None
        if waiting is not None:
            waiting.set(reply)

    def fail_pending(self) -> None:
        for waiting in (self.pending or {}).values():
            waiting.fail(DeviceOffline("the device disconnected before answering"))


async def device_link(s, ws: AsgiWebSocket) -> None:
    """One device's link, from the upgrade to the close (served in front of Quart: hub/app.py HubApp).

    One coroutine frame for the whole life of the link: this handler awaits the socket itself, with
    no helper coroutine between, because every frame that waits is memory per connected device. An
    error (the database unreachable, say) ends this link only: asgi_websocket.serve answers it."""
    row = await device_row(s, bearer_of({"authorization": ws.header("Authorization") or ""}))
    if row is None:
        s.metrics.device_rejects += 1
        refused = device_unauthenticated()
        await ws.refuse(refused.status, general_body(refused))
        return
    device_id = row["id"]
    del row  # this frame lives as long as the connection: keep nothing in it we don't need
    await ws.accept()
    address = ws.remote_addr
    # the limits are read now, not at import: tests lower them (frames.MAX_FRAME_BYTES, HELLO_TIMEOUT)
    side = HubSide(trio.current_time(), hello_timeout=HELLO_TIMEOUT, max_frame_bytes=frames.MAX_FRAME_BYTES)
    [first] = await _feed(ws, side)
    if isinstance(first, ProtocolViolation):
        await _refuse(s, ws, device_id, first)
        return
    hello: p.Hello | None = first.hello  # type: ignore[attr-defined]
    del first
    conn_id = uuid.uuid4().hex
    session = _Session(ws, side)
    actor = await s.device_actor(device_id)
    if s.links.get(device_id) is not None:
        # A takeover. Now and then it is a device back before its old socket was noticed dead; in a
        # loop it is two holders of one token: each takeover soon after others waits, growing.
        delay = s.link_health.takeover(device_id, s.clock.now(), address)
        if delay:
            log.warning("device %s: another takeover of its link within a minute (from %s); accepting it in "
                        "%.0f s: two holders of one token?", device_id, address, delay)
            await ws.hold(delay)  # a device that gives up meanwhile takes nothing over
    await s.topology.link_up(device_id)  # a cluster node claims the link epoch: the others let theirs go
    with trio.CancelScope() as scope:
        link = Link(device_id, conn_id, scope)
        previous = s.links.get(device_id)
        s.links[device_id] = link
        if previous is not None:
            # the newest connection of a device wins
            previous.close(Close.SUPERSEDED, "another connection with this device's token took over")
        subscription = s.bus.subscribe(p.subject(str(device_id), ">"), session.on_command)
        s.metrics.device_connects += 1
        try:
            await session.send(side.welcome(deviceId=str(device_id), heartbeatInterval=s.settings.heartbeat_interval,
                                            hubKeys=s.tunnels.grants.hub_keys, maxFrameBytes=MAX_FRAME_BYTES))
            facts = hello.model_dump(exclude={"type", "secretFileDigests", "retiredPages", "lastMemoryTest"})
            for name in KEPT_UNLESS_SENT:
                if name not in hello.model_fields_set:
                    del facts[name]
            _bound_facts(s, device_id, facts)
            # The actor again, with no checkpoint before LinkUp reaches it: an offline actor at the end of
            # its idle time can stop during the awaits above (claiming the epoch, the welcome), and the
            # link would then talk to a stopped actor for its whole life. The same one when it runs.
            actor = await s.device_actor(device_id)
            await _deliver(s, actor, device_id, LinkUp(conn_id, hello.bootReason, facts, hello.maintenance))
            await _deliver(s, actor, device_id, Hello(hello.secretFileDigests, hello.configVersionApplied,
                                                      {"lastMemoryTest": hello.lastMemoryTest,
                                                       "retiredPages": hello.retiredPages}))
            hello = facts = None  # held for the connection's lifetime otherwise: ~2 KiB a device, measured
            while True:
                if side.deadline() is None:
                    # the read in this frame (not _feed's): a coroutine frame that waits is memory
                    # per connected device. After the hello HubSide has no deadline to wait out.
                    message = await ws.receive()
                    events = side.receive(message, trio.current_time())
                else:
                    events = await _feed(ws, side)
                for event in events:
                    if isinstance(event, ProtocolViolation):
                        await _refuse(s, ws, device_id, event)
                        return
                    if isinstance(event, ReplyReceived):
                        session.reply_received(event.reply)
                    elif isinstance(event, HeartbeatReceived):
                        await _deliver(s, actor, device_id, Heartbeat(conn_id))
                    elif isinstance(event, EventReceived):
                        frame = event.event
                        if frame.kind == "tunnel.usage":
                            # hub/tunnels/sessions.py
                            await s.tunnels.on_usage(device_id, frame.payload, session.usage_slots())
                        await _deliver(s, actor, device_id, DeviceEvent(frame.kind, frame.payload))
                # Let go of the last frame before waiting for the next: this frame lives as long as the
                # link, and a heartbeat held here until the next one is 2.4 KiB a device (memory_profile.py)
                message = events = event = frame = None
        finally:
            subscription.close()
            if s.links.get(device_id) is link:
                del s.links[device_id]
            session.fail_pending()
            # Also when this link was cancelled (a newer connection won): shielded, and bounded.
            with trio.move_on_after(LINK_DOWN_WITHIN) as link_down:
                link_down.shield = True
                await _deliver(s, actor, device_id, LinkDown(conn_id))
            if link_down.cancelled_caught:
                log.warning("device %s: its actor took no LinkDown within %ss", device_id, LINK_DOWN_WITHIN)
    if scope.cancelled_caught:
        # ended by the hub (superseded, heartbeat timeout, revoked, drained): say which, so the device
        # knows what to do next (docs/device-protocol.md, close codes)
        closing_frame = side.close(link.close_code, link.close_reason)
        with trio.move_on_after(2) as closing:
            closing.shield = True
            await ws.close(closing_frame.code, closing_frame.reason)


async def _deliver(s, actor, device_id: uuid.UUID, msg: object) -> None:
    """Hand ``msg`` to the device's actor. A full mailbox makes the link wait for room, so it stops
    reading this device's socket (back-pressure on the device that floods, nobody else) instead of
    dropping what it said. Only a heartbeat is dropped when the mailbox is full: the next one replaces it."""
    try:
        actor.tell(msg)
        return
    except MailboxFull:
        if isinstance(msg, Heartbeat):
            return
        s.metrics.device_link_waits += 1
    except ActorError as exc:
        log.warning("device %s: could not deliver %s to its actor: %s", device_id, type(msg).__name__, exc)
        return
    try:
        await actor.post(msg)
    except ActorError as exc:
        log.warning("device %s: could not deliver %s to its actor: %s", device_id, type(msg).__name__, exc)
