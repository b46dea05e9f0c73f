"""Asks that only the device's own actor can answer, sent to the node holding the device's link.

A reboot changes the device's connection state machine (REBOOTING until it is back), and a memory
test's start, cancel and live status go through the memory-test machine (rate limit, one run at a
time, the run stored before it is answered); both live in the DeviceActor of the node that holds the
link. A node asked by REST that does not hold the link reads which node does (``devices.link_node``,
claimed at link time: hub/cluster/presence.py) and sends the ask, its fields as JSON, to that node's
own subject, ``cluster.node.<node>.ask``; the holder asks its actor and answers. Errors cross as the
actor's own (DeviceOffline, Conflict ...: actors/natsbus.py).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any

from actors.bus import NoResponders, RequestTimeout, Subscription, Unavailable
from actors.device import Reboot
from actors.device_memtests import CancelTest, ReadStatus, StartTest
from actors.errors import BusUnavailable, Conflict, DeviceOffline, DeviceTimeout

if TYPE_CHECKING:
    from hub.cluster.topology import ClusterNode
    from hub.services import Services

# Only these cross: each a frozen dataclass of JSON fields, rebuilt on the holder from its name.
ASKS: dict[str, type] = {cls.__name__: cls for cls in (Reboot, StartTest, CancelTest, ReadStatus)}


def subscribe(c: ClusterNode) -> Subscription:
    s = c.s

    async def on_ask(subject: str, payload: dict[str, Any]) -> dict[str, Any]:
        cls = ASKS.get(str(payload.get("ask")))
        try:
            device_id = uuid.UUID(str(payload.get("device")))
        except ValueError:
            cls = None
        fields = payload.get("fields") or {}
        try:
            msg = cls(**fields) if cls is not None and isinstance(fields, dict) else None
        except TypeError:
            msg = None
        if msg is None:
            raise DeviceOffline("not an ask this node forwards")
        if device_id not in s.links:
            raise DeviceOffline("the device is not connected")  # it left this node meanwhile
        actor = await s.device_actor(device_id)
        reply = await actor.ask(msg, timeout=float(payload.get("timeout", s.settings.command_timeout + 5)))
        return {"reply": reply}

    return c.bus.subscribe(f"cluster.node.{c.node_id}.ask", on_ask)


_LOOK_UP = object()


async def ask_device(s: Services, device_id: uuid.UUID, msg: Any, timeout: float, *, node: Any = _LOOK_UP) -> Any:
    """Ask the device's actor: here, or on the node holding its link (cluster). ``node``: the holder
    when the caller already looked it up (``Topology.holder``), so it is not read twice."""
    name = type(msg).__name__
    if name in ASKS:
        if node is _LOOK_UP:
            node = await s.topology.holder(device_id)
        if node is not None:
            try:
                answer = await s.bus.request(f"cluster.node.{node}.ask",
                                             {"ask": name, "device": str(device_id), "timeout": timeout,
                                              "fields": dataclasses.asdict(msg)},
                                             timeout=timeout)
            except NoResponders:
                raise DeviceOffline("the device's hub node is not reachable") from None
            except RequestTimeout:
                raise DeviceTimeout("the device did not answer in time") from None
            except Unavailable:
                raise BusUnavailable("the device's hub node cannot be reached now (the cluster's NATS is down or stalled)") from None
            return answer.get("reply")
    actor = await s.device_actor(device_id)
    return await actor.ask(msg, timeout=timeout)


# -- rollouts: pause, resume, cancel go to the node holding the rollout's lease ------------------------

def _control_event(payload: dict[str, Any]) -> object | None:
    from actors.machines import rollout as rm
    kind = payload.get("event")
    if kind == "Pause":
        return rm.Pause(str(payload.get("reason") or rm.Pause().reason))
    return {"Resume": rm.Resume, "Cancel": rm.Cancel}.get(str(kind), lambda: None)()


def subscribe_rollouts(c: ClusterNode) -> Subscription:
    s = c.s

    async def on_control(subject: str, payload: dict[str, Any]) -> dict[str, Any]:
        from actors.rollout import Control
        event = _control_event(payload)
        if event is None:
            raise Conflict("not a rollout control this node forwards", code="invalid_state")
        actor = await s.rollout_actor(uuid.UUID(str(payload.get("rollout"))))  # HeldElsewhere if it moved on
        await actor.ask(Control(event), timeout=10)
        return {}

    return c.bus.subscribe(f"cluster.node.{c.node_id}.rollout", on_control)


async def control_rollout(s: Services, rollout_id: uuid.UUID, event: object) -> None:
    """Pause/resume/cancel, by the rollout's actor here or on the node holding its lease (cluster)."""
    from actors.rollout import Control
    from hub.cluster.leases import HeldElsewhere
    try:
        actor = await s.rollout_actor(rollout_id)
    except HeldElsewhere:
        owner = await s.stores.rollout_leases.owner(rollout_id)
        if not owner or owner == s.node_id:
            raise
        payload = {"rollout": str(rollout_id), "event": type(event).__name__, "reason": getattr(event, "reason", None)}
        try:
            await s.bus.request(f"cluster.node.{owner}.rollout", payload, timeout=10)
        except (NoResponders, RequestTimeout, Unavailable):
            raise HeldElsewhere(f"rollout {rollout_id} is run by node {owner}, which did not answer; "
                                "try again once its lease has moved") from None
        return
    await actor.ask(Control(event), timeout=10)
