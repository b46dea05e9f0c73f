"""Getting configurations and secret files onto one device: a part of the DeviceActor (its IO work), not
an actor of its own (no mailbox, no task of its own).

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
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from actors.bus import BusError, NoResponders, RequestTimeout, Unavailable
from actors.errors import AskError, DeviceOffline, DeviceRefused
from actors.machines.delivery import reconcile
from device_client.shared import imageref, verbs
from device_client.shared.protocol import runs_containers, subject

if TYPE_CHECKING:
    from actors.device import DeviceActor
    from actors.services import Services

log = logging.getLogger("fleethub.delivery")

UNKNOWN = object()
# A configuration apply restarts the workload and waits for its health check on the device. Past it
# the apply has failed (docs/device-protocol.md: every command that moves a state ends in a terminal one).
APPLY_TIMEOUT = 120.0
NOTICE_TIMEOUT = 2.0


NO_ENGINE = ("the version runs containers and this device has no container engine "
             "(its agent was not started with --containers podman, or podman did not answer at its start)")


class NotDone(Exception):
    """A command that moves a state did not produce a usable result; ``reason`` says why, for the
    delivery's or the configuration's error. ``offline``: the device was not linked when it was sent
    (nothing was in flight: what was pending stays pending until it connects)."""

    def __init__(self, reason: str, *, offline: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.offline = reason, offline


class DeviceDelivery:
    def __init__(self, actor: "DeviceActor") -> None:
        self.actor = actor
        self._lock: trio.Lock | None = None  # made on first use (see ``lock``)

    @property
    def lock(self) -> trio.Lock:
        """Serialises delivery work; made on first use, as most online devices never need it (about
        340 bytes a device otherwise, at 15,000 devices per process)."""
        if self._lock is None:
            self._lock = trio.Lock()
        return self._lock

    @property
    def s(self) -> Services:
        return self.actor.services

    @property
    def device_id(self) -> uuid.UUID:
        return self.actor.device_id

    def file_payload(self, f: dict) -> dict[str, Any]:
        return {"fileId": str(f["id"]), "path": f["path"], "mode": f["mode"], "uid": f["uid"], "gid": f["gid"],
                "contentB64": base64.b64encode(self.s.stores.secret_box.open(f["ciphertext"])).decode(),
                "sha256": f["sha256"], "source": "configuration" if f["config_id"] else "device",
                **({"configId": str(f["config_id"])} if f["config_id"] else {})}

    async def _db(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        # While PostgreSQL is down the job waits (without a slot) and goes on when it is back: a
        # result the device already sent must reach storage, or its rollout would wait forever.
        async def in_slot() -> Any:
            async with self.s.delivery_slots:
                return await fn(*args)

        in_slot.__name__ = getattr(fn, "__name__", "storage call")
        return await self.actor.until_stored(in_slot)

    async def _config_status(self, assigned: uuid.UUID, status: str, error: str | None,
                             applied_version_id: uuid.UUID | None, *, check_output: str | None = None,
                             workload_log: str | None = None) -> bool:
        """The device's configuration status, written only while ``assigned`` is still its version
        (``Devices.set_config_result``): each caller decided on a row read earlier, and the reply to
        config.apply, the config.result event and a cancel's release may each come in between."""
        return await self._db(partial(self.s.stores.devices.set_config_result, assigned=assigned,
                                      check_output=check_output, workload_log=workload_log),
                              self.device_id, status, error, applied_version_id, self.s.clock.now())

    async def _request(self, verb: str, payload: dict, timeout: float | None = None) -> dict | None:
        try:
            return await self.s.bus.request(subject(str(self.device_id), verb), payload,
                                             timeout=timeout or self.s.settings.command_timeout)
        except (BusError, AskError) as exc:
            # Left pending: the next link, upload or reconcile tries again.
            log.info("device %s: %s not delivered: %s", self.device_id, verb, type(exc).__name__)
            return None

    async def _strict(self, verb: str, payload: dict, timeout: float | None = None) -> Any:
        """Send a command whose result moves a state and return the result as its model
        (device_client/shared/verbs.py). NotDone says why there is none: no link, no answer in time, the link
        dropped, the device refused (its error), or a malformed result (a protocol error, recorded for
        the device's diagnosis and told to the device)."""
        timeout = timeout or self.s.settings.command_timeout
        try:
            reply = await self.s.bus.request(subject(str(self.device_id), verb), payload, timeout=timeout)
        except NoResponders:
            raise NotDone("the device is not connected", offline=True) from None
        except Unavailable:
            # the hub's bus, not the device: left pending as for an offline device, not failed
            raise NotDone("the device's hub node cannot be reached now", offline=True) from None
        except RequestTimeout:
            raise NotDone(f"the device did not answer {verb} within {timeout:.0f} s") from None
        except DeviceRefused as exc:
            raise NotDone(f"the device refused {verb}: {exc.code}: {exc.message}"[:500]) from None
        except DeviceOffline:
            raise NotDone(f"the device disconnected before answering {verb}") from None
        except (BusError, AskError) as exc:
            raise NotDone(f"{verb} was not delivered: {type(exc).__name__}") from None
        try:
            return verbs.check_reply(verb, reply)
        except verbs.Malformed as exc:
            await self.protocol_error(str(exc))
            raise NotDone(f"the device's result was malformed ({exc})"[:500]) from None

    async def record_file_results(self, payload: dict) -> None:
        """Event ``files.result``: work the device did on its own (drift found at boot). A malformed one
        is a protocol error and changes nothing."""
        try:
            checked = verbs.check_event("files.result", payload)
            assert isinstance(checked, verbs.FileResults)  # the model verbs.EVENTS names for it
        except verbs.Malformed as exc:
            await self.protocol_error(str(exc))
            return
        await self._db(self.s.stores.secrets.record, self.device_id,
                       _ours([r.model_dump() for r in checked.results]), self.s.clock.now())

    async def protocol_error(self, what: str) -> None:
        """The device sent a result the hub cannot use: count it for the diagnosis and tell the device
        (``link.notice``; a device without that verb answers unknown_command, which is fine)."""
        log.warning("device %s: protocol error: %s", self.device_id, what)
        self.s.link_health.protocol_error(self.device_id, what, self.s.clock.now())
        await self._request("link.notice", {"code": "malformed_result", "message": what[:500]}, timeout=NOTICE_TIMEOUT)

    async def _delete(self, paths: list[str]) -> None:
        """``files.delete``: nothing in storage waits on it (the hub forgot those files already), but a
        malformed result is a protocol error like any other; anything else is tried again at the next
        hello (the device's digests still list what it kept)."""
        try:
            await self._strict("files.delete", {"paths": paths})
        except NotDone as exc:
            log.info("device %s: files.delete not done: %s", self.device_id, exc.reason)

    async def _put_files(self, files: list[dict]) -> None:
        """``files.put`` and its results recorded: each file on_device or failed with the device's error;
        a refused, unanswered or malformed put fails every file it carried with the reason (the next link
        or upload sends them again). Sent to a device that is not linked: they stay pending."""
        s = self.s
        sent = [self.file_payload(f) for f in files]
        try:
            put = await self._strict("files.put", {"files": sent})
        except NotDone as exc:
            if exc.offline:
                return
            await self._db(s.stores.secrets.record, self.device_id, [{"fileId": p["fileId"], "status": "failed",
                                                               "error": exc.reason} for p in sent], s.clock.now())
            return
        await self._db(s.stores.secrets.record, self.device_id, file_results(sent, put.results), s.clock.now())

    # -- jobs -------------------------------------------------------------------------------------
    async def after_hello(self, digests: dict[str, str], applied_version: str | None) -> None:
        """A device (re)connected: bring its configuration, then its files, to what storage says."""
        async with self.lock:
            await self._apply_config(applied_version)
            await self._reconcile(digests)

    async def sync(self) -> None:
        """After an upload or delete: push pending device files, remove what the hub no longer has."""
        async with self.lock:
            files = await self._db(self.s.stores.secrets.device_files_to_push, self.device_id)
            if files:
                await self._put_files(files)

    async def remove(self, paths: list[str]) -> None:
        async with self.lock:
            if paths:
                await self._delete(paths)

    async def apply_config(self) -> None:
        async with self.lock:
            await self._apply_config(UNKNOWN)

    async def send_pull_settings(self) -> None:
        """A registry login of the organisation, or the fleet's registry proxy, changed: the device gets
        its version's logins and its fleet's proxy mode now."""
        async with self.lock:
            device = await self._db(self.s.stores.devices.current, self.device_id)
            if device is not None:
                await self._send_pull_settings(device)

    async def wipe(self) -> dict | None:
        async with self.lock:
            return await self._request("files.wipe", {})

    # -- steps ------------------------------------------------------------------------------------
    async def _reconcile(self, digests: dict[str, str]) -> None:
        s = self.s
        # Right after _apply_config under the same lock: the row it read from PostgreSQL is what the cache
        # holds, unless a write evicted it since (then this reads it again), so a hello usually costs
        # one crossing for the row, not two.
        device = await self._db(s.stores.devices.get_any, self.device_id)
        expected = await self._db(s.stores.secrets.expected_on_device, self.device_id)
        runs_assigned = (device is not None and device["config_version_id"] is not None
                         and device["config_version_id"] == device["applied_version_id"])
        # The files of the configuration the device runs stay even when another is assigned: until
        # that one is applied, the device runs (or rolls back to) this one, and needs them. (A device
        # that runs what it is assigned, nearly every hello, has them all in ``expected`` already.)
        keep = (await self._db(s.stores.secrets.paths_of_version, device["applied_version_id"])
                if device is not None and device["applied_version_id"] is not None and not runs_assigned else [])
        plan = reconcile(expected, digests, push_config_files=runs_assigned, keep=keep)
        now = s.clock.now()
        if plan.confirm:
            by_id = {str(f["id"]): f for f in expected}
            await self._db(s.stores.secrets.record, self.device_id, [{"fileId": i, "status": "on_device",
                                                     "sha256": by_id[i]["sha256"]} for i in plan.confirm], now)
        if plan.push:
            wanted = set(plan.push)
            files = [f for f in await self._db(s.stores.secrets.device_files_to_push, self.device_id) if str(f["id"]) in wanted]
            if runs_assigned:
                files += [f for f in await self._db(s.stores.secrets.config_files_for, self.device_id, device["config_id"])
                          if str(f["id"]) in wanted]
            if files:
                await self._put_files(files)
        if plan.remove:
            await self._delete(plan.remove)

    async def _apply_config(self, reported: str | None | object) -> None:
        """Send the assigned configuration version unless the device already runs it. ``reported``
        is the version the device's hello named (None: nothing), or UNKNOWN outside a hello."""
        s = self.s
        device = await self._db(s.stores.devices.current, self.device_id)
        if device is None or device["config_version_id"] is None:
            return
        target = device["config_version_id"]
        runs = (str(target) == reported) if reported is not UNKNOWN else (
            device["applied_version_id"] == target and device["config_status"] == "applied")
        if runs:
            if device["applied_version_id"] != target or device["config_status"] != "applied":
                await self._config_status(target, "applied", None, target)
            await self._send_waiting_config_files(device)
            if device.get("pull_settings_stale"):
                await self._send_pull_settings(device)
            return
        if device["config_status"] == "rejected":
            # The device verified this version, found it unhealthy and rolled back: sending it again
            # (at each link, upload or hub restart) would restart its workload into the same failure.
            # It goes again only when assigned again (a rollout or an assignment makes it pending).
            # The version it rolled back to still gets the organisation's current logins.
            if device.get("pull_settings_stale"):
                await self._send_pull_settings(device)
            return
        version = await self._db(s.stores.configs.version, device["org_id"], target)
        if version is None:
            return
        if version["spec"].get("containers") and not runs_containers(self.actor.facts):
            # The device would refuse it too; saying so here names the cause before anything is sent,
            # and the rejection holds until the version is assigned again (as a device's own would).
            await self._config_status(target, "rejected", NO_ENGINE, device["applied_version_id"])
            return
        files = await self._db(s.stores.secrets.config_files_for, self.device_id, device["config_id"])
        payload = {"configId": str(device["config_id"]), "versionId": str(target), "version": version["version"],
                   "spec": version["spec"], "files": [self.file_payload(f) for f in files]}
        if device.get("pull_settings_stale"):
            # cleared before the logins are read: a change committed after this read marks it again
            await self._db(s.stores.devices.set_pull_settings_stale, self.device_id, False)
        auth = await self.registry_auth(device["org_id"], version["spec"])
        if auth:
            payload["registryAuth"] = auth
        if version["spec"].get("containers"):
            # the fleet's, as it is when the version goes: the device pulls this version's images by it
            payload["registryProxy"] = await self._db(s.stores.fleets.registry_proxy_mode, device["fleet_id"])
        # "applying": the version is on its way and the device will verify it (rollouts show it). Only
        # if it is still the one assigned: a cancelled rollout gives back what the device runs to
        # devices not applying, so whichever of the two comes first stands, and nothing is sent after
        # the version was taken back.
        if not await self._config_status(target, "applying", None, device["applied_version_id"]):
            return
        try:
            result = await self._strict("config.apply", payload, timeout=APPLY_TIMEOUT)
        except NotDone as exc:
            if exc.offline:
                # Never reached the device (not linked, or the bus is down): no verdict on the version.
                # Pending again: its next hello, or the rollout's re-send, sends it (issue 38).
                await self._config_status(target, "pending", None, device["applied_version_id"])
                return
            # "applying" must end: failed with the reason (the diagnosis shows it); the version is sent
            # again at the device's next link. A result the device sends later (config.result) still counts.
            if await self._config_status(target, "failed", exc.reason, device["applied_version_id"]):
                await self._db(s.stores.secrets.mark_config_files, self.device_id, device["config_id"], "failed",
                               f"configuration not applied: {exc.reason}", s.clock.now())
            return
        await self.record_config_result(result.model_dump())

    async def _send_waiting_config_files(self, device: dict) -> None:
        """The configuration's files added or replaced since the device got the version it runs: a
        config.apply of that same version carrying only them (the device restarts nothing and writes
        the files; device_client/configs.py). Without it they would wait for the next version."""
        s = self.s
        files = await self._db(s.stores.secrets.config_files_waiting, self.device_id, device["config_id"])
        if not files:
            return
        version = await self._db(s.stores.configs.version, device["org_id"], device["config_version_id"])
        if version is None:
            return
        payload = {"configId": str(device["config_id"]), "versionId": str(version["id"]),
                   "version": version["version"], "spec": version["spec"],
                   "files": [self.file_payload(f) for f in files]}
        try:
            result = await self._strict("config.apply", payload, timeout=APPLY_TIMEOUT)
        except NotDone as exc:
            if not exc.offline:  # failed with the reason; the next hello or upload sends them again
                await self._db(s.stores.secrets.mark_config_files, self.device_id, device["config_id"], "failed",
                               f"configuration files not applied: {exc.reason}", s.clock.now())
            return
        await self.record_config_result(result.model_dump())

    async def _send_pull_settings(self, device: dict) -> None:
        """What the device's next pulls of the version it runs need, as a config.apply of that version
        with no files: the logins of its registries (the device restarts nothing and replaces its auth
        file with these: a login deleted on the hub leaves it) and the fleet's registry proxy mode (for
        the pulls of a restart). Not delivered: still stale, so the next hello sends them."""
        s = self.s
        version = (await self._db(s.stores.configs.version, device["org_id"], device["applied_version_id"])
                   if device["applied_version_id"] is not None else None)
        await self._db(s.stores.devices.set_pull_settings_stale, self.device_id, False)
        if version is None or not version["spec"].get("containers"):
            return
        payload = {"configId": str(version["config_id"]), "versionId": str(version["id"]),
                   "version": version["version"], "spec": version["spec"], "files": [],
                   "registryAuth": await self.registry_auth(device["org_id"], version["spec"]),
                   "registryProxy": await self._db(s.stores.fleets.registry_proxy_mode, device["fleet_id"])}
        try:
            result = await self._strict("config.apply", payload, timeout=APPLY_TIMEOUT)
        except NotDone as exc:
            log.info("device %s: registry logins and proxy mode not delivered: %s", self.device_id, exc.reason)
            await self._db(s.stores.devices.set_pull_settings_stale, self.device_id, True)
            return
        await self.record_config_result(result.model_dump())

    async def registry_auth(self, org_id: uuid.UUID, spec: dict) -> dict[str, dict[str, str]]:
        """The organisation's credentials for the registries of the version's images, those only,
        opened for the frame (as secret files are): {registry: {username, password}}."""
        registries = registries_of(spec)
        sealed = await self._db(self.s.stores.registry_credentials.sealed_for, org_id, registries) if registries else {}
        return {registry: {"username": user, "password": self.s.stores.secret_box.open(ciphertext).decode()}
                for registry, (user, ciphertext) in sealed.items()}

    async def record_config_result(self, result: dict) -> None:
        """A ConfigApplyResult (the reply to config.apply, or event config.result). A malformed one is a
        protocol error; if it can name the version the device was applying, that apply has failed."""
        s = self.s
        now = s.clock.now()
        try:
            checked = verbs.check_event("config.result", result)
            assert isinstance(checked, verbs.ConfigApplyResult)  # the model verbs.EVENTS names for it
            version_id = uuid.UUID(checked.versionId)
            config_id = uuid.UUID(checked.configId)
        except (verbs.Malformed, ValueError) as exc:
            what = str(exc) if isinstance(exc, verbs.Malformed) else "event config.result: versionId or configId is not an id"
            await self.protocol_error(what)
            device = await self._db(s.stores.devices.current, self.device_id)
            if device is not None and device["config_status"] == "applying":
                await self._config_status(device["config_version_id"], "failed",
                                          f"the device's result was malformed ({what})"[:500], device["applied_version_id"])
            return
        result = checked.model_dump()
        device = await self._db(s.stores.devices.current, self.device_id)
        if device is None or device["config_version_id"] != version_id:
            return  # a result for a version no longer assigned
        # The row read above decides nothing by itself: the reply and the config.result event of one
        # apply are recorded in separate tasks, and a cancelled rollout may give the device back what
        # it runs between a read and a write. So each write names the version it is for.
        if result.get("status") == "applied":
            if await self._config_status(version_id, "applied", None, version_id):
                await self._db(s.stores.secrets.record, self.device_id, _ours(result.get("files", [])), now)
        else:
            error = str(result.get("error") or "the device rejected the configuration")[:500]
            # the device's words, bounded by the wire schema (checked above) and storable (protocol.decode)
            if await self._config_status(version_id, "rejected", error, _uuid(result.get("rolledBackTo")),
                                         check_output=result.get("checkOutput") or None,
                                         workload_log=result.get("workloadLog") or None):
                await self._db(s.stores.secrets.mark_config_files, self.device_id, config_id, "failed",
                               f"configuration rejected by the device: {error}", now)


