"""The registry proxy's cache and upstream fetch, against a registry made of an httpx MockTransport:
verified bytes only, one upstream fetch for many concurrent requests, bounded waits and sizes, a disk
budget kept by evicting the least recently used, and names that cannot reach outside the cache."""

from __future__ import annotations

import hashlib
import time

import httpx
import pytest
import trio

from device_client.shared.imageref import parse
from hub.registry import routes
from hub.registry.cache import Cache
from hub.registry.upstream import MAX_MANIFEST_BYTES, Upstream, UpstreamError

REGISTRY = "reg.test:5000"
REPO = f"{REGISTRY}/app/web"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class FakeRegistry:
    """Blobs by digest; counts GETs; ``lie`` serves other bytes; ``delay`` holds each answer."""

    def __init__(self, blobs: dict[str, bytes], *, lie: bool = False, delay: float = 0.0,
                 drip: float | None = None) -> None:
        self.blobs, self.lie, self.delay, self.drip = blobs, lie, delay, drip
        self.gets = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.gets += 1
        await trio.sleep(self.delay)
        digest = request.url.path.rsplit("/", 1)[-1]
        if digest not in self.blobs:
            return httpx.Response(404)
        data = self.blobs[digest] + (b"!" if self.lie else b"")
        step = 4 if self.drip else 64 << 10

        async def body():  # a stream, as a socket gives it (bytes content would arrive already read)
            for i in range(0, len(data), step):
                if self.drip is not None:
                    await trio.sleep(self.drip)
                yield data[i:i + step]

        headers = {"Content-Type": "application/vnd.test"}
        if self.drip is None:
            headers["Content-Length"] = str(len(data))
        return httpx.Response(200, content=body(), headers=headers)


def setup(tmp_path, registry: FakeRegistry, *, budget: int = 1 << 30, **bounds) -> tuple[Cache, Upstream]:
    cache = Cache(tmp_path / "cache", budget)
    cache.load()
    return cache, Upstream(allowed=(REGISTRY,), transport=httpx.MockTransport(registry), **bounds)


async def get(cache: Cache, upstream: Upstream, digest: str, *, kind: str = "blobs",
              max_bytes: int = 1 << 30) -> bytes:
    ref = parse(f"{REPO}@{digest}")

    async def fetch(out, most, progress):
        return await upstream.fetch(ref, kind, digest, out, max_bytes=most, progress=progress)

    _, handle = await cache.open(Cache.key(REPO, kind, digest), fetch, max_bytes=max_bytes)
    with handle:
        return handle.read()


async def test_a_hundred_concurrent_requests_fetch_a_blob_once(tmp_path):
    data = b"layer" * 10_000
    registry = FakeRegistry({sha(data): data}, delay=0.2)
    cache, upstream = setup(tmp_path, registry)
    got = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for _ in range(100):
                nursery.start_soon(lambda: _collect(got, get(cache, upstream, sha(data))))
    assert got == [data] * 100
    assert registry.gets == 1 and upstream.fetches == 1 and cache.fills == 1
    assert upstream.bytes == len(data)


async def _collect(out: list, work) -> None:
    out.append(await work)


async def test_bytes_that_do_not_match_their_digest_are_refused_not_cached_not_served(tmp_path):
    data = b"the real layer"
    registry = FakeRegistry({sha(data): data}, lie=True, delay=0.1)
    cache, upstream = setup(tmp_path, registry)
    errors = []

    async def one():
        try:
            await get(cache, upstream, sha(data))
        except UpstreamError as exc:
            errors.append(exc)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(one)
    assert len(errors) == 10 and "hash to" in errors[0].message
    assert registry.gets == 1  # the waiters got the fetcher's error, not a fetch each
    assert cache.entries == {} and cache.total == 0
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []  # nothing half-kept
    registry.lie = False
    with trio.fail_after(10):
        assert await get(cache, upstream, sha(data)) == data  # asked again, fetched again


async def test_a_huge_manifest_is_refused_declared_or_not(tmp_path):
    huge = b"{" + b" " * MAX_MANIFEST_BYTES + b"}"
    registry = FakeRegistry({sha(huge): huge})
    cache, upstream = setup(tmp_path, registry)
    with trio.fail_after(20), pytest.raises(UpstreamError, match="over the limit"):
        await get(cache, upstream, sha(huge), kind="manifests", max_bytes=MAX_MANIFEST_BYTES)
    registry.drip = 0.0  # streamed, no Content-Length: the count stops it
    with trio.fail_after(60), pytest.raises(UpstreamError, match="over the limit"):
        await get(cache, upstream, sha(huge), kind="manifests", max_bytes=MAX_MANIFEST_BYTES)
    assert cache.entries == {}


