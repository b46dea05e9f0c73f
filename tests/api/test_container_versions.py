"""Container versions on the hub: ``spec.containers[]`` validated, images pinned to the digest the hub
hashed from the registry, and a registry that lies, stalls or floods refused within bounds."""

from __future__ import annotations

import hashlib
import json
from functools import partial

import httpx
import pytest
import trio

from device_client.shared.imageref import BadReference, parse
from hub.images import MAX_MANIFEST_BYTES, RegistryError, check_destination, resolve
from tests.containertools import needs_containers, start_registry
from tests.hubtools import assert_error, start_hub
from tests.ports import free_port

MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"}).encode()
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


def registry(answer) -> httpx.MockTransport:
    return httpx.MockTransport(answer)


def served(status: int, body: bytes = b"", **headers) -> httpx.Response:
    """A response whose body arrives as a stream, as a real registry's does."""
    return httpx.Response(status, stream=httpx.ByteStream(body), headers=headers)


async def test_the_digest_is_the_hash_of_the_bytes_received():
    ref = parse("registry.example/app/web:1")
    seen = []

    def answer(request):
        seen.append(str(request.url))
        return served(200, MANIFEST, **{"Docker-Content-Digest": DIGEST})

    with trio.fail_after(5):
        assert await resolve(ref, transport=registry(answer)) == DIGEST
        assert await resolve(ref.pinned(DIGEST), transport=registry(answer)) == DIGEST
    assert seen == ["https://registry.example/v2/app/web/manifests/1",
                    f"https://registry.example/v2/app/web/manifests/{DIGEST}"]


async def test_an_anonymous_token_is_fetched_when_the_registry_asks_for_one():
    asked = []

    def answer(request):
        asked.append((request.url.host, request.url.path, request.headers.get("authorization")))
        if request.url.host == "auth.example":
            assert request.url.params["scope"] == "repository:library/busybox:pull"
            return served(200, b'{"token": "anon-123"}')
        if request.headers.get("authorization") != "Bearer anon-123":
            return served(401, **{"WWW-Authenticate": 'Bearer realm="https://auth.example/token",'
                                                      'service="registry.docker.io",scope="repository:library/busybox:pull"'})
        return served(200, MANIFEST)

    with trio.fail_after(5):
        assert await resolve(parse("busybox:1.36"), transport=registry(answer)) == DIGEST
    assert asked == [("registry-1.docker.io", "/v2/library/busybox/manifests/1.36", None),
                     ("auth.example", "/token", None),
                     ("registry-1.docker.io", "/v2/library/busybox/manifests/1.36", "Bearer anon-123")]


async def test_a_token_service_at_a_private_address_or_without_tls_is_not_asked():
    def answer(realm):
        return lambda request: served(401, **{"WWW-Authenticate": f'Bearer realm="{realm}"'})

    with trio.fail_after(5):
        with pytest.raises(RegistryError, match="not HTTPS"):
            await resolve(parse("registry.example/a:1"), transport=registry(answer("http://auth.example/t")))
        with pytest.raises(RegistryError, match="private or local address"):
            await resolve(parse("registry.example/a:1"), allowed=("registry.example",),
                          transport=registry(answer("https://10.0.0.1/t")))


@pytest.mark.parametrize("answer, problem", [
    (lambda r: served(200, MANIFEST, **{"Docker-Content-Digest": "sha256:" + "0" * 64}), "says the manifest"),
    (lambda r: served(200, MANIFEST + b" "), "not the sha256:"),  # asked by digest
    (lambda r: served(200, b"x" * (MAX_MANIFEST_BYTES + 1)), "over the limit"),
    (lambda r: served(401), "credentials"),
    (lambda r: served(404), "is not in the registry"),
    (lambda r: served(302, Location="http://elsewhere/"), "answered 302"),
])
async def test_a_registry_that_lies_or_floods_is_refused(answer, problem):
    ref = parse(f"registry.example/app/web@{DIGEST}") if problem == "not the sha256:" else parse("registry.example/app/web:1")
    with trio.fail_after(5):
        with pytest.raises(RegistryError, match=problem) as caught:
            await resolve(ref, transport=registry(answer))
    assert not caught.value.unreachable


