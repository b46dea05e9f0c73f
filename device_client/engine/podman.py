"""podman through its command line: every call an argument list, a timeout, and a small environment.

Why the CLI and not the REST socket: the socket needs a ``podman system service`` running beside the
agent (one more process to supervise and restart), while the CLI works on any device that has podman
installed. Each call costs a podman start (about 0.1 s here), paid per container at apply time only.

Configuration without touching the device's /etc: ``conf`` is a containers.conf the agent passes in
CONTAINERS_CONF (the sandboxes this was built in need ``cgroup_manager = "cgroupfs"``, ``runtime =
"runc"`` and ``default_ulimits = []``; docs/containers.md), and ``root``/``runroot`` give a private
image and container store (the tests use one each, so they share no state). Each container has its
own network namespace on podman's default bridge (netavark); its ``ports`` are published on the device
at the same numbers, and an HTTP health check goes to the container's own address.

The environment of a container goes through an env file (0600, removed right after ``create``), not
``-e NAME=value``, so that values are never in a process listing. Output that a container controls
(exec, logs) goes to an unnamed file and only its end is read (logtail.py), whatever it printed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from .. import logtail
from ..shared.imageref import is_loopback, parse
from ..state import write_json_atomic
from .base import ContainerInfo, Engine, EngineError, ImageInfo, Mirror, RunSpec

_PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_RUNTIME_DIR", "CONTAINERS_REGISTRIES_CONF")
CONTROL_TIMEOUT = 60.0  # create, start, rm, ps: podman's own work, no network


def _tree_size(path: Path) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass  # podman moved it into the store meanwhile
    return total


async def _kill(proc: trio.Process) -> None:
    proc.kill()


def _mirror_conf(mirror: Mirror, registry_insecure: bool) -> Path:
    """A registries.conf beside the auth file: ``mirror.location`` first for its registry, and podman
    tries the registry itself after the mirror. An exclusive mirror is the registry's location instead
    (podman's prefix remapping): podman asks nothing else. Either way the pulled image keeps the
    registry's name."""
    kind = "only" if mirror.exclusive else "mirror"
    path = mirror.authfile.with_name(f"registries-{kind}-{mirror.location.replace('/', '_').replace(':', '_')}.conf")
    if mirror.exclusive:
        path.write_text(
            "unqualified-search-registries = []\n\n[[registry]]\n"
            f"prefix = {json.dumps(mirror.registry)}\nlocation = {json.dumps(mirror.location)}\n"
            f"insecure = {str(mirror.insecure).lower()}\n")
        return path
    path.write_text(
        "unqualified-search-registries = []\n\n[[registry]]\n"
        f"prefix = {json.dumps(mirror.registry)}\nlocation = {json.dumps(mirror.registry)}\n"
        f"insecure = {str(registry_insecure).lower()}\n\n[[registry.mirror]]\n"
        f"location = {json.dumps(mirror.location)}\ninsecure = {str(mirror.insecure).lower()}\n")
    return path


def _merged_auth(files: list[Path]) -> Path:
    """One containers-auth.json holding the ``auths`` of ``files`` (written 0600 beside the first, then
    renamed into place): podman reads a single --authfile."""
    auths: dict = {}
    for f in files:
        auths.update(json.loads(f.read_text()).get("auths") or {})
    target = files[0].with_name("pull-auth.json")
    write_json_atomic(target, {"auths": auths}, mode=0o600)
    return target


class Podman(Engine):
    def __init__(self, *, binary: str = "podman", conf: Path | None = None, root: Path | None = None,
                 runroot: Path | None = None, storage_driver: str | None = None,
                 pull_timeout: float = 600.0, scratch: Path | None = None, progress_interval: float = 1.0) -> None:
        self.binary = binary
        self.progress_interval = progress_interval  # seconds between pull progress reports
        self.conf = conf
        self.pull_timeout = pull_timeout
        self.scratch = scratch  # where env files live for the instant of a create; default: the system's
        self.global_args: list[str] = []  # before the subcommand: its storage (root, runroot, driver)
        if root is not None:
            self.global_args += ["--root", str(root)]
        if runroot is not None:
            self.global_args += ["--runroot", str(runroot)]
        if storage_driver is not None:
            self.global_args += ["--storage-driver", storage_driver]

    def environment(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        if self.conf is not None:
            env["CONTAINERS_CONF"] = str(self.conf)
        return env

    async def _run(self, args: list[str], *, timeout: float = CONTROL_TIMEOUT, what: str,
                   env: dict[str, str] | None = None) -> str:
        """podman ``args``; its stdout, or EngineError with the first line of what podman said."""
        with trio.move_on_after(timeout) as scope:
            try:
                result = await trio.run_process(
                    [self.binary, *self.global_args, *args], check=False, capture_stdout=True, capture_stderr=True,
                    stdin=subprocess.DEVNULL, env={**self.environment(), **(env or {})}, deliver_cancel=_kill)
            except OSError as exc:
                raise EngineError(f"{what}: podman cannot run ({exc.strerror or exc})") from None
        if scope.cancelled_caught:
            raise EngineError(f"{what}: podman did not finish within {timeout:g}s")
        if result.returncode != 0:
            said = [line for line in result.stderr.decode(errors="replace").splitlines() if line.strip()]
            reason = logtail.last_line(said[-1]) if said else None
            raise EngineError(f"{what}: {reason or f'podman exited with code {result.returncode}'}")
        return result.stdout.decode(errors="replace")

    async def version(self) -> tuple[str, str]:
        out = await self._run(["version", "--format", "{{.Client.Version}}"], what="podman version")
        return "podman", out.strip()[:64]

    async def runtime(self) -> str:
        """The OCI runtime podman uses (``podman info`` reads the store and the runtime: it fails as a
        pull or create would on a device podman cannot work on)."""
        out = await self._run(["info", "--format", "{{.Host.OCIRuntime.Version}}"],
                              what="podman info")
        first = out.strip().splitlines()[0] if out.strip() else ""  # the version is several lines
        return " ".join(first.split())[:128] or "unknown"

    async def pull(self, image: str, mirror: Mirror | None = None, *, auth_file: Path | None = None,
                   progress: Callable[[int], Awaitable[Any]] | None = None) -> int:
        ref = parse(image)
        if ref.digest is None:
            raise EngineError(f"pull {image}: a device pulls images by digest only")
        args = ["pull", "--quiet"] + (["--tls-verify=false"] if is_loopback(ref.registry) else [])
        env: dict[str, str] = {}
        if mirror is not None:
            conf = await trio.to_thread.run_sync(_mirror_conf, mirror, is_loopback(ref.registry))
            env["CONTAINERS_REGISTRIES_CONF"] = str(conf)
        # one --authfile for podman: the mirror's (the device token for the hub's proxy) and the
        # registry logins together, in a 0600 file beside them; a path, so no credential reaches argv
        logins = [f for f in (mirror.authfile if mirror is not None else None, auth_file) if f is not None]
        if logins:
            merged = logins[0] if len(logins) == 1 else await trio.to_thread.run_sync(_merged_auth, logins)
            args += ["--authfile", str(merged)]
        if progress is None:
            await self._run(args + [image], timeout=self.pull_timeout, what=f"pull {image}", env=env)
        else:
            await self._metered_pull(args + [image], progress, what=f"pull {image}", env=env)
        out = await self._run(["image", "inspect", "--format", "json", image], what=f"inspect {image}")
        try:
            found = json.loads(out)[0]
        except (ValueError, IndexError, KeyError):
            raise EngineError(f"inspect {image}: podman's answer was not understood") from None
        digests = {found.get("Digest")} | {d.rsplit("@", 1)[-1] for d in found.get("RepoDigests") or []}
        if ref.digest not in digests:
            raise EngineError(f"pull {image}: the engine holds another digest ({found.get('Digest')})")
        return int(found.get("Size") or 0)

    async def _metered_pull(self, args: list[str], progress: Callable[[int], Awaitable[Any]], *, what: str,
                            env: dict[str, str] | None = None) -> None:
        """The pull with its own TMPDIR, where podman writes each blob as it arrives (before it goes
        into the store): the directory's size is the bytes received so far. The CLI prints no byte
        counts without a terminal; this needs no REST service beside the agent."""
        landing = Path(tempfile.mkdtemp(dir=self.scratch, prefix=".pull-"))
        try:
            async with trio.open_nursery() as nursery:
                async def meter() -> None:
                    said = 0
                    while True:
                        await trio.sleep(self.progress_interval)
                        size = await trio.to_thread.run_sync(_tree_size, landing)
                        if size > said:
                            said = size
                            await progress(size)

                nursery.start_soon(meter)
                failure = None
                try:
                    await self._run(args, timeout=self.pull_timeout, what=what,
                                    env={**(env or {}), "TMPDIR": str(landing)})
                except EngineError as exc:
                    failure = exc  # raised below as itself, not inside the nursery's exception group
                nursery.cancel_scope.cancel()
        finally:
            await trio.to_thread.run_sync(lambda: shutil.rmtree(landing, ignore_errors=True))
        if failure is not None:
            raise failure

    async def create(self, spec: RunSpec) -> None:
        args = ["create", "--name", spec.name, "--restart", spec.restart]
        for port in spec.ports:
            args += ["--publish", f"{port}:{port}"]
        for key, value in spec.labels.items():
            args += ["--label", f"{key}={value}"]
        if spec.memory_bytes is not None:
            args += ["--memory", str(spec.memory_bytes)]
        if spec.cpus is not None:
            args += ["--cpus", f"{spec.cpus:g}"]
        for m in spec.mounts:
            if "," in m.source or "," in m.target:
                raise EngineError(f"create {spec.name}: a mount path must not contain a comma")
            args += ["--mount", f"type=bind,source={m.source},destination={m.target}" + (",ro=true" if m.read_only else "")]
        with tempfile.NamedTemporaryFile("w", dir=self.scratch, prefix=".env-", encoding="utf-8") as env_file:
            env_file.write("".join(f"{k}={v}\n" for k, v in spec.env.items()))
            env_file.flush()
            args += ["--env-file", env_file.name, spec.image, *(spec.command or ())]
            await self._run(args, what=f"create {spec.name}")

    async def start(self, name: str) -> None:
        await self._run(["start", name], what=f"start {name}")

    async def stop(self, name: str, grace: float) -> None:
        await self._run(["stop", "--ignore", "-t", str(max(0, round(grace))), name],
                        timeout=grace + CONTROL_TIMEOUT, what=f"stop {name}")

    async def remove(self, name: str) -> None:
        await self._run(["rm", "--force", "--ignore", "-t", "0", name], what=f"remove {name}")

    async def containers(self, label: str) -> list[ContainerInfo]:
        out = await self._run(["ps", "--all", "--filter", f"label={label}", "--format", "json"],
                              what="list containers")
        found: list[dict[str, Any]] = json.loads(out or "[]") or []
        return [ContainerInfo(name=c["Names"][0], labels=c.get("Labels") or {}, running=c.get("State") == "running",
                              exit_code=None if c.get("State") == "running" else c.get("ExitCode"),
                              image=c.get("Image", "")) for c in found]

    async def exec(self, name: str, argv: list[str], timeout: float) -> tuple[int | None, str]:
        return await self._tail_of(["exec", name, *argv], timeout)

    async def logs(self, name: str, lines: int) -> str:
        code, out = await self._tail_of(["logs", "--tail", str(lines), name], CONTROL_TIMEOUT)
        return out if code == 0 else ""

    async def _tail_of(self, args: list[str], timeout: float) -> tuple[int | None, str]:
        with tempfile.TemporaryFile(dir=self.scratch) as out:
            with trio.move_on_after(timeout) as scope:
                try:
                    result = await trio.run_process(
                        [self.binary, *self.global_args, *args], check=False, stdin=subprocess.DEVNULL, stdout=out,
                        stderr=subprocess.STDOUT, env=self.environment(), deliver_cancel=_kill)
                except OSError as exc:
                    raise EngineError(f"podman cannot run ({exc.strerror or exc})") from None
            tail = logtail.visible(await trio.to_thread.run_sync(logtail.read_tail, out))
        return (None if scope.cancelled_caught else result.returncode), tail

    async def images(self) -> list[ImageInfo]:
        found = json.loads(await self._run(["images", "--format", "json"], what="list images") or "[]") or []
        return [ImageInfo(id=i["Id"], digests=tuple({i.get("Digest") or ""} - {""}), size=int(i.get("Size") or 0),
                          created=float(i.get("Created") or 0)) for i in found]

    async def address(self, name: str) -> str:
        out = await self._run(["inspect", "--format", "{{.NetworkSettings.IPAddress}}", name],
                              what=f"inspect {name}")
        if not out.strip():
            raise EngineError(f"inspect {name}: the container has no address (is it running?)")
        return out.strip()

    async def remove_image(self, image_id: str) -> None:
        await self._run(["rmi", "--ignore", image_id], what=f"remove image {image_id[:12]}")
