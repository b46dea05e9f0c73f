"""Configuration versions on the device: apply, verify the workload's health, or roll back.

``config.apply`` (payload and result in protocol.py):

1. the version goes to ``<data_dir>/configs/<versionId>.json`` ({configId, versionId, version,
   spec}; never the files, whose contents are secrets) and becomes ``config-current.json`` marked
   ``verifying``, with the previous record kept inside it;
2. the workload restarts with the new spec and must become healthy within the health check's
   ``graceSeconds + timeoutSeconds`` (default 1 + 10 s);
3. healthy: the record is marked ``applied``, the configuration's files are written, files of any
   other configuration are removed (a file belongs to the configuration the device runs), and the
   result is ``applied``;
4. not healthy: the previous record and workload are restored, none of the new files are written, and
   the result is ``rejected`` with the error (ending with the health check's last output line),
   ``rolledBackTo`` (the previous versionId, or null), and, when there is any, ``checkOutput`` (the
   end of what the failing health check printed) and ``workloadLog`` (the workload log's last
   lines), both bounded by logtail.py.

The result is both the reply and a ``config.result`` event. Applying the version that is already
applied restarts nothing; it only writes the payload's files (the hub sends files added since). A
power loss during verification is caught at the next boot: the ``verifying`` record is rolled back
and a ``config.result`` event says so once the link is up. While the workload is held (memory
tests) no version can be verified, so the command fails with ``busy`` and the hub tries again later.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import trio

from . import logtail
from .background import BootLoop
from .commands import CommandError
from .containers import ContainerSet, parse_containers
from .files import SecretFileStore
from .pullroute import MODES as PROXY_MODES
from .shared import imageref
from .state import write_json_atomic
from .workload import Workload
from .workload_spec import Health, WorkloadSpec, parse_spec

if TYPE_CHECKING:
    from .context import DeviceContext

log = logging.getLogger("fleethub.agent.configs")

CURRENT_NAME = "config-current.json"
VERSIONS_DIR = "configs"
KEEP_VERSIONS = 8  # version files kept for a human looking at a device; the current one always is
REGISTRY_AUTH_NAME = "registry-auth.json"
MAX_REGISTRY_LOGINS = 16  # a version has at most 16 containers, so at most 16 registries
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # becomes a file name


@dataclass(frozen=True)
class ApplyRequest:
    config_id: str
    version_id: str
    version: int | None
    spec: dict[str, Any]
    files: list[Any]
    registry_auth: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)  # registry -> login
    # registryAuth was in the frame: on the version already applied it replaces the auth file (the hub
    # sends the organisation's current logins after one changed); absent, a file-only re-send keeps it
    registry_auth_given: bool = False
    registry_proxy: str | None = None  # the fleet's registry proxy mode (pullroute.py); None: the hub said nothing


def parse_registry_auth(value: Any) -> dict[str, tuple[str, str]]:
    """config.apply's ``registryAuth``: {registry: {username, password}}. Errors never quote a value."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_REGISTRY_LOGINS:
        raise CommandError("invalid_payload", f"registryAuth must be an object of at most {MAX_REGISTRY_LOGINS} "
                                              "registries")
    out = {}
    for registry, login in value.items():
        if not isinstance(registry, str) or imageref.parse_registry(registry) is None:
            raise CommandError("invalid_payload", "registryAuth: a key is not a registry host[:port]")
        user = login.get("username") if isinstance(login, dict) else None
        password = login.get("password") if isinstance(login, dict) else None
        if not (isinstance(user, str) and isinstance(password, str) and user and password
                and (user + password).isascii() and user.isprintable() and password.isprintable() and ":" not in user
                and len(user) <= 256 and len(password) <= 4096):
            raise CommandError("invalid_payload", f"registryAuth.{registry}: a username (no ':') and a password, "
                                                  "printable ASCII, are needed")
        out[registry] = (user, password)
    return out