def file_results(sent: list[dict], results: list[Any]) -> list[dict]:
    """The storable result of each file sent, matched by file id (else path): the device's status and
    error, or failed when the device said nothing about a file. Ids are the hub's own, never the device's."""
    by_id = {r.fileId: r for r in results if r.fileId}
    by_path = {r.path: r for r in results}
    out = []
    for p in sent:
        r = by_id.get(p["fileId"]) or by_path.get(p["path"])
        if r is None:
            out.append({"fileId": p["fileId"], "status": "failed", "error": "the device's result did not mention this file"})
        elif r.status == "on_device":
            out.append({"fileId": p["fileId"], "status": "on_device", "sha256": r.sha256})
        elif r.status == "failed":
            out.append({"fileId": p["fileId"], "status": "failed", "error": (r.error or "failed on the device")[:500]})
    return out


def registries_of(spec: dict) -> set[str]:
    """The registries a version's images come from."""
    return {registry for c in spec.get("containers") or [] if isinstance(c, dict)
            if (registry := _registry_of(c.get("image"))) is not None}


def _registry_of(image: Any) -> str | None:
    try:
        return imageref.parse(image).registry
    except imageref.BadReference:
        return None  # a stored version was checked when it was made; the device refuses it again


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


def _ours(results: list[dict]) -> list[dict]:
    """File results whose fileId is an id the hub could have given (storage takes nothing else)."""
    return [r for r in results if _uuid(r.get("fileId")) is not None]
