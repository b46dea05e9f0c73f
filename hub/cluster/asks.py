"""Asks that only the device's own actor can answer, sent to the node holding the device's link.

A reboot changes the device's connection state machine (REBOOTING until it is back), which lives in
the DeviceActor of the node that holds the link. A node asked for it by REST that does not hold the
link reads which node does (``devices.link_node``, claimed at link time: hub/cluster/presence.py) and
sends the ask to that node's own subject, ``cluster.node.<node>.ask``; the holder asks its actor and
answers. Errors cross as the actor's own (DeviceOffline, Conflict ...: actors/natsbus.py).
"""

from __future__ import annotations

import uuid
from typing import Any

from actors.device import Reboot
from actors.bus import NoResponders, RequestTimeout
from actors.errors import DeviceOffline, DeviceTimeout

ASKS = {"Reboot": Reboot}


def install(s: Any) -> None:
    async def on_ask(subject: str, payload: dict[str, Any]) -> dict[str, Any]:
        cls = ASKS.get(str(payload.get("ask")))
        try:
            device_id = uuid.UUID(str(payload.get("device")))
        except ValueError:
            cls = None
        if cls is None:
            raise DeviceOffline("not an ask this node forwards")
        if device_id not in s.links:
            raise DeviceOffline("the device is not connected")  # it left this node meanwhile
        actor = await s.device_actor(device_id)
        reply = await actor.ask(cls(), timeout=float(payload.get("timeout", s.settings.command_timeout + 5)))
        return {"reply": reply}

    s.extras["cluster_asks"] = s.bus.subscribe(f"cluster.node.{s.node_id}.ask", on_ask)


async def ask_device(s: Any, device_id: uuid.UUID, msg: Any, timeout: float) -> Any:
    """Ask the device's actor: here, or on the node holding its link (cluster)."""
    name = type(msg).__name__
    if getattr(s, "clustered", False) and device_id not in s.links and name in ASKS:
        node = await s.devices.link_node(device_id)
        if node and node != s.node_id:
            try:
                answer = await s.bus.request(f"cluster.node.{node}.ask",
                                             {"ask": name, "device": str(device_id), "timeout": timeout},
                                             timeout=timeout)
            except NoResponders:
                raise DeviceOffline("the device's hub node is not reachable") from None
            except RequestTimeout:
                raise DeviceTimeout("the device did not answer in time") from None
            return answer.get("reply")
    actor = await s.device_actor(device_id)
    return await actor.ask(msg, timeout=timeout)
