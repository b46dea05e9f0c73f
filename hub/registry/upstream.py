"""One object (a manifest or a blob) from its upstream registry into a file, verified on the way.

The bytes are hashed as they arrive; the caller keeps the file only when the hash is the digest asked
for, so a registry (or anything between) that serves other bytes is refused and nothing of it is
cached or served. Bounds, so that an upstream costs a request a known amount at most: ``timeout`` for
the connection and the headers, ``idle`` between two chunks of the body, ``total`` for the whole
transfer, and ``max_bytes`` (4 MiB for a manifest, the cache's budget for a blob; a declared length
over it is refused before a byte is read). Redirects are followed only to HTTPS or, for a loopback
registry, to the same host: registries commonly send blob downloads to object storage.

Anonymous pulls, as the hub's pinning does (hub/images.py): a Bearer challenge is answered with an
anonymous token, which is kept per repository until the registry refuses it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import BinaryIO, Protocol

import httpx
import trio

from device_client.shared.imageref import ImageRef
from device_client.shared import outbound_tls
from hub import images

MAX_MANIFEST_BYTES = images.MAX_MANIFEST_BYTES
CONNECT_TIMEOUT = 10.0
IDLE_TIMEOUT = 30.0
TOTAL_TIMEOUT = 900.0
MAX_REDIRECTS = 3
WRITE_CHUNK = 256 << 10  # also what a reader following the fill gets at a time


class Progress(Protocol):
    """Told how a fetch goes, so that readers can follow the file as it fills (hub/registry/cache.py)."""

    def begin(self, size: int | None) -> None:
        """The registry answered: the object's declared length (None: it declared none)."""

    def advance(self, written: int) -> None:
        """The first ``written`` bytes are in the file, flushed (not yet verified)."""


class _Silent:
    def begin(self, size: int | None) -> None:
        pass

    def advance(self, written: int) -> None:
        pass


