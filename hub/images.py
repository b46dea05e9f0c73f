"""Image digests from registries: the pull side of the OCI distribution API, as much as pinning needs.

A configuration version names each container image by digest, so that what a device runs cannot
change under a version (DESIGN.md section 14). When a version is created, ``resolve`` asks the image's
registry for its manifest (``GET /v2/<repository>/manifests/<tag or digest>``), hashes the bytes it
received and returns that sha256: the digest is what the hub itself computed, never only what the
registry said. A registry that names another digest (``Docker-Content-Digest``), or serves a manifest
whose hash is not the digest asked for, is refused: something between the hub and the registry, or
the registry itself, is wrong, and a version must not be built on it.

Bounds, so that a hostile or broken registry costs a request a few seconds and a few MiB at most: each
request has ``timeout`` seconds in all (connect, headers and the whole body), a manifest is at most
``MAX_MANIFEST_BYTES`` (4 MiB, the limit the distribution spec lets registries impose), and redirects
are not followed. Anonymous pulls only: registries that ask for credentials answer 401 and the error
says so (docs/containers.md, "not yet").
"""

from __future__ import annotations

import hashlib

import httpx
import trio

from device_client.shared.imageref import DIGEST, ImageRef

MAX_MANIFEST_BYTES = 4 << 20
DEFAULT_TIMEOUT = 10.0
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))


class RegistryError(Exception):
    """The registry did not give a manifest the hub can pin. ``unreachable``: it could not be asked
    (connection, timeout, a 5xx), as opposed to an answer that is wrong or a refusal."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.unreachable = unreachable


def manifest_url(ref: ImageRef) -> str:
    scheme = "http" if ref.plain_http else "https"
    return f"{scheme}://{ref.registry}/v2/{ref.repository}/manifests/{ref.reference}"


async def resolve(ref: ImageRef, *, timeout: float = DEFAULT_TIMEOUT,
                  transport: httpx.AsyncBaseTransport | None = None) -> str:
    """The sha256 digest of ``ref``'s manifest, as the hub hashed it; RegistryError otherwise."""
    try:
        with trio.fail_after(timeout):
            return await _fetch_digest(ref, timeout, transport)
    except trio.TooSlowError:
        raise RegistryError(f"the registry {ref.registry} did not answer within {timeout:g}s",
                            unreachable=True) from None
    except httpx.TransportError as exc:
        raise RegistryError(f"the registry {ref.registry} cannot be reached ({type(exc).__name__})",
                            unreachable=True) from None


async def _fetch_digest(ref: ImageRef, timeout: float, transport: httpx.AsyncBaseTransport | None) -> str:
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), follow_redirects=False,
                                 transport=transport) as client:
        async with client.stream("GET", manifest_url(ref), headers={"Accept": MANIFEST_TYPES}) as r:
            if r.status_code == 401:
                raise RegistryError(f"the registry {ref.registry} asks for credentials for {ref.repository}; "
                                    "only anonymous pulls are supported so far")
            if r.status_code == 404:
                raise RegistryError(f"{ref} is not in the registry {ref.registry}")
            if r.status_code >= 500:
                raise RegistryError(f"the registry {ref.registry} answered {r.status_code}", unreachable=True)
            if r.status_code != 200:
                raise RegistryError(f"the registry {ref.registry} answered {r.status_code} for {ref}")
            declared = r.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > MAX_MANIFEST_BYTES:
                raise RegistryError(f"the manifest of {ref} is {int(declared)} bytes, over the limit of "
                                    f"{MAX_MANIFEST_BYTES}")
            sha, size = hashlib.sha256(), 0
            async for chunk in r.aiter_raw():
                size += len(chunk)
                if size > MAX_MANIFEST_BYTES:
                    raise RegistryError(f"the manifest of {ref} is over the limit of {MAX_MANIFEST_BYTES} bytes")
                sha.update(chunk)
            said = r.headers.get("docker-content-digest")
    digest = "sha256:" + sha.hexdigest()
    if ref.digest is not None and digest != ref.digest:
        raise RegistryError(f"the registry {ref.registry} served a manifest whose digest is {digest}, "
                            f"not the {ref.digest} asked for")
    if said is not None and said != digest:
        shown = said[:80] if DIGEST.match(said) else "a malformed digest"
        raise RegistryError(f"the registry {ref.registry} says the manifest of {ref} is {shown}, "
                            f"but its bytes hash to {digest}")
    return digest
