"""A small container image built on this machine: a busybox rootfs with a few files, imported and
pushed with podman to a registry on loopback. The demo ships one (hub/demo_containers.py) and the
tests build theirs with the same code (tests/containertools.py).

No public registry is reachable from where fleethub is built and tried, so the image is made here from
``busybox-static`` (one binary, every applet a symlink) plus the files wanted, and served by Debian's
``docker-registry``. podman is configured without touching /etc: ``CONTAINERS_CONF`` is the
containers.conf docs/containers.md gives for sandboxes (cgroupfs, runc, ``default_ulimits = []``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import trio

from device_client.engine.podman import Podman

BUSYBOX = "/bin/busybox"
APPLETS = ("sh", "httpd", "wget", "cat", "echo", "sleep", "ls", "true", "false", "test", "kill")
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


def missing_tools() -> list[str]:
    """What building, serving and running an image here needs and this machine lacks."""
    missing = [tool for tool in ("podman", "docker-registry") if shutil.which(tool) is None]
    if shutil.which("runc") is None and not os.path.exists("/usr/sbin/runc"):
        missing.append("runc")
    if not os.path.exists(BUSYBOX):
        missing.append("busybox-static")
    return missing


def rootfs(files: dict[str, bytes], busybox: str = BUSYBOX, applets: tuple[str, ...] = APPLETS) -> bytes:
    """A tar of busybox, its applets (symlinks) and ``files`` (path in the image -> contents)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for directory in ("bin", "www", "tmp", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, "bin/busybox")
        for applet in applets:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        for path, content in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(content), 0o755 if path.startswith("/bin/") else 0o644
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


async def run_podman(engine: Podman, args: list[str], timeout: float = 120) -> None:
    """podman with ``engine``'s store and configuration; RuntimeError with podman's last words."""
    with trio.fail_after(timeout):
        done = await trio.run_process([engine.binary, *engine.global_args, *args], check=False, capture_stdout=True,
                                      capture_stderr=True, env=engine.environment(), stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"podman {args[0]}: {said[-1] if said else done.returncode}")


async def push_image(engine: Podman, host: str, name: str, tag: str, files: dict[str, bytes], cmd: list[str], *,
                     scratch: Path, creds: tuple[str, str] | None = None) -> str:
    """A busybox image with ``files`` and ``cmd`` built in ``engine``'s store and pushed to the registry
    at ``host`` (loopback, plain HTTP) as ``name:tag``; its reference."""
    tar = scratch / f"{name.replace('/', '_')}-{tag}.tar"
    tar.write_bytes(await trio.to_thread.run_sync(rootfs, files))
    local = f"localhost/{name}:{tag}"
    try:
        await run_podman(engine, ["import", "--change", "CMD " + json.dumps(cmd), str(tar), local])
    finally:
        tar.unlink(missing_ok=True)
    reference = f"{host}/{name}:{tag}"
    login = ["--creds", ":".join(creds)] if creds else []
    await run_podman(engine, ["push", "--tls-verify=false", *login, local, f"docker://{reference}"])
    return reference
