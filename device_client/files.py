"""Secret files on the device: written atomically with exact bytes, mode and owner, and remembered.

A device path ``P`` lands at ``<root>/P``. The agent's root is ``<data_dir>/root`` because a
simulated device (and every test) must not write to the machine's real ``/etc``; a real deployment
runs the same code with ``root=Path("/")``, and nothing else changes.

A write never leaves a torn or half-owned file: the bytes go to a temporary file in the target's own
directory (so the rename cannot cross filesystems), which gets its owner and mode, is fsynced, is
renamed over the target, and then the directory is fsynced so the rename survives power loss. If any
step fails, the previous file is untouched and the result is ``failed`` with the OS's reason. Every
one of those steps names its target by directory descriptor and one name, never by a path string,
and no symbolic link on the way is followed (devroot.py says why: the workload owns part of the tree).

The store keeps a manifest, ``<data_dir>/secret-files.json`` = ``{path: {fileId, sha256, mode, uid,
gid, source, configId}}``, of the files the hub put there: delete and wipe only ever touch those, and
the hello reports their digests so the hub can see what is missing or different.

Owners: every file gets the uid and gid asked for, which needs root (CAP_CHOWN). Without it, a file
whose owner cannot be set fails with that reason, unless FLEETHUB_AGENT_IGNORE_OWNER=1: then the
agent keeps the owner it can give, records the intended one in the manifest, and reports the file
on_device (meant for unprivileged simulations, never for a real device). A simulated device run by
root (``owner_for_all``) gives every file to its one workload account instead: the uids a
configuration names mean nothing on the simulator's host, and must not hand tenants' files to
whichever host user happens to have them; the manifest still records the owner asked for.

Files under the platform secrets directory are mounted read-only into the workload: their mode is the
asked mode masked with 0444 (no write, execute or special bits) and their directories are 0755. A
rename is atomic for readers too, so a running workload sees the new contents on its next read,
without a restart. Contents never reach a log; only paths and short fingerprints do.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import trio

from .commands import CommandError
from .shared.paths import SECRETS_DIR, check_mode, check_path, classify, parse_mode
from .devroot import DeviceRoot, Refused
from .state import StateFile

if TYPE_CHECKING:
    from .context import DeviceContext

log = logging.getLogger("fleethub.agent.files")

MANIFEST_NAME = "secret-files.json"
IGNORE_OWNER_ENV = "FLEETHUB_AGENT_IGNORE_OWNER"
MAX_CONTENT_BYTES = 64 * 1024
SECRETS_FILE_MASK = 0o444
SECRETS_DIR_MODE = 0o755


class FileFailure(Exception):
    """One file could not be handled; the message is the FileResult's error."""


@dataclass(frozen=True)
class WantedFile:
    """A checked SecretFilePayload."""
    file_id: str | None
    path: str
    mode: int
    uid: int
    gid: int
    data: bytes
    sha256: str
    source: str
    config_id: str | None