async def silent(stream) -> None:
    await trio.sleep_forever()


async def test_a_registry_that_never_answers_costs_the_timeout(nursery):
    listeners = await nursery.start(partial(trio.serve_tcp, host="127.0.0.1"), silent, 0)
    port = listeners[0].socket.getsockname()[1]
    began = trio.current_time()
    with trio.fail_after(5):
        with pytest.raises(RegistryError, match="did not answer within 0.5s") as caught:
            await resolve(parse(f"127.0.0.1:{port}/app/web:1"), timeout=0.5)
    assert caught.value.unreachable and trio.current_time() - began < 2


@pytest.mark.parametrize("text", ["app\0:1", "a b", "", "x" * 600, "Registry.example/App", "r.example/a@sha256:12",
                                  "r.example:99999/a", "r.example/a:" + "t" * 200])
def test_hostile_references_are_refused(text):
    with pytest.raises(BadReference):
        parse(text)


@pytest.mark.parametrize("registry", ["127.0.0.1:5000", "localhost", "10.1.2.3", "[::1]:5000", "169.254.169.254",
                                      "192.168.0.1:443"])
async def test_a_registry_on_a_private_address_is_asked_only_when_listed(registry):
    ref = parse(f"{registry}/app/web:1")
    with trio.fail_after(5):
        with pytest.raises(RegistryError, match="private or local address"):
            await check_destination(ref.registry, ())
        await check_destination(ref.registry, (registry,))


def test_references_parse_as_the_distribution_project_does():
    assert parse("busybox") == parse("docker.io/library/busybox")
    assert parse("localhost:5000/a/b:1@" + DIGEST).registry == "localhost:5000"
    assert parse("127.0.0.1:5000/a").plain_http and not parse("registry.example/a").plain_http
    assert str(parse("r.example/a:1").pinned(DIGEST)) == f"r.example/a@{DIGEST}"


