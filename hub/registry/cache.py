"""The proxy's store: verified manifests and blobs on disk under the hub's data dir, least recently
used first out when the budget is exceeded, and one upstream fetch however many ask at once.

Entries are keyed by (registry/repository, kind, digest), not by digest alone: a blob is served to a
repository only after that repository's registry gave it, so an organisation cannot read another's
private layer from the cache by naming its digest under a repository of its own. The path of an entry
is a hash of the name, never the name itself, so no name can reach outside the cache's directory.

A file enters the cache only once its bytes hashed to its digest (hub/registry/upstream.py), written to
a temporary file, flushed to disk and renamed into place, so a power loss leaves either the whole
verified file or none. Eviction unlinks a file; a device still reading it keeps its open descriptor,
so a transfer in flight finishes. Manifests keep their media type in a ``.type`` file beside them.

Concurrent requests for an entry being fetched wait for that fetch (``_fills``): a hundred devices
pulling one image cost the upstream registry each object once. When the fetch fails, every waiter
gets its error; when it is abandoned (the hub stops, or without ``spawn`` the device whose request
runs it went away), one waiter fetches again.

Streaming (``open(..., stream=True)``, blobs asked whole): with ``spawn`` the fetch runs in a task of its
own, and a request for a blob being fetched whose length the registry declared is answered at once, its
bytes read from the temporary file as they are written (``Growing``), so the first bytes reach a device
before the registry has sent the last. The bytes are verified only at the end: when they do not hash to
the digest the readers' transfers are cut (the device discards a short or wrong blob, as it verifies it
too) and nothing is kept. The cached file is still only ever the verified one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import trio

from .upstream import Progress, UpstreamError

log = logging.getLogger("fleethub.registry")

BLOB_TYPE = "application/octet-stream"
ATTEMPTS = 3  # fills abandoned by their devices before a request gives up


@dataclass
class Entry:
    path: Path
    size: int
    media_type: str


@dataclass
class _Fill:
    """A fetch under way; also its ``Progress``, so that readers can follow the file."""
    done: trio.Event = field(default_factory=trio.Event)
    error: Exception | None = None  # UpstreamError, or OSError from the hub's own disk
    tmp: Path | None = None
    size: int | None = None  # the length the registry declared
    written: int = 0  # bytes in the temporary file, flushed
    answered: trio.Event = field(default_factory=trio.Event)  # the registry answered (or the fill ended)
    moved: trio.Event = field(default_factory=trio.Event)  # replaced at every write

    def begin(self, size: int | None) -> None:
        self.size = size
        self.answered.set()

    def advance(self, written: int) -> None:
        self.written = written
        self._wake()

    def end(self) -> None:
        self.done.set()
        self.answered.set()
        self._wake()

    def _wake(self) -> None:
        self.moved.set()
        self.moved = trio.Event()


class Growing:
    """A blob read while its fill writes it: ``read`` gives what is written, waits for more, and raises
    the fill's error if it fails (the reader's transfer must then be cut short)."""

    def __init__(self, fill: _Fill, handle: BinaryIO) -> None:
        self.fill, self.handle, self.pos = fill, handle, 0

    async def read(self, n: int) -> bytes:
        while True:
            fill = self.fill
            if fill.error is not None:
                raise fill.error
            if self.pos < fill.written:
                chunk = await trio.to_thread.run_sync(self.handle.read, min(n, fill.written - self.pos))
                self.pos += len(chunk)
                return chunk
            if fill.done.is_set():
                return b""
            await fill.moved.wait()

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> "Growing":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Fetch = Callable[[BinaryIO, int, Progress], Awaitable[str]]  # (the file, the most bytes, progress) -> media type


class Cache:
    def __init__(self, root: Path, budget: int, spawn: Callable[..., Any] | None = None) -> None:
        """``spawn(fn, *args)`` starts a task (hub/services.py ``spawn``): fills run there, and blobs
        stream while they arrive. None: a fill runs in the task of the request that started it."""
        self.root = Path(root)
        self.budget = budget
        self.spawn = spawn
        self.entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self.total = 0
        self.hits = 0
        self.fills = 0
        self._fills: dict[str, _Fill] = {}

    @staticmethod
    def key(name: str, kind: str, digest: str) -> str:
        return f"{hashlib.sha256(name.encode()).hexdigest()}/{kind}/{digest.removeprefix('sha256:')}"

    def load(self) -> None:
        """What an earlier run left, oldest use first; leftovers of interrupted fills are removed."""
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        for stale in (self.root / "tmp").iterdir():
            stale.unlink(missing_ok=True)
        found = []
        for path in self.root.glob("*/*/*"):
            if path.suffix or not path.is_file():
                continue
            kind = path.parent.name
            media = BLOB_TYPE
            if kind == "manifests":
                try:
                    media = path.with_suffix(".type").read_text().strip() or BLOB_TYPE
                except OSError:
                    path.unlink(missing_ok=True)  # a manifest is not served without its media type
                    continue
            st = path.stat()
            found.append((st.st_mtime, str(path.relative_to(self.root)), Entry(path, st.st_size, media)))
        for _, key, entry in sorted(found, key=lambda f: f[0]):
            self.entries[key] = entry
            self.total += entry.size
        self._evict()

    async def open(self, key: str, fetch: Fetch, *, max_bytes: int,
                   stream: bool = False) -> tuple[Entry, BinaryIO | Growing]:
        """The entry ``key`` and its file open for reading, fetched with ``fetch`` (which writes the
        verified bytes to the file it is given and returns the media type) unless cached. ``stream``
        (with ``spawn``): a blob being fetched with a declared length comes as a ``Growing`` reader."""
        for _ in range(ATTEMPTS):
            entry = self.entries.get(key)
            if entry is not None:
                try:
                    handle = entry.path.open("rb")  # before any await: eviction cannot come between
                except FileNotFoundError:
                    self._forget(key)
                    continue
                self.entries.move_to_end(key)
                self.hits += 1
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(_touch, entry.path)
                return entry, handle
            fill = self._fills.get(key)
            if fill is None and self.spawn is not None:
                fill = self._fills[key] = _Fill()
                self.spawn(self._fill_apart, key, fill, fetch, min(max_bytes, self.budget))
            if fill is not None:
                if stream:
                    await fill.answered.wait()
                    growing = _follow(fill)
                    if growing is not None:
                        return Entry(fill.tmp, fill.size, BLOB_TYPE), growing
                await fill.done.wait()
                if fill.error is not None:
                    raise fill.error
                continue
            fill = self._fills[key] = _Fill()
            try:
                await self._fill(key, fetch, min(max_bytes, self.budget), fill)
            except (UpstreamError, OSError) as exc:
                fill.error = exc
                raise
            finally:
                del self._fills[key]
                fill.end()
        raise UpstreamError("the object could not be fetched: every request for it went away before it came")

    async def _fill_apart(self, key: str, fill: _Fill, fetch: Fetch, max_bytes: int) -> None:
        """A fill in its own task: its error goes to whoever waits for it; cancelled (the hub stops),
        it ends with no error and a waiter starts another."""
        try:
            await self._fill(key, fetch, max_bytes, fill)
        except (UpstreamError, OSError) as exc:
            fill.error = exc
        except Exception as exc:  # noqa: BLE001 - a task of the hub's: a fault here must not end the hub
            log.exception("registry cache: the fill of %s failed", key)
            fill.error = UpstreamError(f"the proxy could not fetch the object ({type(exc).__name__})")
        finally:
            del self._fills[key]
            fill.end()

    async def _fill(self, key: str, fetch: Fetch, max_bytes: int, fill: _Fill) -> None:
        self.fills += 1
        path = self.root / key
        tmp = await trio.to_thread.run_sync(_temporary, self.root / "tmp")
        fill.tmp = Path(tmp.name)
        try:
            with tmp:
                media = await fetch(tmp, max_bytes, fill)
                await trio.to_thread.run_sync(_seal, tmp)
            await trio.to_thread.run_sync(_install, Path(tmp.name), path, media if _is_manifest(key) else None)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(lambda: Path(tmp.name).unlink(missing_ok=True))
            raise
        size = path.stat().st_size
        self.entries[key] = Entry(path, size, media if _is_manifest(key) else BLOB_TYPE)
        self.total += size
        self._evict()

    def _evict(self) -> None:
        while self.total > self.budget and len(self.entries) > 1:
            key, entry = next(iter(self.entries.items()))
            self._forget(key)
            entry.path.unlink(missing_ok=True)
            entry.path.with_suffix(".type").unlink(missing_ok=True)
            log.info("registry cache: evicted %s (%d bytes) to stay within %d", key, entry.size, self.budget)

    def _forget(self, key: str) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.total -= entry.size


def _follow(fill: _Fill) -> Growing | None:
    """A reader of the fill's file, when the registry declared the length and the fill goes on."""
    if fill.size is None or fill.done.is_set() or fill.tmp is None:
        return None
    try:
        return Growing(fill, fill.tmp.open("rb"))
    except FileNotFoundError:  # the fill failed between the check and here
        return None


def _is_manifest(key: str) -> bool:
    return key.split("/")[1] == "manifests"


def _temporary(directory: Path) -> BinaryIO:
    directory.mkdir(parents=True, exist_ok=True)
    return tempfile.NamedTemporaryFile(dir=directory, delete=False)


def _seal(handle: BinaryIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def _install(tmp: Path, path: Path, media_type: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if media_type is not None:
        path.with_suffix(".type").write_text(media_type)
    os.replace(tmp, path)


def _touch(path: Path) -> None:
    try:
        os.utime(path)  # the order of use survives a restart (load sorts by it)
    except OSError:
        pass
