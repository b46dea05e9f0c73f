"""An engine in memory with podman's behaviour, for the simulated fleet and the scale bench.

It is documented as a fake (DESIGN.md section 14): nothing runs. What it keeps is what the agent can
observe of a real engine: which images are present and by which digest, which containers exist with
which labels, which run, what a health check answers. Faults are set per image digest, so a test or a
bench says "this version's image fails its health check" without a registry:

- ``fail_pull[digest] = "reason"``: the pull fails;
- ``unhealthy[digest] = "output"``: exec health checks exit 1 with that output, HTTP checks answer 500;
- ``exits[digest] = code``: the container stops right after it starts;
- ``unreachable``: registries a pull without a mirror cannot reach (a mirror reaches them);
- ``mirror_fails = "reason"``: every mirror fails; as podman does, the pull then goes on to the
  registry itself unless the mirror is exclusive.

``mirrors`` lists the mirror each pull was asked to use (None: the image's own registry);
``registry_asks`` counts the pulls that went to the registry itself.

``pull_seconds`` is how long a pull of an absent image takes on the trio clock (zero by default), so a
bench on a virtual clock sees the time a pull costs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ..shared.imageref import parse
from .base import ContainerInfo, Engine, EngineError, ImageInfo, Mirror, RunSpec


@dataclass
class _Container:
    spec: RunSpec
    running: bool = False
    exit_code: int | None = None


@dataclass
class FakeEngine(Engine):
    image_size: int = 8 << 20
    pull_seconds: float = 0.0
    exec_seconds: float = 0.0  # how long an exec takes to start: a loaded device's engine
    fail_pull: dict[str, str] = field(default_factory=dict)
    unhealthy: dict[str, str] = field(default_factory=dict)
    exits: dict[str, int] = field(default_factory=dict)
    unreachable: set[str] = field(default_factory=set)
    mirrors: list[Mirror | None] = field(default_factory=list)
    mirror_fails: str | None = None  # every mirror answers with this error
    registry_asks: int = 0  # pulls that went to the image's registry itself
    pulls: int = 0
    auth_registries: dict[str, list[str]] = field(default_factory=dict)  # digest -> registries of its pull's auth file
    _images: dict[str, ImageInfo] = field(default_factory=dict)
    _containers: dict[str, _Container] = field(default_factory=dict)

    @staticmethod
    def _digest(image: str) -> str:
        digest = parse(image).digest
        if digest is None:
            raise EngineError(f"pull {image}: a device pulls images by digest only")
        return digest

    async def version(self) -> tuple[str, str]:
        return "fake", "1"

    async def pull(self, image: str, mirror: Mirror | None = None, *, auth_file: Path | None = None,
                   progress: Callable[[int], Awaitable[Any]] | None = None) -> int:
        digest = self._digest(image)
        self.mirrors.append(mirror)
        if mirror is None:
            self.registry_asks += 1
        if mirror is None and parse(image).registry in self.unreachable:
            raise EngineError(f"pull {image}: the registry cannot be reached")
        if mirror is not None and self.mirror_fails:
            # a real engine goes on to the registry after a failed mirror, unless it is the only way
            if mirror.exclusive or parse(image).registry in self.unreachable:
                raise EngineError(f"pull {image}: the mirror {mirror.location} failed: {self.mirror_fails}")
            self.registry_asks += 1
        # what a real engine would have logged in with: the registries the auth file names
        self.auth_registries[digest] = sorted(json.loads(auth_file.read_text())["auths"]) if auth_file else []
        if digest in self.fail_pull:
            raise EngineError(f"pull {image}: {self.fail_pull[digest]}")
        if digest not in self._images:
            if progress is not None and self.pull_seconds > 0:
                await trio.sleep(self.pull_seconds / 2)
                await progress(self.image_size // 2)  # half way: what a real pull reports as it goes
                await trio.sleep(self.pull_seconds / 2)
            else:
                await trio.sleep(self.pull_seconds)
            self.pulls += 1
            self._images[digest] = ImageInfo(id=digest[7:], digests=(digest,), size=self.image_size,
                                             created=trio.current_time())
        return self._images[digest].size

    async def create(self, spec: RunSpec) -> None:
        if spec.name in self._containers:
            raise EngineError(f"create {spec.name}: the name is in use")
        if self._digest(spec.image) not in self._images:
            raise EngineError(f"create {spec.name}: no image {spec.image}")
        self._containers[spec.name] = _Container(spec)

    async def start(self, name: str) -> None:
        c = self._get(name, "start")
        code = self.exits.get(self._digest(c.spec.image))
        c.running, c.exit_code = code is None, code

    async def stop(self, name: str, grace: float) -> None:
        c = self._containers.get(name)
        if c is not None and c.running:
            c.running, c.exit_code = False, 143

    async def remove(self, name: str) -> None:
        self._containers.pop(name, None)

    async def containers(self, label: str) -> list[ContainerInfo]:
        key, _, value = label.partition("=")  # "key" or "key=value", as podman's label filter
        return [ContainerInfo(name, dict(c.spec.labels), c.running, c.exit_code, c.spec.image)
                for name, c in self._containers.items()
                if key in c.spec.labels and (not value or c.spec.labels[key] == value)]

    async def exec(self, name: str, argv: list[str], timeout: float) -> tuple[int | None, str]:
        c = self._get(name, "exec")
        if not c.running:
            raise EngineError(f"exec {name}: the container is not running")
        if self.exec_seconds:
            await trio.sleep(self.exec_seconds)
        said = self.unhealthy.get(self._digest(c.spec.image))
        return (1, said) if said is not None else (0, "")

    async def logs(self, name: str, lines: int) -> str:
        return ""

    async def images(self) -> list[ImageInfo]:
        return list(self._images.values())

    async def remove_image(self, image_id: str) -> None:
        in_use = {self._digest(c.spec.image)[7:] for c in self._containers.values()}
        if image_id in in_use:
            raise EngineError(f"remove image {image_id[:12]}: a container uses it")
        self._images = {d: i for d, i in self._images.items() if i.id != image_id}

    async def address(self, name: str) -> str:
        if not self._get(name, "inspect").running:
            raise EngineError(f"inspect {name}: the container has no address (is it running?)")
        return "192.0.2.1"  # TEST-NET-1: never routed

    async def probe_http(self, name: str, port: int, path: str, timeout: float) -> tuple[bool, str]:
        c = self._containers.get(name)
        if c is None or not c.running:
            return False, f"GET :{port}{path}: Connection refused"
        healthy = self._digest(c.spec.image) not in self.unhealthy
        return healthy, f"GET :{port}{path} answered {200 if healthy else 500}"

    def _get(self, name: str, what: str) -> _Container:
        c = self._containers.get(name)
        if c is None:
            raise EngineError(f"{what} {name}: no such container")
        return c
