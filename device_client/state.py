"""What a device keeps on its own disk between boots: state file, identity key, boot record.

Everything here is synchronous file IO; the agent runs it through ``trio.to_thread`` so that thousands
of simulated devices fsyncing at start do not stall the event loop.

A state file survives power loss at any instant: a write goes to a temporary file in the same
directory, is fsynced, renamed over the old file, and the directory is fsynced so the rename itself
is durable. A reader therefore sees either the old or the new content, never a torn mix.

Paths here are opened by name, not walked by descriptor as under the device root (devroot.py): they
all lie in the agent's data directory, which ``DeviceStore.boot`` sets to 0700 (a workload's account
is given execute on it at most, workload_account.make_traversable), so no other account can put a
link or a file where these names are resolved.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from nacl.signing import SigningKey

log = logging.getLogger("fleethub.agent")

TMP_SUFFIX = ".tmp"
_SEED_BYTES = 32  # an Ed25519 private key is its 32-byte seed


class IdentityError(RuntimeError):
    """The identity key file exists but cannot be used.

    Never answered by generating a new key: that would silently give the device a new identity and
    every tunnel grant bound to the old public key would stop working.
    """


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600, *,
                 owner: Callable[[int], None] | None = None) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file.

    ``owner(fd)`` may chown the temporary file; it runs first, on the still empty 0600 file."""
    # the name is cut short: a 255-byte file name plus the temporary suffix would be too long
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:32]}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            if owner is not None:
                owner(f.fileno())
            # mkstemp creates 0600; chmod before any byte lands so a wider mode is never visible early
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any, mode: int = 0o600) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True).encode() + b"\n", mode)


class StateFile:
    """A small JSON object on disk, cached in memory after the first load."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._data: dict[str, Any] | None = None

    def load(self) -> dict[str, Any]:
        if self._data is None:
            self._data = self._read()
        return dict(self._data)

    def get(self, key: str, default: Any = None) -> Any:
        return self.load().get(key, default)

    def update(self, **changes: Any) -> dict[str, Any]:
        """Apply ``changes`` (a value of None removes the key) and persist atomically."""
        data = self.load()
        for key, value in changes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        write_json_atomic(self.path, data)
        self._data = data
        return dict(data)

    def _read(self) -> dict[str, Any]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            # Atomic writes make this a sign of outside tampering or disk damage. Keep the bad file
            # for a human and start over: a device that refuses to boot is worse than one that
            # forgot its pending boot reason.
            aside = self.path.with_name(self.path.name + ".corrupt")
            os.replace(self.path, aside)
            log.error("state file %s is unreadable (%s); moved to %s", self.path, exc, aside)
            return {}
        return data


def load_or_create_identity(path: Path) -> SigningKey:
    """The device's Ed25519 identity: generated once, then read from ``path`` (mode 0600) forever."""
    try:
        st = path.stat()
    except FileNotFoundError:
        key = SigningKey.generate()
        write_atomic(path, bytes(key), mode=0o600)
        log.info("generated a new device identity key at %s", path)
        return key
    if stat.S_IMODE(st.st_mode) & 0o077:
        # ssh refuses such a key; a device has nobody to ask, so it tightens the mode and says so
        log.warning("identity key %s was readable by others (mode %o); set to 0600",
                    path, stat.S_IMODE(st.st_mode))
        os.chmod(path, 0o600)
    seed = path.read_bytes()
    if len(seed) != _SEED_BYTES:
        raise IdentityError(f"{path}: expected a {_SEED_BYTES}-byte Ed25519 seed, found {len(seed)} bytes")
    return SigningKey(seed)


@dataclass(frozen=True)
class Boot:
    reason: str  # reported in every hello of this boot
    count: int  # boots of this device so far, this one included
    reboot_reply: dict[str, Any] | None  # {"commandId", "reply"} of the command that caused it
    key: SigningKey


class DeviceStore:
    """One device's directory: ``state.json``, ``identity.key`` and ``root/`` for delivered files."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.root = data_dir / "root"
        self.state = StateFile(data_dir / "state.json")

    def boot(self) -> Boot:
        """Start a boot: consume the pending boot reason (a later unannounced restart is a power
        loss again) and count the boot."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)  # holds the identity key and the device's files
        key = load_or_create_identity(self.data_dir / "identity.key")
        state = self.state.load()
        reason = state.get("pendingBootReason") or "power_on"
        count = int(state.get("bootCount", 0)) + 1
        self.state.update(pendingBootReason=None, bootCount=count)
        reboot_reply = state.get("lastReboot") if reason != "power_on" else None
        return Boot(reason, count, reboot_reply, key)

    def prepare_reboot(self, reason: str, command_id: str | None, reply: dict[str, Any] | None) -> None:
        """Written before the link closes, so the next boot reports ``reason`` and still knows the
        answer to the command that asked for it."""
        changes: dict[str, Any] = {"pendingBootReason": reason}
        if command_id is not None and reply is not None:
            changes["lastReboot"] = {"commandId": command_id, "reply": reply}
        self.state.update(**changes)
