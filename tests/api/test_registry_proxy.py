"""The hub's registry proxy over HTTP, against a real registry behind a counting relay: a device of a
fleet with the proxy on pulls its organisation's image by digest; a hundred concurrent pulls of a
layer cost the registry one fetch; Range works; the bytes served are what billing reports for the
fleet. Who may pull: a device token is required, a fleet with the proxy off is refused, and so is a
repository no version of the organisation names."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import httpx
import trio

from tests.containertools import needs_containers, start_registry
from tests.hubtools import start_hub, wait_for
from tests.registrytools import start_relay

pytestmark = needs_containers


def basic(token: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"device:{token}".encode()).decode()}


async def test_pulls_through_the_proxy_are_coalesced_authorised_and_billed(nursery, db_url, tmp_path):
    with trio.fail_after(180):
        reg = await start_registry(nursery, tmp_path / "registry")
        await reg.push("app/web", "1", files={"/www/big.bin": bytes(range(256)) * 4096})
        relay = await start_relay(nursery, int(reg.host.rsplit(":", 1)[1]))
        hub = await start_hub(nursery, db_url, tmp_path / "hub", registries=(relay.host,))
        proxied = (await hub.call("POST", "/v1/fleets", json={"name": "proxied", "registry_proxy": True})).json()["data"]["id"]
        plain = (await hub.call("POST", "/v1/fleets", json={"name": "plain"})).json()["data"]["id"]
        _, token = await hub.provision("a", fleet_id=proxied)
        _, other_token = await hub.provision("b", fleet_id=plain)
        r = await hub.call("POST", "/v1/configurations", json={
            "name": "web", "spec": {"containers": [{"name": "web", "image": f"{relay.host}/app/web:1"}]}})
        assert r.status_code == 201, r.text
        image = r.json()["data"]["version"]["spec"]["containers"][0]["image"]
        digest = image.rsplit("@", 1)[1]
        name = relay.host.replace(":", "__") + "/app/web"
        v2 = f"{hub.base_url}/v2/{name}"
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as client:
            r = await client.get(f"{hub.base_url}/v2/")
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic ")
            assert (await client.get(f"{hub.base_url}/v2/", headers=basic("not-a-token"))).status_code == 401
            r = await client.get(f"{hub.base_url}/v2/", headers=basic(other_token))
            assert r.status_code == 403 and r.json()["errors"][0]["code"] == "DENIED"
            assert (await client.get(f"{hub.base_url}/v2/", headers=basic(token))).status_code == 200

            r = await client.get(f"{v2}/manifests/{digest}", headers=basic(token))
            assert r.status_code == 200, r.text
            assert "sha256:" + hashlib.sha256(r.content).hexdigest() == digest == r.headers["docker-content-digest"]
            served = len(r.content)
            manifest = json.loads(r.content)
            layer = max(manifest["layers"], key=lambda lay: lay["size"])
            assert relay.blob_gets() == 0  # pinning asked for the manifest only

            bodies = []

            async def pull() -> None:
                got = await client.get(f"{v2}/blobs/{layer['digest']}", headers=basic(token))
                assert got.status_code == 200
                bodies.append(got.content)

            async with trio.open_nursery() as pulls:
                for _ in range(100):
                    pulls.start_soon(pull)
            assert len(bodies) == 100
            assert {"sha256:" + hashlib.sha256(b).hexdigest() for b in bodies} == {layer["digest"]}
            assert relay.blob_gets(layer["digest"]) == 1, relay.requests
            served += 100 * layer["size"]

            r = await client.get(f"{v2}/blobs/{layer['digest']}", headers={**basic(token), "Range": "bytes=10-19"})
            assert r.status_code == 206 and r.headers["content-range"] == f"bytes 10-19/{layer['size']}"
            assert r.content == bodies[0][10:20]
            served += 10
            r = await client.head(f"{v2}/blobs/{layer['digest']}", headers=basic(token))
            assert r.status_code == 200 and int(r.headers["content-length"]) == layer["size"]

            # the same blob, under a repository no version names: refused before any fetch
            r = await client.get(f"{hub.base_url}/v2/{relay.host.replace(':', '__')}/app/other/blobs/{layer['digest']}",
                                 headers=basic(token))
            assert r.status_code == 403, r.text
            r = await client.get(f"{hub.base_url}/v2/%2e%2e/%2e%2e/blobs/{layer['digest']}", headers=basic(token))
            assert r.status_code == 404
            r = await client.get(f"{v2}/manifests/1", headers=basic(token))  # a tag
            assert r.status_code == 404 and r.json()["errors"][0]["code"] == "MANIFEST_UNKNOWN"
            assert relay.blob_gets() == 1

        assert hub.services.registry_proxy.served == served
        r = await hub.call("GET", "/v1/billing/registry-fallback")
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        by_fleet = {f["fleet_id"]: f for f in data["fleets"]}
        assert by_fleet[proxied]["bytes"] == served and by_fleet[proxied]["registry_proxy"] is True
        assert by_fleet[plain]["bytes"] == 0
        assert data["totals"]["bytes"] == served and data["totals"]["unattributed_bytes"] == 0


async def test_a_pull_cut_short_bills_what_was_carried(nursery, db_url, tmp_path):
    with trio.fail_after(180):
        reg = await start_registry(nursery, tmp_path / "registry")
        await reg.push("app/big", "1", files={"/big.bin": os.urandom(32 << 20)})  # random: the layer stays 32 MiB
        hub = await start_hub(nursery, db_url, tmp_path / "hub", registries=(reg.host,))
        fleet = (await hub.call("POST", "/v1/fleets", json={"name": "proxied", "registry_proxy": True})).json()["data"]["id"]
        _, token = await hub.provision("a", fleet_id=fleet)
        r = await hub.call("POST", "/v1/configurations", json={
            "name": "big", "spec": {"containers": [{"name": "big", "image": f"{reg.host}/app/big:1"}]}})
        assert r.status_code == 201, r.text
        digest = r.json()["data"]["version"]["spec"]["containers"][0]["image"].rsplit("@", 1)[1]
        v2 = f"{hub.base_url}/v2/{reg.host.replace(':', '__')}/app/big"
        async with httpx.AsyncClient(timeout=30) as client:
            manifest = (await client.get(f"{v2}/manifests/{digest}", headers=basic(token))).json()
            layer = max(manifest["layers"], key=lambda lay: lay["size"])
            assert layer["size"] > 30 << 20
            proxy = hub.services.registry_proxy
            before = proxy.served
            async with client.stream("GET", f"{v2}/blobs/{layer['digest']}", headers=basic(token)) as r:
                assert r.status_code == 200
                async for _ in r.aiter_raw():
                    break  # the device goes away after its first chunk

        async def settled() -> bool:
            seen = proxy.served
            await trio.sleep(0.5)
            return proxy.served == seen and proxy.served > before

        await wait_for(settled, timeout=30)
        carried = proxy.served - before
        assert 0 < carried < layer["size"] // 2, (carried, layer["size"])
        r = await hub.call("GET", "/v1/billing/registry-fallback")
        assert r.json()["data"]["totals"]["bytes"] == proxy.served
