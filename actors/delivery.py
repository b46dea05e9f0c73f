"""Getting configurations and secret files onto one device: the IO half of the DeviceActor's work.

It runs in the actor's background tasks (so the mailbox keeps moving while a device writes files or
verifies a workload), one job at a time per device (a lock), and always works from storage: after a
reconnect, a hub restart or a lost reply, doing it again converges to the same state.

Secret contents are decrypted here, right before they go on the device's WebSocket, and nowhere else.

Every storage call goes through ``_db``, which takes a slot of the hub-wide delivery limiter first: a
forced rollout starts a job on every device at once, and without the cap those jobs queued for every
connection of the pool and made ordinary API calls wait behind them (bench/delivery.py measured a
0.7 s API p50 during a 1,000-device forced rollout). The cap leaves connections free for requests.
``_db`` also waits out a storage outage (``Actor.until_stored``): every call it makes is a read or an
idempotent write, so trying it again is safe.
"""

from __future__ import annotations

import base64
import logging
import uuid
from typing import TYPE_CHECKING, Any

import trio

from actors.bus import BusError
from actors.errors import AskError
from actors.machines.delivery import reconcile
from device_client.protocol import subject

if TYPE_CHECKING:
    from actors.device import DeviceActor

log = logging.getLogger("fleethub.delivery")

UNKNOWN = object()
# A configuration apply restarts the workload and waits for its health check on the device.
APPLY_TIMEOUT = 120.0


