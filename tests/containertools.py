"""Containers for tests: a registry of our own on loopback, a busybox image pushed to it, podman with a
private store.

No public registry is reachable from the test machines, so a test builds its image: a rootfs of the
static busybox (``busybox-static``: one binary, every applet a symlink) plus the files the test wants,
``podman import``-ed with a CMD and ``podman push``-ed into Debian's ``docker-registry`` listening on a
free 127.0.0.1 port. The image serves HTTP with busybox's httpd, so an HTTP health check can pass.

podman is configured without touching /etc: ``containers.conf`` in the test's tmp dir (cgroupfs,
runc, ``default_ulimits = []``: the sandbox's cgroup layout and rlimits need all three; docs/containers.md)
passed as CONTAINERS_CONF, and a private ``--root``/``--runroot`` per store, so tests share nothing.
A test marked ``needs_containers`` is skipped, with the reason, when any of the tools is missing.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from device_client.engine.podman import Podman
from tests.ports import free_port

BUSYBOX = "/bin/busybox"
APPLETS = ("sh", "httpd", "echo", "sleep", "cat", "ls", "true", "false", "wget", "test", "kill")
CONTAINERS_CONF = """[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
"""
REGISTRY_CONF = """version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""
# a web server in the foreground on $PORT (default 8080) serving /www
HTTPD_CMD = ["/bin/sh", "-c", 'exec /bin/httpd -f -p "${PORT:-8080}" -h /www']


def missing_tools() -> list[str]:
    missing = [tool for tool in ("podman", "docker-registry") if shutil.which(tool) is None]
    if shutil.which("runc") is None and not os.path.exists("/usr/sbin/runc"):
        missing.append("runc")
    if not os.path.exists(BUSYBOX):
        missing.append("busybox-static")
    return missing


#: a test (or ``pytestmark``) that runs podman or a registry: skipped, saying what is missing, without them
needs_containers = pytest.mark.skipif(bool(missing_tools()),
                                      reason=f"container tests need {', '.join(missing_tools())} (make system-deps)")


def require_tools() -> None:
    """For a helper's caller that forgot ``needs_containers``: skip rather than fail on a missing tool."""
    if missing_tools():
        pytest.skip(f"container tests need {', '.join(missing_tools())} (make system-deps)")


def write_conf(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return conf


def podman(store: Path, **options) -> Podman:
    """A podman engine with a store of its own under ``store``. podman refuses a runroot path over 50
    characters, longer than pytest's tmp paths: that one is a short directory in /tmp, which
    ``remove_everything`` removes."""
    require_tools()
    runroot = Path(tempfile.mkdtemp(prefix="fh-podman-", dir="/tmp"))
    return Podman(conf=write_conf(store), root=store / "root", runroot=runroot, storage_driver="vfs",
                  scratch=store, **options)


async def remove_everything(engine: Podman) -> None:
    """At a test's end: no container of its store keeps running, and its runroot is gone."""
    with trio.move_on_after(60):
        await trio.run_process([engine.binary, *engine._global, "rm", "--all", "--force", "-t", "0"],
                               check=False, capture_stdout=True, capture_stderr=True, env=engine.environment())
    runroot = engine._global[engine._global.index("--runroot") + 1]
    await trio.to_thread.run_sync(lambda: shutil.rmtree(runroot, ignore_errors=True))


@dataclass
class Registry:
    url: str  # http://127.0.0.1:PORT
    host: str  # 127.0.0.1:PORT, as an image reference names it
    builder: Podman  # the store images are built in before they are pushed

    async def push(self, name: str, tag: str, *, files: dict[str, bytes] | None = None,
                   cmd: list[str] | None = None) -> str:
        """A busybox image with ``files`` (path in the image → contents) and ``cmd``, pushed as
        ``name:tag``; its reference (with the registry)."""
        files = {"/www/index.html": b"ok\n", **(files or {})}
        data = await trio.to_thread.run_sync(_rootfs, files)
        tar = self.builder.scratch / f"{name.replace('/', '_')}-{tag}.tar"
        tar.write_bytes(data)
        local = f"localhost/{name}:{tag}"
        cmd = cmd or HTTPD_CMD
        change = "CMD " + json.dumps(cmd)
        await self._podman(["import", "--change", change, str(tar), local])
        reference = f"{self.host}/{name}:{tag}"
        await self._podman(["push", "--tls-verify=false", local, f"docker://{reference}"])
        return reference

    async def _podman(self, args: list[str]) -> None:
        b = self.builder
        with trio.fail_after(120):
            result = await trio.run_process([b.binary, *b._global, *args], check=False, capture_stdout=True,
                                            capture_stderr=True, env=b.environment(), stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]


def _rootfs(files: dict[str, bytes]) -> bytes:
    """A tar of busybox, its applets and ``files``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for directory in ("bin", "www", "tmp", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(BUSYBOX, "bin/busybox")
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        for path, content in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(content), 0o755 if path.startswith("/bin/") else 0o644
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


async def start_registry(nursery: trio.Nursery, directory: Path) -> Registry:
    """Debian's docker-registry on a free loopback port, storing under ``directory``; it stops with
    ``nursery``. Returns once it answers /v2/."""
    require_tools()
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = directory / "registry.yml"
    conf.write_text(REGISTRY_CONF.format(root=directory / "data", port=port))

    builder = podman(directory / "builder")

    async def run() -> None:
        try:
            with (directory / "registry.log").open("wb") as log_file:
                await trio.run_process(["docker-registry", "serve", str(conf)], check=False, stdout=log_file,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            with trio.CancelScope(shield=True):
                await remove_everything(builder)

    nursery.start_soon(run)
    url = f"http://127.0.0.1:{port}"
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                try:
                    if (await client.get(f"{url}/v2/")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await trio.sleep(0.1)
    return Registry(url, f"127.0.0.1:{port}", builder)
