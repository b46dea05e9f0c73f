"""``spec.containers[]`` of a configuration version: what the hub accepts, and the pinning of images.

Each container (docs/containers.md has the operator's view)::

    {"name": "web", "image": "registry.example:5000/app/web:1.4",
     "command": [argv...], "env": {NAME: value},
     "ports": [{"port": 8080}],                       # published on the device at the same number
     "volumes": [{"name": "data", "mountPath": "/data", "readOnly": false}],
     "resources": {"memoryMiB": 256, "cpus": 0.5},
     "restartPolicy": "always" | "on-failure" | "no",
     "healthCheck": {"command": [argv...]} | {"http": {"port": 8080, "path": "/healthz"}},
                    plus "timeoutSeconds" (default 10) and "graceSeconds" (default 1)},
     "kind": "service" | "job"}                       # a job runs to completion: its exit code is its check

``pin_images`` replaces each ``image`` by ``registry/repository@sha256:…`` as the registry serves it
now (hub/images.py), and keeps what the operator wrote in ``imageSource``; a spec sent back with its
pinned images (a copy of an old version) pins to the same digests. The device validates the same
shape again (device_client/containers.py) and never trusts the hub for it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, Literal

import trio
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from device_client.shared import imageref
from hub.errors import BadRequest, FleethubError
from hub.images import DEFAULT_TIMEOUT, RegistryError, resolve

MAX_CONTAINERS = 16
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")  # becomes part of an engine's container name
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_VOLUME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a directory under the device's volumes dir
_MOUNT = re.compile(r"^/(?:[A-Za-z0-9_.@+-]+/?)*$")


class Port(BaseModel):
    model_config = ConfigDict(extra="allow")
    port: int = Field(..., ge=1, le=65535)

    @field_validator("port", mode="before")
    @classmethod
    def _numeric_string(cls, value: Any) -> Any:
        # Backwards compatibility (spec): "8080" is accepted and stored as 8080; "80a" and 8080.5 are not.
        if isinstance(value, str) and value.strip().isdigit():
            return int(value.strip())
        if isinstance(value, bool) or (not isinstance(value, int) and not isinstance(value, str)):
            raise ValueError("port must be an integer from 1 to 65535")
        return value


def _argv(value: list[str]) -> list[str]:
    if not value or not value[0]:
        raise ValueError("must be a non-empty list of strings, the first one non-empty")
    if any(len(a) > 4096 for a in value):
        raise ValueError("each argument is at most 4096 characters")
    return value


class HttpCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: int = Field(..., ge=1, le=65535)
    path: str = Field("/", max_length=1024, pattern=r"^/[\x21-\x7e]*$")


class ContainerHealth(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: list[str] | None = Field(None, max_length=256)
    http: HttpCheck | None = None
    timeoutSeconds: float = Field(10, gt=0, le=600)
    graceSeconds: float = Field(1, ge=0, le=60)

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        return value if value is None else _argv(value)

    @model_validator(mode="after")
    def _one_kind(self) -> ContainerHealth:
        if self.command is not None and self.http is not None:
            raise ValueError("a health check is a command or http, not both")
        return self


class Volume(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=_VOLUME.pattern)
    mountPath: str = Field(..., max_length=1024, pattern=_MOUNT.pattern)
    readOnly: bool = False

    @field_validator("mountPath")
    @classmethod
    def _canonical(cls, value: str) -> str:
        parts = value.rstrip("/").split("/")[1:]
        if not parts or any(p in ("", ".", "..") for p in parts):
            raise ValueError("must be an absolute path below /, without . or .. segments")
        return "/" + "/".join(parts)


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memoryMiB: int | None = Field(None, ge=6, le=1 << 20)  # runc refuses less than 6 MiB
    cpus: float | None = Field(None, ge=0.01, le=1024)


class Container(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=_NAME.pattern)
    image: str = Field(..., min_length=1, max_length=imageref.MAX_REFERENCE)
    imageSource: str | None = Field(None, max_length=imageref.MAX_REFERENCE,
                                    description="set by the hub: the reference as the operator wrote it")
    command: list[str] | None = Field(None, max_length=256)
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    ports: list[Port] = Field(default_factory=list, max_length=64)
    volumes: list[Volume] = Field(default_factory=list, max_length=32)
    resources: Resources = Field(default_factory=Resources)
    restartPolicy: Literal["always", "on-failure", "no"] = "always"
    healthCheck: ContainerHealth = Field(default_factory=ContainerHealth)
    kind: Literal["service", "job"] = Field(
        "service", description="service: runs on, healthy while it runs and passes its check; job: runs to "
                               "completion once per apply of the version, its exit code the verdict (0 within "
                               "healthCheck.timeoutSeconds is healthy); no ports, no check of its own, never restarted")

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        return value if value is None else _argv(value)

    @field_validator("image")
    @classmethod
    def _reference(cls, value: str) -> str:
        imageref.parse(value)  # BadReference is a ValueError: pydantic names the field
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, v in value.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name[:40]!r} is not a variable name (letters, digits, _)")
            if len(v) > 32768:
                raise ValueError(f"{name} is longer than 32768 characters")
        return value

    @model_validator(mode="after")
    def _distinct_mounts(self) -> Container:
        paths = [v.mountPath for v in self.volumes]
        if len(set(paths)) != len(paths):
            raise ValueError("two volumes are mounted at the same path")
        return self

    @model_validator(mode="after")
    def _job(self) -> Container:
        # a job's exit code is its health: a restart would run it again, a port or a check would judge
        # something that is meant to end
        if self.kind != "job":
            return self
        if "restartPolicy" in self.model_fields_set and self.restartPolicy != "no":
            raise ValueError("a job is never restarted: its restartPolicy is \"no\"")
        if self.ports:
            raise ValueError("a job publishes no ports")
        if self.healthCheck.command is not None or self.healthCheck.http is not None:
            raise ValueError("a job's exit code is its health check: no command or http check")
        self.restartPolicy = "no"
        return self


def check_containers(containers: list[Container]) -> None:
    """What no single container can see: names and ports unique among the version's containers."""
    names = [c.name for c in containers]
    if len(set(names)) != len(names):
        raise ValueError("two containers have the same name")
    ports = [p.port for c in containers for p in c.ports]
    if len(set(ports)) != len(ports):
        raise ValueError("two containers publish the same port (a port of the device is published once)")