def parse_apply(payload: dict[str, Any]) -> ApplyRequest:
    ids = {}
    for key in ("configId", "versionId"):
        value = payload.get(key)
        if not isinstance(value, str) or not _SAFE_ID.match(value):
            raise CommandError("invalid_payload", f"{key} must be an id (letters, digits, . _ -)")
        ids[key] = value
    version = payload.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise CommandError("invalid_payload", "version must be an integer")
    spec = payload.get("spec")
    if not isinstance(spec, dict):
        raise CommandError("invalid_payload", "spec must be an object")
    files = payload.get("files", [])
    if not isinstance(files, list):
        raise CommandError("invalid_payload", "files must be a list of secret files")
    return ApplyRequest(ids["configId"], ids["versionId"], version, spec, files,
                        parse_registry_auth(payload.get("registryAuth")), "registryAuth" in payload,
                        parse_registry_proxy(payload.get("registryProxy")))


def parse_registry_proxy(value: Any) -> str | None:
    if value is None or value in PROXY_MODES:
        return value
    raise CommandError("invalid_payload", f"registryProxy must be one of {', '.join(PROXY_MODES)}")


def write_registry_auth(path: Path, logins: dict[str, tuple[str, str]]) -> None:
    """The version's registry credentials at ``path`` (0600, containers-auth.json: the engine's
    --authfile), and no others: no logins, no file."""
    if not logins:
        path.unlink(missing_ok=True)
        return
    auths = {registry: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
             for registry, (user, password) in logins.items()}
    write_json_atomic(path, {"auths": auths}, mode=0o600)


