"""The engine interface: what the agent asks of a container engine, and nothing more.

The verbs are DESIGN.md section 14's (pull, create, start, health, stop, remove, prune), each async and
each bounded by the engine (a pull by its timeout, a stop by its grace). Containers are found again by
their labels, never by a list the agent keeps: after a power loss the engine's own state is the truth
about what exists, and the agent's state file only says which version should run.

Errors: every failure is an ``EngineError`` whose message is fit for an operator (it ends up in a
rejected version's ``error``); it never carries the environment a container was given, which may
hold secrets.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

MAX_HTTP_STATUS_LINE = 1024


class EngineError(Exception):
    """The engine could not do what was asked; the message says what, briefly."""


@dataclass(frozen=True)
class Mount:
    source: str  # a path on the device
    target: str  # where the container sees it
    read_only: bool = False


@dataclass(frozen=True)
class RunSpec:
    """One container as an engine creates it."""

    name: str  # the engine's container name, unique on the device
    image: str  # registry/repository@sha256:…
    command: tuple[str, ...] | None = None
    env: dict[str, str] = field(default_factory=dict, hash=False)
    mounts: tuple[Mount, ...] = ()
    ports: tuple[int, ...] = ()  # published on the device at the same number
    memory_bytes: int | None = None
    cpus: float | None = None
    restart: str = "always"  # always, on-failure, no
    labels: dict[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Mirror:
    """Where a pull goes instead of the image's registry (device_client/pullroute.py)."""

    registry: str  # the image's own registry, host[:port]
    location: str  # host[:port]/path the mirror serves that registry's repositories under
    authfile: Path  # the credentials for ``location`` (containers-auth.json), 0600 in the agent's data dir
    insecure: bool  # plain HTTP: only for a mirror on loopback
    # the only way to the registry: the engine must not try the registry itself when the mirror fails
    exclusive: bool = False


@dataclass(frozen=True)
class ContainerInfo:
    name: str
    labels: dict[str, str]
    running: bool
    exit_code: int | None
    image: str


@dataclass(frozen=True)
class ImageInfo:
    id: str
    digests: tuple[str, ...]  # sha256:… the image is known by
    size: int  # bytes
    created: float  # seconds since the epoch; oldest first is pruned first


class Engine(ABC):
    """A container engine. Names are the agent's (RunSpec.name); labels find them again."""

    @abstractmethod
    async def version(self) -> tuple[str, str]:
        """(the engine's name, its version): what the hello's capabilities.containerEngine says."""

    @abstractmethod
    async def pull(self, image: str, mirror: Mirror | None = None, *, auth_file: Path | None = None,
                   progress: Callable[[int], Awaitable[Any]] | None = None) -> int:
        """Fetch ``image`` (pinned by digest) unless present, and check that the engine holds exactly
        that digest; the image's size in bytes. With ``mirror``: through it (the hub's registry proxy),
        the image still known by its own name. ``auth_file``: registry credentials in the
        containers-auth.json format ({"auths": {registry: {"auth": base64 "user:password"}}}).
        ``progress(bytes received so far)``: called while the pull runs, about once a second, when
        the byte count moved (an engine that cannot tell never calls it)."""

    @abstractmethod
    async def create(self, spec: RunSpec) -> None:
        """Create (not start) a container; an existing one of the same name is an error."""

    @abstractmethod
    async def start(self, name: str) -> None: ...

    @abstractmethod
    async def stop(self, name: str, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; a stopped container is no error."""

    @abstractmethod
    async def remove(self, name: str) -> None:
        """Remove the container, stopping it at once if it runs; a missing one is no error."""

    @abstractmethod
    async def containers(self, label: str) -> list[ContainerInfo]:
        """Every container, running or not, with the label ``label`` ("key", or "key=value")."""

    @abstractmethod
    async def exec(self, name: str, argv: list[str], timeout: float) -> tuple[int | None, str]:
        """Run ``argv`` in the container: (exit code, or None when it did not end in ``timeout``;
        the end of its output)."""

    @abstractmethod
    async def logs(self, name: str, lines: int) -> str:
        """The container's last ``lines`` lines of output ('' when there is none)."""

    @abstractmethod
    async def images(self) -> list[ImageInfo]: ...

    @abstractmethod
    async def address(self, name: str) -> str:
        """The running container's own IP address, where its ports answer."""

    @abstractmethod
    async def remove_image(self, image_id: str) -> None: ...

    async def probe_http(self, name: str, port: int, path: str, timeout: float) -> tuple[bool, str]:
        """(the answer was 2xx or 3xx, what happened). The GET goes to the container's own address,
        so it checks the container and not whatever else may listen on a published port; the fake
        engine answers from its own table instead."""
        try:
            with trio.fail_after(timeout):
                stream = await trio.open_tcp_stream(await self.address(name), port)
                async with stream:
                    await stream.send_all(f"GET {path} HTTP/1.0\r\nHost: localhost:{port}\r\n"
                                          "User-Agent: fleethub-agent\r\nConnection: close\r\n\r\n".encode())
                    head = b""
                    while b"\r\n" not in head and len(head) < MAX_HTTP_STATUS_LINE:
                        chunk = await stream.receive_some(MAX_HTTP_STATUS_LINE)
                        if not chunk:
                            break
                        head += chunk
        except trio.TooSlowError:
            return False, f"GET :{port}{path} did not answer within {timeout:g}s"
        except OSError as exc:
            return False, f"GET :{port}{path}: {exc.strerror or exc}"
        except EngineError as exc:
            return False, str(exc)
        parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            return False, f"GET :{port}{path} did not answer HTTP"
        status = int(parts[1])
        return 200 <= status < 400, f"GET :{port}{path} answered {status}"