class Delivery:
    def __init__(self, actor: "DeviceActor") -> None:
        self.actor = actor
        self.lock = trio.Lock()

    @property
    def s(self):
        return self.actor.services

    @property
    def device_id(self) -> uuid.UUID:
        return self.actor.device_id

    def file_payload(self, f: dict) -> dict[str, Any]:
        return {"fileId": str(f["id"]), "path": f["path"], "mode": f["mode"], "uid": f["uid"], "gid": f["gid"],
                "contentB64": base64.b64encode(self.s.secret_box.open(f["ciphertext"])).decode(),
                "sha256": f["sha256"], "source": "configuration" if f["config_id"] else "device",
                **({"configId": str(f["config_id"])} if f["config_id"] else {})}

    async def _db(self, fn, *args):
        # While PostgreSQL is down the job waits (without a slot) and goes on when it is back: a
        # result the device already sent must reach storage, or its rollout would wait forever.
        async def in_slot():
            async with self.s.delivery_slots:
                return await fn(*args)

        in_slot.__name__ = getattr(fn, "__name__", "storage call")
        return await self.actor.until_stored(in_slot)

    async def _request(self, verb: str, payload: dict, timeout: float | None = None) -> dict | None:
        try:
            return await self.s.bus.request(subject(str(self.device_id), verb), payload,
                                             timeout=timeout or self.s.settings.command_timeout)
        except (BusError, AskError) as exc:
            # Left pending: the next link, upload or reconcile tries again.
            log.info("device %s: %s not delivered: %s", self.device_id, verb, type(exc).__name__)
            return None

    # -- jobs -------------------------------------------------------------------------------------
    async def after_hello(self, digests: dict[str, str], applied_version: str | None) -> None:
        """A device (re)connected: bring its configuration, then its files, to what storage says."""
        async with self.lock:
            await self._apply_config(applied_version)
            await self._reconcile(digests)

    async def sync(self) -> None:
        """After an upload or delete: push pending device files, remove what the hub no longer has."""
        async with self.lock:
            files = await self._db(self.s.secrets.device_files_to_push, self.device_id)
            if files:
                reply = await self._request("files.put", {"files": [self.file_payload(f) for f in files]})
                if reply is not None:
                    await self._db(self.s.secrets.record, self.device_id, reply.get("results", []), self.s.clock.now())

    async def remove(self, paths: list[str]) -> None:
        async with self.lock:
            if paths:
                await self._request("files.delete", {"paths": paths})

    async def apply_config(self) -> None:
        async with self.lock:
            await self._apply_config(UNKNOWN)

    async def wipe(self) -> dict | None:
        async with self.lock:
            return await self._request("files.wipe", {})

    # -- steps ------------------------------------------------------------------------------------
    async def _reconcile(self, digests: dict[str, str]) -> None:
        s = self.s
        device = await self._db(s.devices.get_any, self.device_id)
        expected = await self._db(s.secrets.expected_on_device, self.device_id)
        runs_assigned = (device is not None and device["config_version_id"] is not None
                         and device["config_version_id"] == device["applied_version_id"])
        plan = reconcile(expected, digests, push_config_files=runs_assigned)
        now = s.clock.now()
        if plan.confirm:
            by_id = {str(f["id"]): f for f in expected}
            await self._db(s.secrets.record, self.device_id, [{"fileId": i, "status": "on_device",
                                                     "sha256": by_id[i]["sha256"]} for i in plan.confirm], now)
        if plan.push:
            wanted = set(plan.push)
            files = [f for f in await self._db(s.secrets.device_files_to_push, self.device_id) if str(f["id"]) in wanted]
            if runs_assigned:
                files += [f for f in await self._db(s.secrets.config_files_for, self.device_id, device["config_id"])
                          if str(f["id"]) in wanted]
            if files:
                reply = await self._request("files.put", {"files": [self.file_payload(f) for f in files]})
                if reply is not None:
                    await self._db(s.secrets.record, self.device_id, reply.get("results", []), s.clock.now())
        if plan.remove:
            await self._request("files.delete", {"paths": plan.remove})

    async def _apply_config(self, reported: str | None | object) -> None:
        """Send the assigned configuration version unless the device already runs it. ``reported``
        is the version the device's hello named (None: nothing), or UNKNOWN outside a hello."""
        s = self.s
        device = await self._db(s.devices.get_any, self.device_id)
        if device is None or device["config_version_id"] is None:
            return
        target = device["config_version_id"]
        runs = (str(target) == reported) if reported is not UNKNOWN else (
            device["applied_version_id"] == target and device["config_status"] == "applied")
        if runs:
            if device["applied_version_id"] != target or device["config_status"] != "applied":
                await self._db(s.devices.set_config_result, self.device_id, "applied", None, target, s.clock.now())
            return
        version = await self._db(s.configs.version, device["org_id"], target)
        if version is None:
            return
        files = await self._db(s.secrets.config_files_for, self.device_id, device["config_id"])
        payload = {"configId": str(device["config_id"]), "versionId": str(target), "version": version["version"],
                   "spec": version["spec"], "files": [self.file_payload(f) for f in files]}
        # "applying": the version is on its way and the device will verify it (rollouts show it).
        await self._db(s.devices.set_config_result, self.device_id, "applying", None, device["applied_version_id"], s.clock.now())
        reply = await self._request("config.apply", payload, timeout=APPLY_TIMEOUT)
        if reply is not None:
            await self.record_config_result(reply)

    async def record_config_result(self, result: dict) -> None:
        s = self.s
        now = s.clock.now()
        try:
            version_id = uuid.UUID(str(result.get("versionId")))
            config_id = uuid.UUID(str(result.get("configId")))
        except ValueError:
            log.warning("device %s sent a config result without valid ids", self.device_id)
            return
        device = await self._db(s.devices.get_any, self.device_id)
        if device is None or device["config_version_id"] != version_id:
            return  # a result for a version no longer assigned
        if result.get("status") == "applied":
            await self._db(s.devices.set_config_result, self.device_id, "applied", None, version_id, now)
            await self._db(s.secrets.record, self.device_id, result.get("files", []), now)
        else:
            error = str(result.get("error") or "the device rejected the configuration")[:500]
            rolled_back = result.get("rolledBackTo")
            await self._db(s.devices.set_config_result, self.device_id, "rejected", error,
                                              uuid.UUID(rolled_back) if rolled_back else None, now)
            await self._db(s.secrets.mark_config_files, self.device_id, config_id, "failed",
                                              f"configuration rejected by the device: {error}", now)
