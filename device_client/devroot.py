"""The device root, reached only through directory file descriptors.

Parts of the tree under the root belong to other accounts: the workload owns
``/var/lib/fleethub/volumes``, a login user owns ``/home/<user>``. Any of them can replace a directory
by a symbolic link at any instant, and the agent runs as root. A check of the resolved path followed
by a write by path name is therefore a race the other account can win (``renameat2`` with
RENAME_EXCHANGE swaps a directory and a link atomically, as often as it likes), and the agent would
create, replace or delete files as root wherever the link points.

So nothing here resolves a path string. The walk opens each component relative to the directory
before it, with O_NOFOLLOW, and every operation names its target as (directory fd, one name):
mkdir, create, rename, unlink, stat, chown and chmod. A symbolic link anywhere before the last
component is refused, never followed, so the path that was checked (``paths.check_path``) is the
path that is written. The last component is never followed either: a rename replaces a link found at
that name, unlink removes the link itself, and a file is read only through a descriptor opened with
O_NOFOLLOW | O_NONBLOCK (a FIFO put there cannot block the agent) whose fstat says it is regular.

A directory is created only once everything above it has been opened: nothing is made before the
walk has reached, and so checked, its parent. A directory opened by descriptor that another account
then renames elsewhere is still the directory we reached; it can only have been moved to where that
account could already write.

The root itself (``<data_dir>/root`` for a simulated device, ``/`` on a real one) is the agent's own
and is opened by name.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .state import TMP_SUFFIX

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# (device path of a directory about to be made or opened) -> the mode it must have, or None to
# leave an existing directory's mode alone
DirMode = Callable[[str], "int | None"]


class Refused(Exception):
    """The walk met something it will not pass: a symbolic link, or a file where a directory must
    be. The message names the device path; it becomes the FileResult's error."""


def _join(parent: str, name: str) -> str:
    return f"{parent.rstrip('/')}/{name}"


class DeviceRoot:
    """The device's file system under ``path``; every method takes device paths (``/etc/app/key``)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _open_root(self) -> int:
        self.path.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    @contextmanager
    def parent(self, path: str, *, create: bool = False, dir_mode: DirMode | None = None
               ) -> Iterator[tuple[int, str]]:
        """Yield (fd of the directory holding ``path``, the last name of ``path``).

        ``create`` makes missing directories (mode from ``dir_mode``, else 0755); without it a missing
        one raises FileNotFoundError. A link or a non-directory on the way raises Refused."""
        names = path.strip("/").split("/")
        fd = self._open_root()
        try:
            walked = "/"
            for name in names[:-1]:
                walked = _join(walked, name)
                current, fd = fd, -1  # _step closes it, whatever happens
                fd = self._step(current, name, walked, create, dir_mode)
            yield fd, names[-1]
        finally:
            if fd >= 0:
                os.close(fd)

    @contextmanager
    def directory(self, path: str, *, create: bool = False, dir_mode: DirMode | None = None) -> Iterator[int]:
        """Yield an fd of the directory ``path`` itself, walked and made as ``parent`` does."""
        with self.parent(path + "/.", create=create, dir_mode=dir_mode) as (fd, _):
            yield fd

    def _step(self, fd: int, name: str, walked: str, create: bool, dir_mode: DirMode | None) -> int:
        """Open ``name`` under ``fd`` as a directory (making it when asked); closes ``fd`` either way."""
        try:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                made = False
            except FileNotFoundError:
                if not create:
                    raise
                mode = (dir_mode(walked) if dir_mode else None) or 0o755
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass  # made by someone else meanwhile: opened and judged below like any other
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                made = True
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise self._refusal(fd, name, walked) from None
                raise
            try:
                wanted = dir_mode(walked) if dir_mode else None
                if made and wanted is None:
                    wanted = 0o755
                if wanted is not None and stat.S_IMODE(os.fstat(child).st_mode) != wanted:
                    os.fchmod(child, wanted)  # mkdir's mode went through the umask
            except BaseException:
                os.close(child)
                raise
            return child
        finally:
            os.close(fd)

    @staticmethod
    def _refusal(fd: int, name: str, walked: str) -> Refused:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return Refused(f"{walked} changed while it was being opened")
        if stat.S_ISLNK(st.st_mode):
            return Refused(f"{walked} is a symbolic link, and the agent follows none in a managed path")
        return Refused(f"{walked}: Not a directory")

    # ---- one entry in an open directory ----

    @staticmethod
    @contextmanager
    def open_directory(dir_fd: int, name: str) -> Iterator[int]:
        """An fd of the directory ``name`` in ``dir_fd``; a link there raises Refused."""
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(f"{name} is not a directory (a symbolic link is never followed)") from None
            raise
        try:
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def lstat(dir_fd: int, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    @staticmethod
    @contextmanager
    def open_regular(dir_fd: int, name: str) -> Iterator[tuple[int, os.stat_result] | None]:
        """Yield (fd, fstat) of the regular file ``name``, or None when it is missing or is anything
        else (a link, a directory, a FIFO: none of them is opened in a way that could follow or block)."""
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EWOULDBLOCK):
                yield None
                return
            raise
        try:
            st = os.fstat(fd)
            yield (fd, st) if stat.S_ISREG(st.st_mode) else None
        finally:
            os.close(fd)

    @staticmethod
    def sha256_of(fd: int) -> str:
        digest = hashlib.sha256()
        offset = 0
        while chunk := os.pread(fd, 1 << 16, offset):
            digest.update(chunk)
            offset += len(chunk)
        return digest.hexdigest()

    @staticmethod
    def replace(dir_fd: int, name: str, data: bytes, mode: int, *,
                owner: Callable[[int], None] | None = None) -> None:
        """Write ``data`` to a new file beside ``name`` and rename it over ``name``: a reader, or a
        crash, sees the old file or the new one. ``owner(fd)`` chowns the still empty 0600 file."""
        # the name is cut short: a 255-byte file name plus the temporary suffix would be too long
        tmp = f".{name[:32]}.{secrets.token_hex(4)}{TMP_SUFFIX}"
        fd = os.open(tmp, _CREATE_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            try:
                if owner is not None:
                    owner(fd)
                os.fchmod(fd, mode)  # before any byte lands, so a wider mode is never visible early
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            raise
        os.fsync(dir_fd)

    @staticmethod
    def remove(dir_fd: int, name: str) -> bool:
        """Unlink ``name`` (a link itself, never its target); False when it is a directory or gone."""
        try:
            os.unlink(name, dir_fd=dir_fd)
        except (FileNotFoundError, IsADirectoryError):
            return False
        except PermissionError:
            st = DeviceRoot.lstat(dir_fd, name)
            if st is not None and stat.S_ISDIR(st.st_mode):
                return False  # Linux answers EISDIR; other kernels EPERM for a directory
            raise
        os.fsync(dir_fd)
        return True
