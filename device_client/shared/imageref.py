"""Container image references (``registry/repository:tag@sha256:…``), parsed the same way on both sides.

The hub resolves a reference to a digest when a version is created; the device pulls exactly that
digest. Both parse with this module, so a reference the hub accepted is one the device reads the same.
The grammar is the distribution project's (``reference/regexp.go``), narrowed: the only digest
algorithm is sha256 (what registries serve), and the registry is always explicit in what a version
stores, so that "docker.io" defaults never differ between a hub and an engine.

Plain HTTP is used only for a registry on the loopback interface (``localhost``, ``127.x``, ``[::1]``):
what a test, a local demo or a device's own pull-through cache runs; everything else is HTTPS.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DEFAULT_REGISTRY = "docker.io"
MAX_REFERENCE = 512
MAX_NAME = 255  # the distribution spec's limit on registry + repository

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                   r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class BadReference(ValueError):
    """Not an image reference this platform takes; the message says which part is wrong."""


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port], always explicit
    repository: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        out = f"{self.registry}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out

    def pinned(self, digest: str) -> ImageRef:
        """This image named by ``digest`` alone: what a version stores and a device pulls."""
        if not DIGEST.match(digest):
            raise BadReference(f"{digest[:80]!r} is not a sha256 digest")
        return ImageRef(self.registry, self.repository, None, digest)

    @property
    def reference(self) -> str:
        """What a manifest request names: the digest when there is one, else the tag (latest)."""
        return self.digest or self.tag or "latest"

    @property
    def plain_http(self) -> bool:
        return is_loopback(self.registry)


def host_of(registry: str) -> str:
    """The host of ``host[:port]``, an IPv6 address without its brackets."""
    if registry.startswith("["):
        return registry[1:registry.index("]")]
    return registry.rsplit(":", 1)[0]


def is_loopback(registry: str) -> bool:
    host = host_of(registry)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_registry(text: str) -> str | None:
    """``text`` when it is a registry as a reference names it (host[:port]), else None."""
    try:
        return text if parse(f"{text}/x/y:latest").registry == text else None
    except BadReference:
        return None


def parse(text: object) -> ImageRef:
    """``text`` as an ImageRef; BadReference (a ValueError) names what is wrong, never echoing more
    than a short prefix of hostile input."""
    if not isinstance(text, str):
        raise BadReference("an image reference must be a string")
    if not text:
        raise BadReference("an image reference must not be empty")
    if len(text) > MAX_REFERENCE:
        raise BadReference(f"an image reference is at most {MAX_REFERENCE} characters")
    if any(c in text for c in "\0\r\n\t ") or not text.isprintable():
        raise BadReference("an image reference must not contain spaces or control characters")
    name, digest = text, None
    if "@" in name:
        name, digest = name.split("@", 1)
        if not DIGEST.match(digest):
            raise BadReference("the digest must be sha256: and 64 lower-case hex digits")
    tag = None
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
        if not _TAG.match(tag):
            raise BadReference("the tag must be letters, digits, _ . - (at most 128, not starting with . or -)")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        registry, repository = first, rest
        if not _HOST.match(registry):
            raise BadReference("the registry must be a host name or address, with an optional port")
        port = registry.rsplit(":", 1)[1] if ":" in registry and not registry.endswith("]") else None
        if port is not None and not 1 <= int(port) <= 65535:
            raise BadReference("the registry's port must be from 1 to 65535")
    else:
        registry, repository = DEFAULT_REGISTRY, name if "/" in name else f"library/{name}"
    if not _REPOSITORY.match(repository):
        raise BadReference("the repository must be lower-case letters, digits and separators (. _ - /)")
    if len(registry) + 1 + len(repository) > MAX_NAME:
        raise BadReference(f"the image name is at most {MAX_NAME} characters")
    return ImageRef(registry, repository, tag, digest)


# ---- the hub's registry proxy (hub/registry/) ----
# The proxy serves every upstream registry under one host, so the upstream is the first component of
# the repository path: ``hub:8443/127.0.0.1__5000/app/web`` is ``127.0.0.1:5000/app/web``. A path
# component cannot hold ``:`` but may hold ``__``, which no host name contains: the mapping is one to
# one. IPv6 registries (``[::1]:5000``) have no such spelling and are not proxied.

def proxy_component(registry: str) -> str | None:
    """``registry`` (host[:port]) as the first path component of a proxied name; None if it has none."""
    if registry.startswith("[") or not _HOST.match(registry):
        return None
    component = registry.lower().replace(":", "__")
    return component if re.fullmatch(_COMPONENT, component) else None


def registry_of_component(component: str) -> str | None:
    """The inverse of ``proxy_component``; None for what it never produces."""
    if not re.fullmatch(_COMPONENT, component) or component.count("__") > 1:
        return None
    registry = component.replace("__", ":")
    return registry if proxy_component(registry) == component else None
