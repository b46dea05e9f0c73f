"""The hub's private files and its data directory: keys, passwords and demo.json, 0600 to the hub's user.

Every key file the hub writes goes through ``write_private`` (created 0600 under a fresh name, then
renamed, so it is never wider, not even for an instant) and every key it reads through
``read_private``, which tightens a file someone left readable to others and says so: the same rule
ssh applies, except that a hub has nobody to ask. ``secure_data_dir`` keeps the data directory from
being listed: 0700, or 0711 when the hub is root, because then two other accounts must pass through
it to their own corner (the embedded PostgreSQL's system user to ``pg/``, and simulated devices'
workload account to their device roots), and execute-only lets them pass without seeing anything.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger("fleethub.storage")

PRIVATE_MODE = 0o600


def write_private(path: Path, data: bytes, owner: tuple[int, int] | None = None) -> None:
    """Replace ``path`` atomically and durably with ``data``, mode 0600 (``owner``: uid, gid)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            if owner is not None:
                os.fchown(f.fileno(), *owner)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def create_private(path: Path, data: bytes) -> bool:
    """Create ``path`` 0600 with ``data`` unless it exists (False then: another process won)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return True


def read_private(path: Path) -> bytes:
    """The contents of a private file, after making sure only its owner can read it."""
    path = Path(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("private file %s was open to others (mode %04o); set to 0600", path, mode)
        os.chmod(path, PRIVATE_MODE)
    return path.read_bytes()


def secure_data_dir(path: Path) -> None:
    """Create the data dir if needed; nobody else may list or read it (see the module doc)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    wanted = 0o711 if os.geteuid() == 0 else 0o700
    if stat.S_IMODE(path.stat().st_mode) != wanted:
        os.chmod(path, wanted)
