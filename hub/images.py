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
are not followed. Authentication: a registry that answers 401 with a Bearer challenge (Docker Hub,
GHCR, most public registries) is asked again with a token from the service it names, got with the
organisation's credential for that registry (basic auth on the token request) or anonymously
without one; a registry that answers with a Basic challenge is asked again with the credential. The
password goes only into those Authorization headers: never into an error, a log line or a URL.

Where the hub may connect (``check_destination``): an editor names the registry, so without a rule
the hub could be made to send requests into its own network (its PostgreSQL's host, a cloud metadata
address) and read the answers' status codes back in errors. A registry listed in the hub's
``registries`` setting (FLEETHUB_REGISTRIES) is asked wherever it is; any other must resolve to public
addresses only. The address checked is the address connected to: every request goes through
``PinnedTransport``, which resolves the name once, checks every address it got, and connects to the
first of them (TLS still verifies the certificate for the name). A name whose DNS answer changes
between the check and the connection (rebinding) therefore cannot move the request into the hub's
network.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
import socket
import ssl
from collections.abc import Collection
from typing import Any

import httpx
import trio

from device_client.shared.imageref import DEFAULT_REGISTRY, DIGEST, ImageRef, host_of
from device_client.shared import outbound_tls

MAX_MANIFEST_BYTES = 4 << 20
MAX_TOKEN_BYTES = 64 << 10
DOCKER_HUB_API = "registry-1.docker.io"
_PARAM = re.compile(r'([A-Za-z]+)="([^"]*)"')
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


async def check_destination(registry: str, allowed: Collection[str]) -> str | None:
    """RegistryError unless ``registry`` (host[:port]) is in ``allowed`` or has public addresses only.
    The address to connect to (the first public one found), or None for a listed registry (asked as
    named: the operator vouched for it)."""
    if registry in allowed:
        return None
    host = host_of(registry)
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None:
        found = [str(literal)]
    else:
        try:
            with trio.fail_after(DEFAULT_TIMEOUT):
                answers = await trio.socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, trio.TooSlowError):
            raise RegistryError(f"the registry {registry} cannot be found (DNS)", unreachable=True) from None
        found = [address[0].split("%", 1)[0] for *_, address in answers]
    for address in found:
        if not ipaddress.ip_address(address).is_global:
            raise RegistryError(f"the registry {registry} has a private or local address; the hub asks such "
                                "a registry only when its operator lists it (FLEETHUB_REGISTRIES)")
    if not found:
        raise RegistryError(f"the registry {registry} cannot be found (DNS)", unreachable=True)
    return found[0]


class PinnedTransport(httpx.AsyncHTTPTransport):
    """Connects each request to the address ``check_destination`` approved for its host, not to what a
    second lookup would say. The URL's host becomes that address; the Host header and TLS's server name
    (so the certificate check) stay the registry's name."""

    def __init__(self, allowed: Collection[str], tls: ssl.SSLContext) -> None:
        super().__init__(verify=tls)  # outbound_tls.httpx_default(): made once, off the loop
        self.allowed = allowed

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        address = await check_destination(request.url.netloc.decode(), self.allowed)
        if address is not None:
            request.url = request.url.copy_with(host=address)
            request.extensions = {**request.extensions, "sni_hostname": host}
        return await super().handle_async_request(request)


def api_host(ref: ImageRef) -> str:
    """Where the registry's API answers: Docker Hub's is not at docker.io."""
    return DOCKER_HUB_API if ref.registry == DEFAULT_REGISTRY else ref.registry


def manifest_url(ref: ImageRef) -> str:
    scheme = "http" if ref.plain_http else "https"
    return f"{scheme}://{api_host(ref)}/v2/{ref.repository}/manifests/{ref.reference}"


async def resolve(ref: ImageRef, *, timeout: float = DEFAULT_TIMEOUT, allowed: Collection[str] | None = None,
                  transport: httpx.AsyncBaseTransport | None = None,
                  credentials: tuple[str, str] | None = None) -> str:
    """The sha256 digest of ``ref``'s manifest, as the hub hashed it; RegistryError otherwise.
    ``allowed`` (when not None): ``check_destination`` for the registry and its token service.
    ``credentials``: (username, password) for the registry, used only when it asks for them."""
    try:
        with trio.fail_after(timeout):
            if allowed is not None:
                await check_destination(api_host(ref), allowed)
            return await _fetch_digest(ref, timeout, allowed, transport, credentials)
    except trio.TooSlowError:
        raise RegistryError(f"the registry {ref.registry} did not answer within {timeout:g}s",
                            unreachable=True) from None
    except httpx.TransportError as exc:
        raise RegistryError(f"the registry {ref.registry} cannot be reached ({type(exc).__name__})",
                            unreachable=True) from None


