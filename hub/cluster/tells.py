"""Tells for a device's actor that must reach the node holding the device's link.

A configuration assigned, a secret file saved or deleted, a registry login changed: whichever node handled it tells its own
DeviceActor, which acts when its device is online there and otherwise publishes the tell on
``cluster.tell.<device>`` (actors/device.py ``_to_home_node``). The node that holds the link hands
it to its own actor; the others ignore it. At most once: a tell lost while a device moves is made
good by the device's next hello, which syncs files and configuration anyway.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from actors.device import ApplyConfig, RemoveFiles, SendPullSettings, SyncFiles

log = logging.getLogger("fleethub.cluster")


def _message(payload: dict[str, Any]) -> object | None:
    kind = payload.get("kind")
    if kind == "ApplyConfig":
        return ApplyConfig()
    if kind == "SyncFiles":
        return SyncFiles()
    if kind == "SendPullSettings":
        return SendPullSettings()
    if kind == "RemoveFiles" and isinstance(payload.get("paths"), list):
        return RemoveFiles(tuple(str(p) for p in payload["paths"]))
    return None


def payload_of(msg: object) -> dict[str, Any]:
    """The bus form of a tell (the inverse of ``_message``)."""
    if isinstance(msg, RemoveFiles):
        return {"kind": "RemoveFiles", "paths": list(msg.paths)}
    return {"kind": type(msg).__name__}


def install(s: Any) -> None:
    async def on_tell(subject: str, payload: dict[str, Any]) -> None:
        try:
            device_id = uuid.UUID(subject.rsplit(".", 1)[1])
        except ValueError:
            return
        msg = _message(payload)
        if msg is None or device_id not in s.links:
            return  # not ours (or not a tell we know)
        actor = await s.device_actor(device_id)
        actor.tell(msg)

    s.extras["cluster_tells"] = s.bus.subscribe("cluster.tell.*", on_tell)