async def pin_images(containers: list[dict[str, Any]], *, allowed: Collection[str] = (),
                     timeout: float = DEFAULT_TIMEOUT,
                     credentials: Mapping[str, tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """``containers`` (validated) with each image named by digest; BadRequest or a 502 otherwise.
    The registries are asked concurrently, each bounded by ``timeout``; ``allowed``: the registries
    that may have private addresses (hub/images.py, ``check_destination``); ``credentials``: registry ->
    (username, password), the organisation's (hub/api/registry_credentials.py)."""
    pinned: list[dict[str, Any]] = [dict(c) for c in containers]
    failures: list[tuple[int, RegistryError]] = []

    async def one(i: int) -> None:
        source = pinned[i].get("imageSource") if imageref.parse(pinned[i]["image"]).digest else None
        ref = imageref.parse(pinned[i]["image"])
        try:
            digest = await resolve(ref, timeout=timeout, allowed=allowed,
                                   credentials=(credentials or {}).get(ref.registry))
        except RegistryError as exc:
            failures.append((i, exc))
            return
        pinned[i]["image"] = str(ref.pinned(digest))
        pinned[i]["imageSource"] = source or str(ref)

    async with trio.open_nursery() as nursery:
        for i in range(len(pinned)):
            nursery.start_soon(one, i)
    if failures:
        i, exc = min(failures, key=lambda f: f[0])
        field = f"spec.containers.{i}.image"
        if exc.unreachable:
            raise FleethubError(f"{field}: {exc.message}", code="registry_unavailable", status=502)
        raise BadRequest(f"{field}: {exc.message}", code="image_unresolved")
    return pinned