async def test_a_slow_upstream_is_bounded(tmp_path):
    data = b"x" * 400
    cache, upstream = setup(tmp_path, FakeRegistry({sha(data): data}, drip=0.05), total=1.0)
    with trio.fail_after(5), pytest.raises(UpstreamError, match="within 1s"):
        await get(cache, upstream, sha(data))
    cache, upstream = setup(tmp_path / "b", FakeRegistry({sha(data): data}, delay=3), total=1.0)
    with trio.fail_after(5), pytest.raises(UpstreamError, match="within 1s"):
        await get(cache, upstream, sha(data))


async def test_the_budget_evicts_the_least_recently_used_and_survives_a_restart(tmp_path):
    blobs = {sha(b): b for b in (b"a" * 400, b"b" * 400, b"c" * 400)}
    a, b, c = blobs
    registry = FakeRegistry(blobs)
    cache, upstream = setup(tmp_path, registry, budget=1000)
    with trio.fail_after(10):
        await get(cache, upstream, a)
        await get(cache, upstream, b)
        await get(cache, upstream, a)  # a is now the most recently used
        await get(cache, upstream, c)  # over budget: b goes
    assert cache.total == 800 and registry.gets == 3
    keys = {Cache.key(REPO, "blobs", d) for d in (a, c)}
    assert set(cache.entries) == keys
    again = Cache(tmp_path / "cache", 1000)
    again.load()
    assert set(again.entries) == keys and again.total == 800
    with trio.fail_after(10):
        await get(again, upstream, a)
    assert registry.gets == 3  # served from disk after the restart
    with trio.fail_after(10), pytest.raises(UpstreamError, match="over the limit of 1000"):
        await get(again, Upstream(allowed=(REGISTRY,), transport=httpx.MockTransport(
            FakeRegistry({sha(b"z" * 2000): b"z" * 2000}))), sha(b"z" * 2000))  # bigger than the budget


@pytest.mark.parametrize("name", ["..", "../../etc", "127.0.0.1__5000/../x", "127.0.0.1:5000/app",
                                  "a__b__c/app", "%2e%2e/app", "127.0.0.1__5000", "UPPER/app", "[::1]__5000/app"])
async def test_names_the_proxy_does_not_spell_are_refused(name):
    with pytest.raises(routes._Refused) as refused:
        routes._reference(name, "blobs", sha(b"x"))
    assert refused.value.status == 404


def test_a_tag_is_refused_and_keys_stay_inside_the_cache():
    with pytest.raises(routes._Refused):
        routes._reference("127.0.0.1__5000/app/web", "manifests", "latest")
    ref = routes._reference("127.0.0.1__5000/app/web", "blobs", sha(b"x"))
    assert (ref.registry, ref.repository) == ("127.0.0.1:5000", "app/web")
    key = Cache.key("../../etc/passwd", "blobs", sha(b"x"))
    assert ".." not in key and key.count("/") == 2


async def test_requests_wait_for_the_cache_to_be_read_before_filling_it(tmp_path):
    """Reading the cache at the first request clears its temporary directory: a second request that
    filled meanwhile would lose its file (the bench saw it: a 500)."""
    from types import SimpleNamespace

    from hub.registry.proxy import RegistryProxy
    from hub.settings import Settings

    proxy = RegistryProxy(SimpleNamespace(settings=Settings(data_dir=tmp_path), db=None, spawn=None))
    reading = trio.Event()
    load = proxy.cache.load
    loaded = []

    def slow_load() -> None:
        trio.from_thread.run_sync(reading.set)
        time.sleep(0.3)
        load()
        loaded.append(True)

    proxy.cache.load = slow_load
    order = []

    async def first():
        await proxy.ready()
        order.append("first")

    async def second():
        await reading.wait()
        await proxy.ready()
        order.append("second ready, loaded" if loaded else "second ready, still loading")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            nursery.start_soon(second)
    assert "second ready, loaded" in order


