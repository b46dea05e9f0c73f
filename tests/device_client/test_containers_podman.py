"""ContainerSet with real podman and a real registry: switch after health, roll back to what ran.

One store per test (tests/containertools.py); the images are busybox built by the test."""

from __future__ import annotations

import os

import httpx
import trio

from device_client.containers import LABEL_MANAGED, ContainerSet, engine_name, parse_containers
from device_client.engine.base import EngineError
from device_client.shared.imageref import parse
from hub.images import resolve
from tests.containertools import needs_containers, podman, remove_everything, start_registry
from tests.ports import free_port

pytestmark = needs_containers


async def pinned(reference: str) -> str:
    ref = parse(reference)
    return str(ref.pinned(await resolve(ref)))


def web(name: str, image: str, port: int, **extra) -> dict:
    return {"name": name, "image": image, "env": {"PORT": str(port)}, "ports": [{"port": port}],
            "healthCheck": {"http": {"port": port, "path": "/"}, "timeoutSeconds": 10, "graceSeconds": 0.2}, **extra}


async def get(port: int) -> str:
    async with httpx.AsyncClient(timeout=3) as client:
        return (await client.get(f"http://127.0.0.1:{port}/")).text


async def test_a_failing_version_rolls_back_to_the_containers_that_ran(nursery, tmp_path):
    with trio.fail_after(150):
        registry = await start_registry(nursery, tmp_path / "registry")
        v1_image = await pinned(await registry.push("app/web", "1", files={"/www/index.html": b"v1\n"}))
        v2_image = await pinned(await registry.push("app/web", "2", files={"/www/index.html": b"v2\n"}))
        engine = podman(tmp_path / "device")
        try:
            events = []

            async def on_event(kind, payload):
                events.append((kind, payload))

            containers = ContainerSet(engine, tmp_path / "root", stop_grace=1, on_event=on_event)
            port, side = free_port(), free_port()
            v1 = parse_containers({"containers": [web("web", v1_image, port),
                                                  web("side", v1_image, side, resources={"memoryMiB": 64})]})
            health, _ = await containers.apply("v1", v1)
            assert health.healthy, health
            assert await get(port) == "v1\n" and await get(side) == "v1\n"
            events = [(k, e) for k, e in events if k != "container.pull_progress"]  # a slow pull may report some
            assert [k for k, _ in events] == ["container.pulled", "container.pulled"]
            assert events[0][1]["image"] == v1_image and events[0][1]["bytes"] > 1_000_000

            # v2: web serves on its port but its exec check fails; the old web is stopped for the port
            failing = web("web", v2_image, port)
            failing["healthCheck"] = {"command": ["/bin/sh", "-c", "echo not ready >&2; exit 3"],
                                      "timeoutSeconds": 2, "graceSeconds": 0.2}
            v2 = parse_containers({"containers": [failing]})
            health, _ = await containers.apply("v2", v2)
            assert not health.healthy
            assert "health check exited with code 3" in health.detail and "not ready" in health.output
            names = {c.name: c.running for c in await engine.containers(LABEL_MANAGED)}
            assert names == {engine_name("v1", "web"): True, engine_name("v1", "side"): True}, names
            assert await get(port) == "v1\n", "v1's web did not come back after the rollback"

            # v3: an image the registry does not have; nothing of v1 is touched
            ghost = str(parse(v1_image).pinned("sha256:" + "0" * 64))
            health, _ = await containers.apply("v3", parse_containers({"containers": [web("web", ghost, port)]}))
            assert not health.healthy and "pull" in health.detail
            assert await get(port) == "v1\n"

            # v2 done right replaces v1 entirely, and v1's image goes when the budget is zero
            containers.image_budget = 0
            health, _ = await containers.apply("v2", parse_containers({"containers": [web("web", v2_image, port)]}))
            assert health.healthy, health
            assert await get(port) == "v2\n"
            assert {c.name for c in await engine.containers(LABEL_MANAGED)} == {engine_name("v2", "web")}
            assert {d for i in await engine.images() for d in i.digests} == {parse(v2_image).digest}
        finally:
            await remove_everything(engine)


async def test_pull_refuses_a_reference_without_digest(tmp_path):
    engine = podman(tmp_path / "device")
    with trio.fail_after(30):
        try:
            await engine.pull("127.0.0.1:1/app/web:1")
        except EngineError as exc:
            assert "by digest only" in str(exc)
        else:
            raise AssertionError("a tag was pulled")
        finally:
            await remove_everything(engine)