@needs_containers
async def test_a_container_version_is_pinned_when_it_is_created(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        reg = await start_registry(nursery, tmp_path / "registry")
        reference = await reg.push("app/web", "1")
        dead = f"127.0.0.1:{free_port()}"
        hub = await start_hub(nursery, db_url, tmp_path / "hub", registries=(reg.host, dead))
        web = {"name": "web", "image": reference, "ports": [{"port": "8080"}],
               "healthCheck": {"http": {"port": 8080, "path": "/"}}}
        r = await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": {"containers": [web]}})
        assert r.status_code == 201, r.text
        stored = r.json()["data"]["version"]["spec"]["containers"][0]
        async with httpx.AsyncClient() as client:
            served = (await client.get(f"{reg.url}/v2/app/web/manifests/1", headers={
                "Accept": "application/vnd.oci.image.manifest.v1+json"})).headers["Docker-Content-Digest"]
        assert stored["image"] == f"{reg.host}/app/web@{served}" and stored["imageSource"] == reference
        assert stored["ports"] == [{"port": 8080}]
        cid = r.json()["data"]["id"]

        # the tag moves; the version does not, and a copy of the version's spec pins to the same image
        await reg.push("app/web", "1", files={"/www/index.html": b"moved\n"})
        r = await hub.call("POST", f"/v1/configurations/{cid}/versions", json={"spec": {"containers": [stored]}})
        assert r.status_code == 201, r.text
        assert r.json()["data"]["spec"]["containers"][0] == stored

        bad = [({**web, "image": reference + "\0"}, 400, "invalid_field", "spec.containers[0].image"),
               ({**web, "image": f"{reg.host}/app/nothing:1"}, 400, "image_unresolved", "spec.containers.0.image"),
               ({**web, "image": f"{dead}/app/web:1"}, 502, "registry_unavailable", "spec.containers.0.image"),
               # a loopback registry the hub's operator did not list: the hub does not even connect
               ({**web, "image": f"localhost:{reg.host.split(':')[1]}/app/web:1"}, 400, "image_unresolved",
                "spec.containers.0.image: the registry localhost"),
               ({**web, "resources": {"memoryMiB": 1 << 40}}, 400, "invalid_spec", "spec.containers.0.resources.memoryMiB"),
               ({**web, "healthCheck": {"http": {"port": 0}}}, 400, "invalid_spec", "spec.containers.0.healthCheck.http.port")]
        for container, status, code, field in bad:
            r = await hub.call("POST", f"/v1/configurations/{cid}/versions", json={"spec": {"containers": [container]}})
            body = assert_error(r, status, code)
            assert body["message"].startswith(field), body
        r = await hub.call("POST", f"/v1/configurations/{cid}/versions",
                           json={"spec": {"containers": [web], "workload": {"command": ["sleep", "9"]}}})
        assert "not both" in assert_error(r, 400, "invalid_spec")["message"]


class _Rebinding(trio.abc.HostnameResolver):
    """A name whose DNS answer changes between two lookups: public first, then the hub's own loopback
    (DNS rebinding, an attacker-run name server's classic move; TTL 0)."""

    def __init__(self, name: bytes, first: str, then: str) -> None:
        self.name, self.answers, self.asked = name, [first, then], 0

    async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
        if host != self.name:
            return await trio.to_thread.run_sync(__import__("socket").getaddrinfo, host, port, family, type, proto, flags)
        address = self.answers[min(self.asked, 1)]
        self.asked += 1
        return [(2, 1, 6, "", (address, port or 0))]

    async def getnameinfo(self, sockaddr, flags):
        raise OSError("not used")


async def test_a_rebinding_name_cannot_move_the_request_into_the_hubs_network(nursery):
    """A new attack class, tried in round 3 (docs/security.md): an editor names a registry whose DNS
    says a public address when the hub checks it and 127.0.0.1 when the hub connects. The hub now
    connects to the address it checked; before, its own second lookup took it to loopback, where
    this listener counted the connection (a blind port scan of the hub's network, status codes read
    back in the error)."""
    hits: list[int] = []

    async def count(stream) -> None:
        hits.append(1)
        await stream.aclose()

    port = free_port()
    await nursery.start(partial(trio.serve_tcp, count, port, host="127.0.0.1"))
    resolver = _Rebinding(b"rebind.example", "8.8.8.8", "127.0.0.1")
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    try:
        with pytest.raises(RegistryError) as refused:
            await resolve(parse(f"rebind.example:{port}/app:1"), timeout=1.0, allowed=())
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
    assert resolver.asked >= 2 and hits == [], (resolver.asked, hits)
    # the lookup the connection uses is the one checked: it said loopback, so nothing was asked
    assert "private or local address" in refused.value.message


def test_a_job_is_a_container_that_runs_to_completion():
    """kind "job": never restarted (restartPolicy "no", set when not given), no ports, no check of its
    own; its exit code is the verdict (device_client/containers.py)."""
    from pydantic import ValidationError

    from hub.api.container_spec import Container

    ref = "registry.example.com/app/migrate@sha256:" + "a" * 64
    made = Container.model_validate({"name": "migrate", "image": ref, "kind": "job",
                                     "healthCheck": {"timeoutSeconds": 120}})
    assert (made.kind, made.restartPolicy, made.healthCheck.timeoutSeconds) == ("job", "no", 120)
    assert Container.model_validate({"name": "web", "image": ref}).kind == "service"
    for extra, said in (({"restartPolicy": "always"}, "never restarted"), ({"ports": [{"port": 80}]}, "no ports"),
                        ({"healthCheck": {"http": {"port": 80}}}, "exit code is its health check"),
                        ({"kind": "cron"}, "kind")):
        with pytest.raises(ValidationError, match=said):
            Container.model_validate({"name": "migrate", "image": ref, "kind": "job", **extra})