class GatedRegistry:
    """One blob with its Content-Length: the first ``head`` bytes at once, the rest once ``gate`` is set
    (``lie``: the rest is other bytes)."""

    def __init__(self, data: bytes, head: int, *, lie: bool = False) -> None:
        self.data, self.head, self.lie = data, head, lie
        self.gate = trio.Event()
        self.gets = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.gets += 1

        async def body():
            yield self.data[:self.head]
            await self.gate.wait()
            rest = self.data[self.head:]
            yield bytes(len(rest)) if self.lie else rest

        return httpx.Response(200, content=body(), headers={"Content-Length": str(len(self.data))})


async def _stream_open(cache: Cache, upstream: Upstream, digest: str):
    ref = parse(f"{REPO}@{digest}")

    async def fetch(out, most, progress):
        return await upstream.fetch(ref, "blobs", digest, out, max_bytes=most, progress=progress)

    return await cache.open(Cache.key(REPO, "blobs", digest), fetch, max_bytes=1 << 30, stream=True)


async def test_a_blob_streams_to_its_readers_while_the_registry_sends_it_and_is_fetched_once(tmp_path, nursery):
    data = bytes(range(256)) * 4096  # 1 MiB
    registry = GatedRegistry(data, head=300 << 10)
    cache = Cache(tmp_path / "cache", 1 << 30, spawn=nursery.start_soon)
    cache.load()
    upstream = Upstream(allowed=(REGISTRY,), transport=httpx.MockTransport(registry))
    with trio.fail_after(20):
        readers = [await _stream_open(cache, upstream, sha(data)) for _ in range(5)]
        assert all(entry.size == len(data) for entry, _ in readers)
        firsts = [await reader.read(64 << 10) for _, reader in readers]
        for first in firsts:
            assert first and first == data[:len(first)]  # before the registry sent the rest
        assert not registry.gate.is_set() and cache.entries == {}
        registry.gate.set()
        for (_, reader), got in zip(readers, firsts):
            with reader:
                while chunk := await reader.read(256 << 10):
                    got += chunk
            assert got == data
        assert registry.gets == 1 and cache.fills == 1
        # verified and kept: the next reader gets the cached file
        entry, handle = await _stream_open(cache, upstream, sha(data))
        with handle:
            assert handle.read() == data
        assert registry.gets == 1 and cache.hits == 1


async def test_a_streamed_blob_that_does_not_match_its_digest_cuts_its_readers_and_is_not_kept(tmp_path, nursery):
    data = b"ab" * (512 << 10)
    registry = GatedRegistry(data, head=300 << 10, lie=True)
    cache = Cache(tmp_path / "cache", 1 << 30, spawn=nursery.start_soon)
    cache.load()
    upstream = Upstream(allowed=(REGISTRY,), transport=httpx.MockTransport(registry))
    with trio.fail_after(20):
        _, reader = await _stream_open(cache, upstream, sha(data))
        assert await reader.read(1024) == data[:1024]
        registry.gate.set()
        with pytest.raises(UpstreamError, match="hash to"), reader:
            while await reader.read(256 << 10):
                pass
        await trio.sleep(0.1)
    assert cache.entries == {} and cache.total == 0
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


async def test_a_registry_that_asks_for_a_token_is_given_an_anonymous_one(tmp_path):
    # Before: the upstream called hub/images.py's _anonymous_token, which the registry credentials had
    # renamed, so any registry answering with a Bearer challenge failed the pull (AttributeError).
    data = b"layer" * 1000
    digest = sha(data)
    token_requests = []

    async def streamed(body: bytes):  # as a socket gives it (bytes content would arrive already read)
        yield body

    async def registry(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/token":
            token_requests.append((dict(request.url.params), "authorization" in request.headers))
            return httpx.Response(200, content=streamed(b'{"token": "pull-token"}'))
        if request.headers.get("authorization") != "Bearer pull-token":
            return httpx.Response(401, headers={"www-authenticate": f'Bearer realm="https://{REGISTRY}/token",'
                                                                    'service="reg",scope="repository:app/web:pull"'})
        return httpx.Response(200, content=streamed(data), headers={"Content-Length": str(len(data))})

    cache = Cache(tmp_path / "cache", 1 << 30)
    cache.load()
    upstream = Upstream(allowed=(REGISTRY,), transport=httpx.MockTransport(registry))
    with trio.fail_after(30):
        assert await get(cache, upstream, digest) == data
    assert token_requests == [({"scope": "repository:app/web:pull", "service": "reg"}, False)]