async def test_a_container_that_ignores_sigterm_is_stopped_within_the_grace(nursery, tmp_path):
    with trio.fail_after(90):
        registry = await start_registry(nursery, tmp_path / "registry")
        stubborn = await pinned(await registry.push("app/stubborn", "1", cmd=[
            "/bin/sh", "-c", "trap '' TERM; while true; do sleep 1; done"]))
        engine = podman(tmp_path / "device")
        try:
            containers = ContainerSet(engine, tmp_path / "root", stop_grace=1)
            health, _ = await containers.apply("v1", parse_containers({"containers": [
                {"name": "app", "image": stubborn, "healthCheck": {"graceSeconds": 0.2}}]}))
            assert health.healthy, health
            began = trio.current_time()
            await engine.stop(engine_name("v1", "app"), 1)
            assert trio.current_time() - began < 10
            (info,) = await engine.containers(LABEL_MANAGED)
            assert not info.running and info.exit_code == 137  # SIGKILL, after the grace
        finally:
            await remove_everything(engine)


async def test_podman_names_its_version_for_the_hello(tmp_path):
    engine = podman(tmp_path / "device")
    try:
        with trio.fail_after(30):
            name, version = await engine.version()
        assert name == "podman" and version[:1].isdigit(), version
    finally:
        await remove_everything(engine)


async def test_podman_pulls_from_a_registry_that_wants_a_login_with_the_auth_file(nursery, tmp_path):
    """The agent's auth file (configs.py writes it from config.apply's registryAuth) is what podman
    logs in with: without it the pull is refused, with it the image arrives; the password is in no error."""
    from device_client.configs import write_registry_auth

    password = "podman-Pa55-31e7"
    engine = podman(tmp_path / "device")
    try:
        with trio.fail_after(180):
            reg = await start_registry(nursery, tmp_path / "registry", htpasswd={"puller": password})
            reference = await reg.push("private/web", "1")
            ref = parse(reference)
            image = str(ref.pinned(await resolve(ref, credentials=("puller", password))))
            try:
                await engine.pull(image)
            except EngineError as exc:
                assert password not in str(exc)
            else:
                raise AssertionError("pulled without a login")
            data = tmp_path / "agent"
            data.mkdir(mode=0o700)
            auth_file = data / "registry-auth.json"
            write_registry_auth(auth_file, {reg.host: ("puller", password)})
            assert await engine.pull(image, auth_file=auth_file) > 0
    finally:
        await remove_everything(engine)


async def test_a_podman_pull_reports_the_bytes_as_they_arrive(nursery, tmp_path):
    """podman's TMPDIR holds each blob as it arrives: its size, metered while the pull runs, is the
    progress; a failing metered pull is an EngineError as any pull's."""
    engine = podman(tmp_path / "device", progress_interval=0.05)
    try:
        with trio.fail_after(180):
            reg = await start_registry(nursery, tmp_path / "registry")
            big = await trio.to_thread.run_sync(os.urandom, 24 << 20)  # random: the layer stays 24 MiB compressed
            image = await pinned(await reg.push("app/big", "1", files={"/big": big}))
            seen: list[int] = []

            async def progress(received: int) -> None:
                seen.append(received)

            size = await engine.pull(image, progress=progress)
            assert seen and seen == sorted(seen), seen
            assert 0 < max(seen) <= size + (1 << 20) and max(seen) > 1 << 20, (seen, size)
            assert not list((tmp_path / "device").glob(".pull-*")), "the landing directory is removed"
            try:
                await engine.pull(image.replace(parse(image).digest, "sha256:" + "0" * 64), progress=progress)
            except EngineError as exc:
                assert "pull" in str(exc)
            else:
                raise AssertionError("a missing digest was pulled")
    finally:
        await remove_everything(engine)


async def test_a_job_runs_to_completion_with_podman_and_its_exit_code_decides(nursery, tmp_path):
    """kind "job" with real podman: a job that writes to its volume and exits 0 passes the version
    (and stays exited, not restarted); one that exits 2 rejects the next version with its log."""
    with trio.fail_after(150):
        registry = await start_registry(nursery, tmp_path / "registry")
        image = await pinned(await registry.push("app/job", "1"))
        engine = podman(tmp_path / "device")
        try:
            containers = ContainerSet(engine, tmp_path / "root", stop_grace=1)

            def job(script: str) -> dict:
                return {"name": "migrate", "image": image, "kind": "job", "command": ["/bin/sh", "-c", script],
                        "volumes": [{"name": "data", "mountPath": "/data"}], "healthCheck": {"timeoutSeconds": 30}}

            health, _ = await containers.apply("v1", parse_containers({"containers": [
                job("echo migrated > /data/done; exit 0")]}))
            assert health.healthy, health
            assert (tmp_path / "root" / "var/lib/fleethub/volumes/data/done").read_text() == "migrated\n"
            await trio.sleep(1)
            [info] = await engine.containers(LABEL_MANAGED)
            assert (info.running, info.exit_code) == (False, 0)

            health, log_tail = await containers.apply("v2", parse_containers({"containers": [
                job("echo schema is newer >&2; exit 2")]}))
            assert not health.healthy and "job migrate exited with code 2" in health.detail
            assert "schema is newer" in (log_tail or "")
            assert {c.name for c in await engine.containers(LABEL_MANAGED)} == {engine_name("v1", "migrate")}
        finally:
            with trio.CancelScope(shield=True):
                await remove_everything(engine)