def _id(raw: dict[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return None if value is None else str(value)


def _owner_id(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32 - 1:
        raise FileFailure(f"{what} must be an integer from 0 to 4294967294")
    return value


def parse_file(raw: Any, *, source: str | None = None, config_id: str | None = None) -> WantedFile:
    """Check one SecretFilePayload; FileFailure names the first problem."""
    if not isinstance(raw, dict):
        raise FileFailure("a file must be an object")
    path = raw.get("path")
    problem = check_path(path)
    if problem:
        raise FileFailure(problem)
    mode = raw.get("mode", 0o600)
    if isinstance(mode, str):
        try:
            mode = parse_mode(mode)
        except ValueError as exc:
            raise FileFailure(str(exc)) from None
    problem = check_mode(mode)
    if problem:
        raise FileFailure(problem)
    uid, gid = _owner_id(raw.get("uid", 0), "uid"), _owner_id(raw.get("gid", 0), "gid")
    content = raw.get("contentB64")
    if not isinstance(content, str):
        raise FileFailure("contentB64 must be a base64 string")
    try:
        data = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise FileFailure("content is not valid base64") from None
    if not data:
        raise FileFailure("content is empty")
    if len(data) > MAX_CONTENT_BYTES:
        raise FileFailure(f"content is {len(data)} bytes; at most {MAX_CONTENT_BYTES} are allowed")
    digest = hashlib.sha256(data).hexdigest()
    claimed = raw.get("sha256")
    if claimed is not None and str(claimed).lower() != digest:
        raise FileFailure("content does not match its sha256")
    config_id = config_id or _id(raw, "configId")
    source = source or raw.get("source") or ("configuration" if config_id else "device")
    if source not in ("device", "configuration"):
        raise FileFailure("source must be 'device' or 'configuration'")
    return WantedFile(_id(raw, "fileId"), path, mode, uid, gid, data, digest, source, config_id)  # type: ignore[arg-type]


def _result(path: str, status: str, file_id: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"path": path, "status": status}
    if file_id is not None:
        out["fileId"] = file_id
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


def _list(payload: dict[str, Any], key: str) -> list[Any]:
    value = payload.get(key)
    if not isinstance(value, list):
        raise CommandError("invalid_payload", f"{key} must be a list")
    return value


class SecretFileStore:
    def __init__(self, data_dir: Path, root: Path, *, ignore_owner: bool | None = None,
                 owner_for_all: tuple[int, int] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.owner_for_all = owner_for_all
        self.root = Path(root)
        self.fs = DeviceRoot(self.root)
        self.manifest = StateFile(self.data_dir / MANIFEST_NAME)  # path -> entry
        if ignore_owner is None:
            ignore_owner = os.environ.get(IGNORE_OWNER_ENV, "") == "1"
        self.ignore_owner = ignore_owner
        self._lock = trio.Lock()
        self._boot_report: list[dict[str, Any]] = []
        self._device: DeviceContext | None = None

    # ---- what the rest of the device asks ----

    def local_path(self, path: str) -> Path:
        """Where ``path`` is for a reader outside the agent (tests, the simulator's workload); the
        agent itself never uses this name for a write (devroot.py)."""
        return self.root / path.lstrip("/")

    def managed(self) -> dict[str, dict[str, Any]]:
        """path → {fileId, sha256, mode, uid, gid, source, configId} of the files the hub put here."""
        return self.manifest.load()

    def digests(self) -> dict[str, str]:
        """path → sha256 of every managed file (for the hello)."""
        return {p: e["sha256"] for p, e in self.manifest.load().items()}

    async def put(self, files: Iterable[Any], *, source: str | None = None,
                  config_id: str | None = None) -> list[dict[str, Any]]:
        """Write each file on its own; one FileResult per file, in order."""
        checked: list[WantedFile | dict[str, Any]] = []
        for raw in files:
            try:
                checked.append(parse_file(raw, source=source, config_id=config_id))
            except FileFailure as exc:
                raw = raw if isinstance(raw, dict) else {}
                path = raw.get("path") if isinstance(raw.get("path"), str) else ""
                checked.append(_result(path, "failed", _id(raw, "fileId"), error=str(exc)))
        async with self._lock:
            return await trio.to_thread.run_sync(self._put_sync, checked)

    async def delete(self, paths: Iterable[Any]) -> list[dict[str, Any]]:
        async with self._lock:
            return await trio.to_thread.run_sync(self._delete_sync, list(paths))

    async def wipe(self) -> dict[str, Any]:
        """Remove every managed file (unpair, factory reset): ``{removed: [path], failed?: [FileResult]}``."""
        async with self._lock:
            results = await trio.to_thread.run_sync(self._delete_sync, sorted(self.manifest.load()))
        out: dict[str, Any] = {"removed": [r["path"] for r in results if r["status"] == "removed"]}
        failed = [r for r in results if r["status"] != "removed"]
        if failed:
            out["failed"] = failed
        return out

    async def verify(self) -> list[dict[str, Any]]:
        """Check every managed file against the manifest, correct mode and owner drift, and return
        the FileResults worth telling the hub: drift corrected, files missing or changed."""
        async with self._lock:
            return await trio.to_thread.run_sync(self._verify_sync)

    # ---- agent wiring ----

    def attach(self, device: DeviceContext) -> None:
        self._device = device
        device.register("files.put", self._handle_put)
        device.register("files.delete", self._handle_delete)
        device.register("files.wipe", self._handle_wipe)
        device.add_hello_provider(lambda: {"secretFileDigests": self.digests()})
        device.add_boot_hook(self._on_boot)
        device.add_link_hook(self._on_link)

    async def _handle_put(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"results": await self.put(_list(payload, "files"))}

    async def _handle_delete(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"results": await self.delete(_list(payload, "paths"))}

    async def _handle_wipe(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self.wipe()

    async def _on_boot(self) -> None:
        # most simulated devices hold no files: spare them the worker-thread round trip
        self._boot_report = await self.verify() if self.manifest.path.exists() else []

    async def _on_link(self) -> None:
        # at boot there is no link yet; the report goes out on the first link of the boot
        report = self._boot_report
        if report and self._device and await self._device.send_event("files.result", {"results": report}):
            if self._boot_report is report:
                self._boot_report = []

    # ---- the file system work, in a worker thread ----

    def _put_sync(self, checked: list[WantedFile | dict[str, Any]]) -> list[dict[str, Any]]:
        manifest, changes = self.manifest.load(), {}
        results: list[dict[str, Any]] = []
        for w in checked:
            if isinstance(w, dict):
                results.append(w)
                continue
            current = manifest.get(w.path)
            if w.source == "configuration" and current is not None and current.get("source") == "device":
                # the device's own file at a path wins over the configuration's (spec: Overridden)
                results.append(_result(w.path, "overridden", w.file_id))
                continue
            try:
                mode = self._write(w)
            except FileFailure as exc:
                results.append(_result(w.path, "failed", w.file_id, error=str(exc)))
                continue
            except Refused as exc:
                results.append(_result(w.path, "failed", w.file_id, error=f"cannot write {w.path}: {exc}"))
                continue
            except OSError as exc:
                results.append(_result(w.path, "failed", w.file_id, error=self._os_error(w.path, exc)))
                continue
            manifest[w.path] = changes[w.path] = {
                "fileId": w.file_id, "sha256": w.sha256, "mode": mode, "uid": w.uid, "gid": w.gid,
                "source": w.source, "configId": w.config_id}
            results.append(_result(w.path, "on_device", w.file_id, sha256=w.sha256))
        if changes:
            self.manifest.update(**changes)
        return results

    def _write(self, w: WantedFile) -> int:
        """Make ``w`` true on disk; returns the mode the file got. Every step names its target by
        directory fd and one name (devroot.py): nothing here resolves a path string."""
        secret = classify(w.path) == "secrets"
        mode = w.mode & SECRETS_FILE_MASK if secret else w.mode
        dir_mode = _secrets_dir_mode if secret else None
        with self.fs.parent(w.path, create=True, dir_mode=dir_mode) as (dfd, name), _where(_dirname(w.path)):
            st = DeviceRoot.lstat(dfd, name)
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise FileFailure(f"cannot write {w.path}: a directory is in the way")
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == len(w.data):
                with DeviceRoot.open_regular(dfd, name) as found:
                    if found is not None and DeviceRoot.sha256_of(found[0]) == w.sha256:
                        if self._fix_attributes(w.path, found[0], found[1], mode, w.uid, w.gid):
                            log.info("secret file %s: contents unchanged, mode/owner corrected", w.path)
                        return mode
            DeviceRoot.replace(dfd, name, w.data, mode, owner=lambda fd: self._chown(w.path, fd, w.uid, w.gid))
        log.info("secret file %s written (sha256 %s…, mode %04o, owner %d:%d)",
                 w.path, w.sha256[:12], mode, w.uid, w.gid)
        return mode

    def _chown(self, path: str, fd: int, uid: int, gid: int) -> bool:
        """True when the owner is now uid:gid; False when it could not be and that is allowed."""
        uid, gid = self.owner_for_all or (uid, gid)
        try:
            os.fchown(fd, uid, gid)
        except PermissionError as exc:
            if self.ignore_owner:
                return False
            # the agent's situation rather than the disk's, so the error says what to do about it
            raise FileFailure(
                f"cannot set owner {uid}:{gid} on {path}: {exc.strerror} (the agent is not root or "
                f"lacks CAP_CHOWN; {IGNORE_OWNER_ENV}=1 records the owner without applying it)") from None
        return True

    def _fix_attributes(self, path: str, fd: int, st: os.stat_result, mode: int, uid: int, gid: int) -> bool:
        fixed = False
        if (st.st_uid, st.st_gid) != (self.owner_for_all or (uid, gid)) and self._chown(path, fd, uid, gid):
            log.info("secret file %s: owner %d:%d corrected to %d:%d", path, st.st_uid, st.st_gid, uid, gid)
            fixed = True
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)  # after chown, which may clear mode bits
            log.info("secret file %s: mode %04o corrected to %04o", path, stat.S_IMODE(st.st_mode), mode)
            fixed = True
        return fixed

    @staticmethod
    def _os_error(path: str, exc: OSError, verb: str = "write") -> str:
        # exc.filename is the device path of the directory where it failed (``_where``, devroot.py)
        message = f"cannot {verb} {path}: {exc.strerror or exc}"
        where = exc.filename if isinstance(exc.filename, str) and exc.filename.startswith("/") else None
        if where and where != path:
            message += f" ({where})"
        return message

    def _delete_sync(self, paths: list[Any]) -> list[dict[str, Any]]:
        manifest, changes = self.manifest.load(), {}
        results: list[dict[str, Any]] = []
        for path in paths:
            problem = check_path(path)
            if problem:
                results.append(_result(path if isinstance(path, str) else "", "failed", error=problem))
                continue
            entry = manifest.pop(path, None)
            if entry is None:
                results.append(_result(path, "removed"))  # not ours, or already gone: nothing to do
                continue
            try:
                # a directory on the way that is missing means the file is gone too
                with self.fs.parent(path) as (dfd, name), _where(_dirname(path)):
                    DeviceRoot.remove(dfd, name)
            except FileNotFoundError:
                pass
            except Refused as exc:
                results.append(_result(path, "failed", entry.get("fileId"), error=f"cannot remove {path}: {exc}"))
                continue
            except OSError as exc:
                results.append(_result(path, "failed", entry.get("fileId"),
                                       error=self._os_error(path, exc, "remove")))
                continue
            changes[path] = None
            log.info("secret file %s removed", path)
            results.append(_result(path, "removed", entry.get("fileId")))
        if changes:
            self.manifest.update(**changes)
        return results

    def _verify_sync(self) -> list[dict[str, Any]]:
        changes: dict[str, Any] = {}
        results: list[dict[str, Any]] = []
        for path, entry in sorted(self.manifest.load().items()):
            file_id = entry.get("fileId")
            try:
                with self.fs.parent(path) as (dfd, name), _where(_dirname(path)), \
                        DeviceRoot.open_regular(dfd, name) as found:
                    if found is None:
                        if DeviceRoot.lstat(dfd, name) is None:
                            raise FileNotFoundError(path)
                        # something else took the path; it is not ours to delete any more
                        changes[path] = None
                        results.append(_result(path, "failed", file_id, error="changed on device"))
                        continue
                    fd, st = found
                    actual = DeviceRoot.sha256_of(fd)
                    if actual != entry["sha256"]:
                        # report what is really there, so the hello's digest makes the hub push again
                        changes[path] = {**entry, "sha256": actual}
                        results.append(_result(path, "failed", file_id, error="changed on device"))
                        continue
                    if self._fix_attributes(path, fd, st, entry["mode"], entry["uid"], entry["gid"]):
                        results.append(_result(path, "on_device", file_id, sha256=actual))
            except FileNotFoundError:
                changes[path] = None
                results.append(_result(path, "failed", file_id, error="missing on device"))
            except Refused as exc:
                # a link now stands where a directory of ours was: never read or fixed through it
                results.append(_result(path, "failed", file_id, error=f"cannot check {path}: {exc}"))
            except FileFailure as exc:
                results.append(_result(path, "failed", file_id, error=str(exc)))
            except OSError as exc:
                results.append(_result(path, "failed", file_id, error=self._os_error(path, exc, "check")))
        if changes:
            self.manifest.update(**changes)
        if results:
            log.warning("secret files checked at boot: %d corrected, missing or changed", len(results))
        return results


def _dirname(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _secrets_dir_mode(device_dir: str) -> int | None:
    """Directories at and below the secrets directory are 0755 (mounted read-only into the workload);
    others keep the mode they have, and new ones get devroot's 0755."""
    return SECRETS_DIR_MODE if device_dir == SECRETS_DIR or device_dir.startswith(SECRETS_DIR + "/") else None


@contextmanager
def _where(device_dir: str) -> Iterator[None]:
    """An OSError from an operation inside ``device_dir`` says so (a directory fd has no name)."""
    try:
        yield
    except OSError as exc:
        if not isinstance(exc.filename, str) or not exc.filename.startswith("/"):
            exc.filename = device_dir
        raise
