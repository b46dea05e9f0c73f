"""The proxy's HTTP side: ``GET|HEAD /v2/``, ``/v2/<name>/manifests/<digest>``, ``/v2/<name>/blobs/<digest>``.

``<name>`` is the upstream registry as one path component, then the repository
(device_client/shared/imageref.py, ``proxy_component``): ``127.0.0.1__5000/app/web``. Only digests are
served: a version pins every image by digest, and a tag would be a name whose meaning changes.
Errors are the distribution spec's JSON (``{"errors": [{"code", "message"}]}``), which podman shows.
``/v2/`` without credentials answers 401 with a Basic challenge: that is how podman learns to send the
auth file's credentials.

Blobs are served with ``Range`` (one range; podman resumes an interrupted layer with it). A blob asked
whole while the proxy fetches it is served as it arrives (hub/registry/cache.py ``Growing``); a range
of it waits for the whole. The bytes counted for billing are the ones handed to the connection,
counted as they go, so a transfer cut short bills what was carried.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re

import trio
from quart import Blueprint, Response, request
from quart_schema import hide

from device_client.shared.imageref import (
    DIGEST,
    BadReference,
    parse,
    registry_of_component,
)
from hub.api.common import services
from hub.auth.routes import public

from .cache import Cache, Growing
from .proxy import Puller, RegistryProxy
from .upstream import MAX_MANIFEST_BYTES, UpstreamError

log = logging.getLogger("fleethub.registry")

bp = Blueprint("registry", __name__)
READ_CHUNK = 256 << 10
RESPONSE_TIMEOUT = 1800.0  # a 10 GiB layer at 6 MB/s; Quart's default (60 s) would cut a big layer
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
API_HEADER = {"Docker-Distribution-API-Version": "registry/2.0"}


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def _answer(refused: _Refused) -> Response:
    body = {"errors": [{"code": refused.code, "message": refused.message}]}
    return Response(json.dumps(body), refused.status, {**API_HEADER, **refused.headers},
                    content_type="application/json")


def proxy_of(s) -> RegistryProxy:
    if getattr(s, "registry_proxy", None) is None:
        s.registry_proxy = RegistryProxy(s)
    return s.registry_proxy


def _token() -> str | None:
    scheme, _, value = (request.headers.get("Authorization") or "").partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    if scheme.lower() == "basic" and value:
        try:
            _, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password if sep and password else None
    return None


async def _puller(proxy: RegistryProxy) -> Puller:
    token = _token()
    found = await proxy.puller(token) if token else None
    if found is None:
        raise _Refused(401, "UNAUTHORIZED", "a device token is required (Basic, any user name, or Bearer)",
                       {"WWW-Authenticate": 'Basic realm="fleethub registry proxy"'})
    if not found.proxy_on:
        raise _Refused(403, "DENIED", "the registry proxy is off for this device's fleet")
    return found


@bp.route("/v2/", methods=["GET", "HEAD"])
@public
@hide  # the distribution API, not the hub's REST API: docs/containers.md
async def base():
    try:
        await _puller(proxy_of(services()))
    except _Refused as refused:
        return _answer(refused)
    return Response("{}", 200, API_HEADER, content_type="application/json")


@bp.route("/v2/<path:name>/manifests/<reference>", methods=["GET", "HEAD"])
@public
@hide
async def manifest(name: str, reference: str):
    return await _serve(name, "manifests", reference)


@bp.route("/v2/<path:name>/blobs/<reference>", methods=["GET", "HEAD"])
@public
@hide
async def blob(name: str, reference: str):
    return await _serve(name, "blobs", reference)


async def _serve(name: str, kind: str, reference: str) -> Response:
    proxy = proxy_of(services())
    try:
        puller = await _puller(proxy)
        ref = _reference(name, kind, reference)
        upstream_name = f"{ref.registry}/{ref.repository}"
        if not await proxy.may_pull(puller, upstream_name):
            raise _Refused(403, "DENIED", "no configuration version of this device's organisation names this repository")
        await proxy.ready()

        async def fetch(out, max_bytes: int, progress) -> str:
            return await proxy.upstream.fetch(ref, kind, reference, out, max_bytes=max_bytes, progress=progress)

        try:
            entry, handle = await proxy.cache.open(
                Cache.key(upstream_name, kind, reference), fetch,
                max_bytes=MAX_MANIFEST_BYTES if kind == "manifests" else proxy.cache.budget,
                stream=kind == "blobs" and not request.headers.get("Range"))
        except UpstreamError as exc:
            log.warning("registry proxy: %s %s/%s: %s", kind, upstream_name, reference, exc.message)
            unknown = "MANIFEST_UNKNOWN" if kind == "manifests" else "BLOB_UNKNOWN"
            raise _Refused(exc.status, unknown if exc.status == 404 else "UNAVAILABLE", exc.message) from None
        except OSError as exc:  # the hub's own disk (full, say): the device may try again later
            log.error("registry proxy: %s %s/%s cannot be cached: %s", kind, upstream_name, reference, exc)
            raise _Refused(503, "UNAVAILABLE", "the proxy cannot store this object now") from None
    except _Refused as refused:
        return _answer(refused)
    return _respond(proxy, puller, entry.size, entry.media_type, reference, handle)


def _reference(name: str, kind: str, reference: str):
    """The upstream image this request names; a name or digest that is not one is refused."""
    component, _, repository = name.partition("/")
    registry = registry_of_component(component)
    if registry is None or not repository:
        raise _Refused(404, "NAME_INVALID", "the name is not <registry>/<repository> as the proxy spells it")
    if not DIGEST.match(reference):
        unknown = "MANIFEST_UNKNOWN" if kind == "manifests" else "DIGEST_INVALID"
        raise _Refused(404, unknown, "the proxy serves sha256 digests only (versions pin every image)")
    try:
        return parse(f"{registry}/{repository}@{reference}")
    except BadReference as exc:
        raise _Refused(404, "NAME_INVALID", str(exc)) from None


def _span(size: int) -> tuple[int, int] | None:
    """(first, last) byte of the one range asked for; None for the whole; _Refused if unsatisfiable."""
    asked = request.headers.get("Range")
    if not asked:
        return None
    m = _RANGE.match(asked.strip())
    if m is None or m.group(1) == m.group(2) == "":
        return None  # a form we do not serve (several ranges): the whole, as RFC 9110 allows
    if m.group(1) == "":
        first, last = max(0, size - int(m.group(2))), size - 1
    else:
        first = int(m.group(1))
        last = min(size - 1, int(m.group(2))) if m.group(2) else size - 1
    if first >= size or first > last:
        raise _Refused(416, "RANGE_INVALID", f"the range is outside the {size} bytes",
                       {"Content-Range": f"bytes */{size}"})
    return first, last


def _respond(proxy: RegistryProxy, puller: Puller, size: int, media_type: str, digest: str, handle) -> Response:
    headers = {**API_HEADER, "Docker-Content-Digest": digest, "Accept-Ranges": "bytes", "ETag": f'"{digest}"'}
    try:
        span = _span(size)
    except _Refused as refused:
        handle.close()
        return _answer(refused)
    first, last = span if span is not None else (0, size - 1)
    length = last - first + 1 if size else 0
    if span is not None:
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    headers["Content-Length"] = str(length)
    if request.method == "HEAD":
        handle.close()
        response = Response(b"", 206 if span else 200, headers, content_type=media_type)
        response.headers["Content-Length"] = str(length)
        return response

    async def read(n: int) -> bytes:
        if isinstance(handle, Growing):
            return await handle.read(n)  # raises when the fetch fails: the transfer is cut short
        return await trio.to_thread.run_sync(handle.read, n)

    async def body():
        sent = 0
        try:
            with handle:
                if first:
                    await trio.to_thread.run_sync(handle.seek, first)
                left = length
                while left > 0:
                    chunk = await read(min(READ_CHUNK, left))
                    if not chunk:
                        break
                    left -= len(chunk)
                    yield chunk
                    sent += len(chunk)
        finally:
            proxy.carried(puller, sent)

    response = Response(body(), 206 if span else 200, headers, content_type=media_type)
    response.timeout = RESPONSE_TIMEOUT
    return response
