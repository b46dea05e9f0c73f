"""Containers for tests: a registry of our own on loopback, a busybox image pushed to it, podman with a
private store.

No public registry is reachable from the test machines, so a test builds its image with the demo's
code (hub/image_build.py): a rootfs of the static busybox (``busybox-static``: one binary, every applet
a symlink) plus the files the test wants, ``podman import``-ed with a CMD and ``podman push``-ed into
Debian's ``docker-registry`` listening on a free 127.0.0.1 port. The image serves HTTP with busybox's httpd, so an HTTP health check can pass.

podman is configured without touching /etc: ``containers.conf`` in the test's tmp dir (cgroupfs,
runc, ``default_ulimits = []``: the sandbox's cgroup layout and rlimits need all three; docs/containers.md)
passed as CONTAINERS_CONF, and a private ``--root``/``--runroot`` per store, so tests share nothing.
A test marked ``needs_containers`` is skipped, with the reason, when any of the tools is missing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from device_client.engine.podman import Podman
from hub.image_build import CONTAINERS_CONF, REGISTRY_CONF, missing_tools, push_image
from tests.ports import free_port

# a web server in the foreground on $PORT (default 8080) serving /www
HTTPD_CMD = ["/bin/sh", "-c", 'exec /bin/httpd -f -p "${PORT:-8080}" -h /www']


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
        await trio.run_process([engine.binary, *engine.global_args, "rm", "--all", "--force", "-t", "0"],
                               check=False, capture_stdout=True, capture_stderr=True, env=engine.environment())
    runroot = engine.global_args[engine.global_args.index("--runroot") + 1]
    await trio.to_thread.run_sync(lambda: shutil.rmtree(runroot, ignore_errors=True))


@dataclass
class Registry:
    url: str  # http://127.0.0.1:PORT
    host: str  # 127.0.0.1:PORT, as an image reference names it
    builder: Podman | None  # the store images are built in before they are pushed (None: push_blank only)
    login: tuple[str, str] | None = None  # a user of its htpasswd, with which tests push

    async def push(self, name: str, tag: str, *, files: dict[str, bytes] | None = None,
                   cmd: list[str] | None = None) -> str:
        """A busybox image with ``files`` (path in the image → contents) and ``cmd``, pushed as
        ``name:tag``; its reference (with the registry)."""
        files = {"/www/index.html": b"ok\n", **(files or {})}
        return await push_image(self.builder, self.host, name, tag, files, cmd or HTTPD_CMD,
                                scratch=self.builder.scratch, creds=self.login)

    async def push_blank(self, name: str, tag: str) -> str:
        """An image with no layers, put with the registry's HTTP API alone (no podman): enough for a
        version pinned by the hub and run by the fake engine. Its reference."""
        config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
                             "config": {}, "name": f"{name}:{tag}"}).encode()
        digest = "sha256:" + hashlib.sha256(config).hexdigest()
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                          "digest": digest, "size": len(config)},
                               "layers": []}).encode()
        async with httpx.AsyncClient(base_url=self.url, timeout=10, auth=self.login) as client:
            r = await client.post(f"/v2/{name}/blobs/uploads/")
            assert r.status_code == 202, r.text
            location = r.headers["location"]
            location += ("&" if "?" in location else "?") + f"digest={digest}"
            r = await client.put(location, content=config,
                                 headers={"Content-Type": "application/octet-stream"})
            assert r.status_code == 201, r.text
            r = await client.put(f"/v2/{name}/manifests/{tag}", content=manifest,
                                 headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
            assert r.status_code == 201, r.text
        return f"{self.host}/{name}:{tag}"


def bcrypt_hash(password: str) -> str:
    """What docker-registry's htpasswd wants: bcrypt. Python's bcrypt and passlib are not installed here
    and htpasswd (apache2-utils) may not be; the C library's crypt(3) (libxcrypt) makes $2b$ hashes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt
    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 4))


def registry_missing() -> list[str]:
    return [] if shutil.which("docker-registry") else ["docker-registry"]


#: a test that needs only a registry (images put with ``push_blank``, run by the fake engine)
needs_registry = pytest.mark.skipif(bool(registry_missing()),
                                    reason="registry tests need docker-registry (make system-deps)")


async def start_registry(nursery: trio.Nursery, directory: Path, *, build: bool = True,
                         htpasswd: dict[str, str] | None = None) -> Registry:
    """Debian's docker-registry on a free loopback port, storing under ``directory``; it stops with
    ``nursery``. Returns once it answers /v2/. ``build``: with a podman store to build images in
    (``push``); without, only ``push_blank`` works and podman is not needed. ``htpasswd``: user ->
    password, and the registry wants them (basic auth over plain HTTP, loopback only)."""
    if build:
        require_tools()
    elif registry_missing():
        pytest.skip("registry tests need docker-registry (make system-deps)")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = directory / "registry.yml"
    text = REGISTRY_CONF.format(root=directory / "data", port=port)
    if htpasswd is not None:
        users = directory / "htpasswd"
        users.write_text("".join(f"{user}:{bcrypt_hash(password)}\n" for user, password in htpasswd.items()))
        text += f"auth:\n  htpasswd:\n    realm: fleethub-tests\n    path: {users}\n"
    conf.write_text(text)

    builder = podman(directory / "builder") if build else None

    async def run() -> None:
        try:
            with (directory / "registry.log").open("wb") as log_file:
                await trio.run_process(["docker-registry", "serve", str(conf)], check=False, stdout=log_file,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            if builder is not None:
                with trio.CancelScope(shield=True):
                    await remove_everything(builder)

    nursery.start_soon(run)
    url = f"http://127.0.0.1:{port}"
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                try:
                    if (await client.get(f"{url}/v2/")).status_code in (200, 401):
                        break
                except httpx.TransportError:
                    pass
                await trio.sleep(0.1)
    login = next(iter(htpasswd.items())) if htpasswd else None
    return Registry(url, f"127.0.0.1:{port}", builder, login)