class UpstreamError(Exception):
    """The object could not be had from upstream. ``status`` is what the proxy answers its device:
    404 when the registry does not have it, 502 for anything else wrong with the registry."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Upstream:
    def __init__(self, *, allowed: Collection[str], transport: httpx.AsyncBaseTransport | None = None,
                 timeout: float = CONNECT_TIMEOUT, idle: float = IDLE_TIMEOUT, total: float = TOTAL_TIMEOUT) -> None:
        self.allowed = allowed
        self.timeout, self.idle, self.total = timeout, idle, total
        self.transport = transport
        self._tokens: dict[str, str] = {}  # registry/repository -> an anonymous pull token
        self.fetches = 0  # objects asked of upstream registries (the bench and tests read it)
        self.bytes = 0  # bytes received from them

    async def fetch(self, ref: ImageRef, kind: str, digest: str, out: BinaryIO, *, max_bytes: int,
                    progress: Progress | None = None) -> str:
        """Write the ``kind`` ("manifests" or "blobs") named ``digest`` of ``ref``'s repository to
        ``out``; its media type. UpstreamError unless its bytes hash to ``digest``. ``progress`` is told
        the declared length and each flushed write."""
        self.fetches += 1
        try:
            with trio.fail_after(self.total):
                await images.check_destination(images.api_host(ref), self.allowed)
                async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, read=self.idle),
                                             follow_redirects=False, transport=self.transport,
                                             verify=await outbound_tls.httpx_default()) as client:
                    return await self._fetch(client, ref, kind, digest, out, max_bytes, progress or _Silent())
        except images.RegistryError as exc:
            raise UpstreamError(exc.message) from None
        except trio.TooSlowError:
            raise UpstreamError(f"the registry {ref.registry} did not deliver {digest} within {self.total:g}s") from None
        except httpx.TimeoutException:
            raise UpstreamError(f"the registry {ref.registry} went quiet for {self.idle:g}s") from None
        except httpx.TransportError as exc:
            raise UpstreamError(f"the registry {ref.registry} cannot be reached ({type(exc).__name__})") from None

    async def _fetch(self, client: httpx.AsyncClient, ref: ImageRef, kind: str, digest: str, out: BinaryIO,
                     max_bytes: int, progress: Progress) -> str:
        scheme = "http" if ref.plain_http else "https"
        url = httpx.URL(f"{scheme}://{images.api_host(ref)}/v2/{ref.repository}/{kind}/{digest}")
        key = f"{ref.registry}/{ref.repository}"
        headers = {"Accept": images.MANIFEST_TYPES} if kind == "manifests" else {}
        asked_token, home = False, url.host
        for _ in range(MAX_REDIRECTS + 2):
            # the registry's token goes to the registry only, never to where it redirects
            auth = {"Authorization": f"Bearer {self._tokens[key]}"} if key in self._tokens and url.host == home else {}
            async with client.stream("GET", url, headers={**headers, **auth}) as r:
                if r.status_code == 401 and not asked_token:
                    challenge = images.bearer_challenge(r.headers.get("www-authenticate"))
                    if challenge is None:
                        raise UpstreamError(f"the registry {ref.registry} asks for credentials for {ref.repository}")
                    await r.aclose()
                    self._tokens[key] = await images.pull_token(client, ref, challenge, self.allowed, None)
                    asked_token = True
                    continue
                if r.status_code in (301, 302, 303, 307, 308):
                    url = await self._redirect(ref, url, r.headers.get("location"))
                    continue
                if r.status_code == 404:
                    raise UpstreamError(f"{digest} is not in {key}", status=404)
                if r.status_code != 200:
                    raise UpstreamError(f"the registry {ref.registry} answered {r.status_code} for {digest}")
                return await self._copy(r, digest, out, max_bytes, progress)
        raise UpstreamError(f"the registry {ref.registry} redirected {digest} too many times")

    async def _redirect(self, ref: ImageRef, url: httpx.URL, location: str | None) -> httpx.URL:
        if not location:
            raise UpstreamError(f"the registry {ref.registry} redirected without a location")
        target = url.join(location)
        if target.scheme != "https" and not (ref.plain_http and target.host == url.host):
            raise UpstreamError(f"the registry {ref.registry} redirected to a plain-HTTP address")
        await images.check_destination(target.netloc.decode(), self.allowed)
        return target

    async def _copy(self, r: httpx.Response, digest: str, out: BinaryIO, max_bytes: int, progress: Progress) -> str:
        raw = r.headers.get("content-length")
        declared = int(raw) if raw is not None and raw.isdigit() else None
        if declared is not None and declared > max_bytes:
            raise UpstreamError(f"{digest} is {declared} bytes, over the limit of {max_bytes}")
        progress.begin(declared)
        sha, size, pending = hashlib.sha256(), 0, bytearray()
        async for chunk in r.aiter_raw():
            size += len(chunk)
            self.bytes += len(chunk)
            if size > max_bytes or (declared is not None and size > declared):
                raise UpstreamError(f"{digest} is over the limit of {declared or max_bytes} bytes")
            sha.update(chunk)
            pending += chunk
            if len(pending) >= WRITE_CHUNK:
                await trio.to_thread.run_sync(_write, out, bytes(pending))
                pending.clear()
                progress.advance(size)
        await trio.to_thread.run_sync(_write, out, bytes(pending))
        progress.advance(size)
        if declared is not None and size != declared:
            raise UpstreamError(f"the registry ended {digest} after {size} of the {declared} bytes it declared")
        if "sha256:" + sha.hexdigest() != digest:
            raise UpstreamError(f"the registry served bytes for {digest} that hash to sha256:{sha.hexdigest()}")
        return r.headers.get("content-type", "application/octet-stream").split(";", 1)[0].strip()


def _write(out: BinaryIO, data: bytes) -> None:
    out.write(data)
    out.flush()  # readers following the file read it through their own descriptor