class ConfigManager:
    def __init__(self, data_dir: Path, files: SecretFileStore, workload: Workload, *,
                 device_id: Callable[[], str | None] = lambda: None, containers: ContainerSet | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.files = files
        self.workload = workload
        self.containers = containers  # None: no container engine on this device
        self.auth_path = self.data_dir / REGISTRY_AUTH_NAME
        if containers is not None:
            containers.auth_file = self.auth_path
        self.device_id = device_id
        self.current_path = self.data_dir / CURRENT_NAME
        self.versions_dir = self.data_dir / VERSIONS_DIR
        self._current: dict[str, Any] | None = None
        self._loaded = False
        self._lock = trio.Lock()
        self._boot_report: dict[str, Any] | None = None
        self._device: DeviceContext | None = None

    @property
    def current(self) -> dict[str, Any] | None:
        """The record of config-current.json: {configId, versionId, version, spec, deviceId, state,
        previous}; None before the first configuration."""
        if not self._loaded:
            try:
                self._current = json.loads(self.current_path.read_bytes())
            except FileNotFoundError:
                self._current = None
            except ValueError:  # written atomically: outside damage. Run nothing rather than guess.
                self.current_path.replace(self.current_path.with_name(CURRENT_NAME + ".corrupt"))
                log.error("%s is unreadable; moved aside, running no configuration", self.current_path)
                self._current = None
            self._loaded = True
        return self._current

    def version_applied(self) -> str | None:
        """The version the device runs and has verified (a version under verification is not)."""
        record = self.current
        if record is not None and record.get("state") != "applied":
            record = record.get("previous")
        return record["versionId"] if record else None

    def config_file(self, version_id: str) -> Path:
        return self.versions_dir / f"{version_id}.json"

    async def apply(self, payload: dict[str, Any]) -> dict[str, Any]:
        request = parse_apply(payload)
        # Shielded: a link that drops mid-apply must not leave a half-verified version running.
        # The reply is then kept by command id and a resent command gets it. The work is bounded
        # by the health deadline.
        with trio.CancelScope(shield=True):
            async with self._lock:
                result = await self._apply(request)
        log.info("configuration %s version %s: %s%s", request.config_id, request.version_id,
                 result["status"], f" ({result['error']})" if result.get("error") else "")
        await self._send("config.result", result)
        return result

    async def boot(self) -> None:
        """At every boot: finish an interrupted apply by rolling back, then start the workload."""
        if not self._loaded and not self.current_path.exists():
            return  # never configured (most simulated devices): no worker thread needed
        record = await trio.to_thread.run_sync(lambda: self.current)
        if record is not None and record.get("state") != "applied":
            previous = record.get("previous")
            await trio.to_thread.run_sync(self._save_current, previous)
            self._boot_report = _result("rejected", record["configId"], record["versionId"], [],
                                        error="the device restarted before the version's health was verified",
                                        rolled_back_to=previous["versionId"] if previous else None)
            log.warning("configuration version %s was interrupted during verification; rolled back to %s",
                        record["versionId"], previous["versionId"] if previous else "none")
            record = previous
        if self.containers is not None:
            await self._reconcile_containers(record)
        if record is None:
            return
        try:
            spec = parse_spec(record["spec"])
        except ValueError as exc:  # it was valid when applied; only outside damage gets here
            log.error("the current configuration's workload is invalid (%s); not starting it", exc)
            return
        await self.workload.start(spec, self._env(record))

    def attach(self, device: DeviceContext) -> None:
        self._device = device
        device.register("config.apply", self.apply)
        device.add_hello_provider(lambda: {"configVersionApplied": self.version_applied()})
        device.add_boot_hook(self.boot)
        device.add_link_hook(self._on_link)
        device.add_shutdown_hook(self.workload.stop)
        self.workload.on_health = self._health_changed
        if self.containers is not None:
            device.add_boot_hook(self._identify_engine)
            BootLoop(device, lambda: self.containers.watch(self._health_changed))

    async def _identify_engine(self) -> None:
        # a boot hook, so the first hello already says whether this device runs containers
        self._device.capabilities.containerEngine = await self.containers.capability()

    async def _health_changed(self, health: Health) -> None:
        await self._send("workload.health", health.event())

    # ---- steps ----

    async def _apply(self, request: ApplyRequest) -> dict[str, Any]:
        current = self.current
        if current is not None and current.get("state") == "applied" and current["versionId"] == request.version_id:
            if request.registry_auth_given and self.containers is not None:
                await trio.to_thread.run_sync(self._save_registry_auth, request.registry_auth)
            if request.registry_proxy is not None and current.get("registryProxy") != request.registry_proxy:
                # the fleet's mode changed: a restart's pulls of this version go by it
                await trio.to_thread.run_sync(self._save_current, {**current, "registryProxy": request.registry_proxy})
            files = await self.files.put(request.files, source="configuration", config_id=request.config_id) \
                if request.files else []
            return _result("applied", request.config_id, request.version_id, files)
        base = current if current is None or current.get("state") == "applied" else current.get("previous")
        base_id = base["versionId"] if base else None
        try:
            spec = parse_spec(request.spec)
        except ValueError as exc:
            return _result("rejected", request.config_id, request.version_id, [],
                           error=f"invalid workload: {exc}", rolled_back_to=base_id)
        try:
            containers = parse_containers(request.spec)
        except ValueError as exc:
            return _result("rejected", request.config_id, request.version_id, [],
                           error=f"invalid containers: {exc}", rolled_back_to=base_id)
        if containers and self.containers is None:
            return _result("rejected", request.config_id, request.version_id, [], rolled_back_to=base_id,
                           error="this device has no container engine (fleethub agent --containers podman)")
        if self.workload.held:
            raise CommandError("busy", "the workload is held for maintenance; the version can be applied "
                                       "once it is released")
        record = {"configId": request.config_id, "versionId": request.version_id, "version": request.version,
                  "spec": request.spec, "deviceId": self.device_id() or (base or {}).get("deviceId"),
                  "state": "verifying", "previous": _without_previous(base),
                  **({"registryProxy": request.registry_proxy} if request.registry_proxy else {})}
        await trio.to_thread.run_sync(self._save_version, record)
        await trio.to_thread.run_sync(self._save_current, record)
        if containers:
            await trio.to_thread.run_sync(self._save_registry_auth, request.registry_auth)
        health = await self._run_and_verify(spec, record)
        container_log = None
        if health.healthy and self.containers is not None:
            health, container_log = await self.containers.apply(request.version_id, containers,
                                                                request.registry_proxy)
        if health.healthy:
            record = {**record, "state": "applied", "previous": None}
            await trio.to_thread.run_sync(self._save_current, record)
            files = await self.files.put(request.files, source="configuration", config_id=request.config_id) \
                if request.files else []
            return _result("applied", request.config_id, request.version_id,
                           files + await self._remove_other_configurations(request.config_id))
        # read before the restore: the previous workload's start is not this version's story
        workload_log = container_log or await trio.to_thread.run_sync(self.workload.log_tail)
        await trio.to_thread.run_sync(self._save_current, base)
        await self._restore(base)
        said = logtail.last_line(health.output) if health.output else None
        return _result("rejected", request.config_id, request.version_id, [],
                       error=f"health check failed: {health.detail}" + (f": {said}" if said else ""),
                       rolled_back_to=base_id, check_output=health.output, workload_log=workload_log)

    def _save_registry_auth(self, logins: dict[str, tuple[str, str]]) -> None:
        write_registry_auth(self.auth_path, logins)

    async def _run_and_verify(self, spec: WorkloadSpec | None, record: dict[str, Any]) -> Health:
        await self.workload.restart(spec, self._env(record))
        if spec is None:
            return Health(True, "no workload")
        return await self.workload.wait_healthy(spec.grace + spec.timeout)

    async def _restore(self, base: dict[str, Any] | None) -> None:
        if base is None:
            await self.workload.restart(None, {})
            return
        try:
            spec = parse_spec(base["spec"])
        except ValueError:
            spec = None
        await self.workload.restart(spec, self._env(base))

    async def _reconcile_containers(self, record: dict[str, Any] | None) -> None:
        try:
            wanted = parse_containers(record["spec"]) if record is not None else []
        except ValueError as exc:  # valid when applied; only outside damage gets here
            log.error("the current configuration's containers are invalid (%s); not starting them", exc)
            return
        await self.containers.reconcile(record["versionId"] if record is not None else None, wanted,
                                        record.get("registryProxy") if record is not None else None)

    async def _remove_other_configurations(self, config_id: str) -> list[dict[str, Any]]:
        stale = [path for path, entry in self.files.managed().items()
                 if entry.get("source") == "configuration" and entry.get("configId") != config_id]
        return await self.files.delete(stale) if stale else []

    async def _on_link(self) -> None:
        if self._boot_report is not None:
            report = self._boot_report
            if await self._send("config.result", report) and self._boot_report is report:
                self._boot_report = None

    async def _send(self, kind: str, payload: dict[str, Any]) -> bool:
        return await self._device.send_event(kind, payload) if self._device is not None else False

    def _env(self, record: dict[str, Any]) -> dict[str, str]:
        env = {"FLEETHUB_CONFIG_FILE": str(self.config_file(record["versionId"]))}
        if record.get("deviceId"):
            env["FLEETHUB_DEVICE_ID"] = str(record["deviceId"])
        return env

    # ---- disk, in a worker thread ----

    def _save_version(self, record: dict[str, Any]) -> None:
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        version = {k: record[k] for k in ("configId", "versionId", "version", "spec")}
        write_json_atomic(self.config_file(record["versionId"]), version, mode=0o644)
        keep = {record["versionId"], (record.get("previous") or {}).get("versionId")}
        old = sorted(self.versions_dir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for path in old[KEEP_VERSIONS:]:
            if path.stem not in keep:
                path.unlink(missing_ok=True)

    def _save_current(self, record: dict[str, Any] | None) -> None:
        if record is None:
            self.current_path.unlink(missing_ok=True)
        else:
            write_json_atomic(self.current_path, record)
        self._current, self._loaded = record, True


def _without_previous(record: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if record is None else {k: v for k, v in record.items() if k != "previous"}


def _result(status: str, config_id: str, version_id: str, files: list[dict[str, Any]], *,
            error: str | None = None, rolled_back_to: str | None = None, check_output: str | None = None,
            workload_log: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"status": status, "configId": config_id, "versionId": version_id, "files": files}
    if status == "rejected":
        out["error"] = error
        out["rolledBackTo"] = rolled_back_to
        # only what there is: a hub older than these fields reads the result as before
        if check_output:
            out["checkOutput"] = check_output
        if workload_log:
            out["workloadLog"] = workload_log
    return out
