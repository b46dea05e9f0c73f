"""Where the agent's pulls go (device_client/pullroute.py), on the fake engine: the registry first and
the hub's proxy when it fails (fallback), the hub first (always), never the hub (off); the proxy as
podman would be told it (the mirror, the auth file with the device token, 0600)."""

from __future__ import annotations

import base64
import json
import stat

import pytest

from device_client.engine.base import EngineError
from device_client.engine.fake import FakeEngine
from device_client.pullroute import PullRoute

IMAGE = "127.0.0.1:5000/app/web@sha256:" + "a" * 64
TOKEN = "device-secret-token"


def route(tmp_path, mode: str, hub: str = "http://127.0.0.1:8080") -> PullRoute:
    return PullRoute(mode, lambda: hub, TOKEN, tmp_path)


async def test_fallback_goes_to_the_hub_only_when_the_registry_fails(tmp_path):
    engine = FakeEngine()
    assert await route(tmp_path, "fallback").pull(engine, IMAGE) == (engine.image_size, "registry")
    assert engine.mirrors == [None]
    engine = FakeEngine(unreachable={"127.0.0.1:5000"})
    assert await route(tmp_path, "fallback").pull(engine, IMAGE) == (engine.image_size, "proxy")
    assert engine.mirrors[0] is None and engine.mirrors[1].location == "127.0.0.1:8080/127.0.0.1__5000"


async def test_always_goes_to_the_hub_and_off_never(tmp_path):
    engine = FakeEngine()
    assert (await route(tmp_path, "always").pull(engine, IMAGE))[1] == "proxy"
    assert [m.registry for m in engine.mirrors] == ["127.0.0.1:5000"]
    engine = FakeEngine(unreachable={"127.0.0.1:5000"})
    with pytest.raises(EngineError, match="cannot be reached"):
        await route(tmp_path, "off").pull(engine, IMAGE)
    assert engine.mirrors == [None]


async def test_when_both_fail_the_error_says_both(tmp_path):
    engine = FakeEngine(unreachable={"127.0.0.1:5000"}, fail_pull={IMAGE.rsplit("@", 1)[1]: "403 denied"})
    with pytest.raises(EngineError) as failed:
        await route(tmp_path, "fallback").pull(engine, IMAGE)
    assert "cannot be reached" in str(failed.value) and "through the hub's registry proxy" in str(failed.value)
    assert TOKEN not in str(failed.value)


def test_the_mirror_carries_the_token_in_a_private_file_only(tmp_path):
    mirror = route(tmp_path, "always", "https://hub.example.com").mirror(IMAGE)
    assert (mirror.location, mirror.insecure) == ("hub.example.com/127.0.0.1__5000", False)
    assert TOKEN not in repr(mirror)
    assert stat.S_IMODE(mirror.authfile.stat().st_mode) == 0o600
    auths = json.loads(mirror.authfile.read_text())["auths"]
    assert base64.b64decode(auths["hub.example.com"]["auth"]).decode() == f"fleethub-device:{TOKEN}"
    # podman speaks plain HTTP to loopback only: a hub on plain HTTP elsewhere is no mirror
    assert route(tmp_path, "always", "http://hub.example.com").mirror(IMAGE) is None
    assert route(tmp_path, "always").mirror("[::1]:5000/app@sha256:" + "a" * 64) is None


async def test_the_fleets_mode_decides_with_the_agents_flag(tmp_path):
    """config.apply's registryProxy: the fleet's off and always win over the agent's flag; under the
    fleet's fallback (or no word from the hub) the flag decides."""
    for fleet, flag, via in (("always", "fallback", "proxy"), ("always", "off", "proxy"), ("off", "always", "registry"),
                             ("fallback", "always", "proxy"), ("fallback", "fallback", "registry"),
                             (None, "always", "proxy"), (None, "off", "registry")):
        engine = FakeEngine()
        assert (await route(tmp_path, flag).pull(engine, IMAGE, fleet))[1] == via, (fleet, flag)


async def test_always_never_asks_the_registry_even_when_the_hub_fails(tmp_path):
    engine = FakeEngine(mirror_fails="502 Bad Gateway")
    with pytest.raises(EngineError, match="registry proxy only") as failed:
        await route(tmp_path, "fallback").pull(engine, IMAGE, "always")
    assert engine.mirrors[0].exclusive and engine.registry_asks == 0
    assert TOKEN not in str(failed.value)
    # what a mirror that is not exclusive does instead (podman's mirror list): on to the registry
    engine = FakeEngine(mirror_fails="502 Bad Gateway")
    await engine.pull(IMAGE, route(tmp_path, "always").mirror(IMAGE))
    assert engine.registry_asks == 1


def test_podman_is_told_the_hub_is_the_registrys_only_location(tmp_path):
    from device_client.engine.podman import _mirror_conf

    exclusive = _mirror_conf(route(tmp_path, "always").mirror(IMAGE, exclusive=True), True).read_text()
    assert 'location = "127.0.0.1:8080/127.0.0.1__5000"' in exclusive and "registry.mirror" not in exclusive
    mirrored = _mirror_conf(route(tmp_path, "always").mirror(IMAGE), True).read_text()
    assert 'location = "127.0.0.1:5000"' in mirrored and "[[registry.mirror]]" in mirrored


async def test_always_with_a_hub_podman_cannot_use_refuses_rather_than_asking_the_registry(tmp_path):
    engine = FakeEngine()
    with pytest.raises(EngineError, match="registry proxy only"):
        await route(tmp_path, "fallback", "http://hub.example.com").pull(engine, IMAGE, "always")
    assert engine.registry_asks == 0 and engine.mirrors == []