def bearer_challenge(header: str | None) -> dict[str, str] | None:
    """The parameters of a ``WWW-Authenticate: Bearer realm="…",service="…",scope="…"`` header."""
    if not header or header[:7].lower() != "bearer ":
        return None
    params = dict(_PARAM.findall(header[7:]))
    return params if "realm" in params else None


def basic_auth(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def _refused(ref: ImageRef, credentials: tuple[str, str] | None, said: str) -> RegistryError:
    if credentials is None:
        return RegistryError(f"the registry {ref.registry} asks for credentials for {ref.repository} ({said}); "
                             "give the organisation's: POST /v1/registry-credentials")
    return RegistryError(f"the registry {ref.registry} refused the organisation's credential (user "
                         f"{credentials[0]}) for {ref.repository} ({said})")


async def pull_token(client: httpx.AsyncClient, ref: ImageRef, challenge: dict[str, str],
                     allowed: Collection[str] | None, credentials: tuple[str, str] | None) -> str:
    """A pull token (the distribution token protocol), with the credential when there is one."""
    realm = httpx.URL(challenge["realm"])
    if realm.scheme != "https" and not (realm.scheme == "http" and ref.plain_http):
        raise RegistryError(f"the registry {ref.registry} names a token service that is not HTTPS")
    if allowed is not None:
        await check_destination(realm.netloc.decode(), allowed)
    params = {"scope": challenge.get("scope") or f"repository:{ref.repository}:pull"}
    if "service" in challenge:
        params["service"] = challenge["service"]
    auth = httpx.BasicAuth(*credentials) if credentials is not None else None
    async with client.stream("GET", realm, params=params, auth=auth) as r:
        if r.status_code != 200:
            raise _refused(ref, credentials, f"its token service answered {r.status_code}")
        body = b""
        async for chunk in r.aiter_raw():
            body += chunk
            if len(body) > MAX_TOKEN_BYTES:
                raise RegistryError(f"the token service of {ref.registry} answered more than {MAX_TOKEN_BYTES} bytes")
    try:
        answer = json.loads(body)
        token = answer.get("token") or answer.get("access_token")
    except (ValueError, AttributeError):
        token = None
    if not isinstance(token, str) or not token or not token.isprintable():
        raise RegistryError(f"the token service of {ref.registry} gave no token")
    return token


async def _fetch_digest(ref: ImageRef, timeout: float, allowed: Collection[str] | None,
                        transport: httpx.AsyncBaseTransport | None,
                        credentials: tuple[str, str] | None = None) -> str:
    headers = {"Accept": MANIFEST_TYPES}
    tls = await outbound_tls.httpx_default()
    if transport is None and allowed is not None:
        transport = PinnedTransport(allowed, tls)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), follow_redirects=False,
                                 transport=transport, verify=tls) as client:
        for _ in range(2):  # a second time only with a token or the credential
            async with client.stream("GET", manifest_url(ref), headers=headers) as r:
                if r.status_code == 401:
                    said = r.headers.get("www-authenticate") or ""
                    challenge = bearer_challenge(said)
                    if "Authorization" not in headers and challenge is not None:
                        await r.aclose()
                        token = await pull_token(client, ref, challenge, allowed, credentials)
                        headers["Authorization"] = f"Bearer {token}"
                        continue
                    if "Authorization" not in headers and credentials is not None and said[:6].lower() == "basic ":
                        await r.aclose()
                        headers["Authorization"] = basic_auth(*credentials)
                        continue
                    raise _refused(ref, credentials, "it answered 401")
                sha, said = await _read_manifest(ref, r)
                break
    digest = "sha256:" + sha.hexdigest()
    if ref.digest is not None and digest != ref.digest:
        raise RegistryError(f"the registry {ref.registry} served a manifest whose digest is {digest}, "
                            f"not the {ref.digest} asked for")
    if said is not None and said != digest:
        shown = said[:80] if DIGEST.match(said) else "a malformed digest"
        raise RegistryError(f"the registry {ref.registry} says the manifest of {ref} is {shown}, "
                            f"but its bytes hash to {digest}")
    return digest


async def _read_manifest(ref: ImageRef, r: httpx.Response) -> tuple[Any, str | None]:
    """(the sha256 of the body, the digest the registry claims); the body at most MAX_MANIFEST_BYTES."""
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
    return sha, r.headers.get("docker-content-digest")
