"""Secret files changed through one node reach a device linked to another (a real agent on node A,
the API calls on node B): uploads and deletes alike, for the device's own files and for its
configuration's, at once rather than at the device's next hello; and a registry login changed on node B."""

from __future__ import annotations

import base64
import json
import sys
import uuid
from dataclasses import replace

import trio

from device_client.engine.fake import FakeEngine
from tests.cluster.test_two_nodes import _online_at, two_nodes
from tests.containertools import needs_registry, start_registry
from tests.hubtools import start_agent, wait_for

HEALTHY = {"command": [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
           "healthCheck": {"timeoutSeconds": 2, "graceSeconds": 0.2}}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_files_uploaded_and_deleted_on_node_b_reach_the_device_node_a_holds(nats_server, db_url, tmp_path):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a, b_services, b_url = await two_nodes(nursery, db_url, tmp_path / "hub", nats_server.url)
            device_id, token = await a.provision("edge-1")
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent")
            root = agent.agent.root
            await wait_for(lambda: _online_at(a.services, device_id, "a"), timeout=20)

            async def call(node: str, method: str, path: str, **kw):
                return await a.client.request(method, f"{node}{path}", headers=a.headers, **kw)

            r = await call(a.base_url, "POST", "/v1/configurations", json={"name": "app", "spec": {"workload": HEALTHY}})
            cid = r.json()["data"]["id"]
            r = await call(a.base_url, "PUT", f"/v1/devices/{device_id}/configuration", json={"configId": cid})
            assert r.status_code == 202, r.text
            await wait_for(lambda: _applied(a, device_id), timeout=20)
            durl, curl = f"/v1/devices/{device_id}/secret-files", f"/v1/configurations/{cid}/secret-files"

            # uploaded through A, deleted through B, which never held the device's actor
            ids = {}
            for url, path in ((durl, "/etc/app/own"), (curl, "/etc/app/shared")):
                r = await call(a.base_url, "POST", url, json={"path": path, "content_base64": b64(b"x")})
                assert r.status_code == 201, r.text
                ids[path] = (url, r.json()["data"]["id"])
            await wait_for(lambda: (root / "etc/app/own").exists() and (root / "etc/app/shared").exists(),
                           timeout=15)
            assert b_services.registry.lookup(("device", uuid.UUID(device_id))) is None
            for path, (url, file_id) in ids.items():
                assert (await call(b_url, "DELETE", f"{url}/{file_id}")).status_code == 200
            # at once: the agent stays linked, so only a tell across the nodes can remove them
            await wait_for(lambda: not (root / "etc/app/own").exists(), timeout=10)
            await wait_for(lambda: not (root / "etc/app/shared").exists(), timeout=10)

            # uploaded through B: the device's file and its configuration's reach it too
            for url, path in ((durl, "/etc/app/own-b"), (curl, "/etc/app/shared-b")):
                r = await call(b_url, "POST", url, json={"path": path, "content_base64": b64(b"b")})
                assert r.status_code == 201, r.text
            await wait_for(lambda: (root / "etc/app/own-b").exists() and (root / "etc/app/shared-b").exists(),
                           timeout=15)
            assert agent.agent.statistics().links == 1
            await agent.kill()
            nursery.cancel_scope.cancel()


async def _applied(a, device_id: str) -> bool:
    d = (await a.call("GET", f"/v1/devices/{device_id}")).json()["data"]
    return d["configuration"]["status"] == "applied"


@needs_registry
async def test_a_registry_login_rotated_on_node_b_reaches_the_device_node_a_holds(nats_server, db_url, tmp_path):
    """The tell that sends a device its version's logins crosses nodes as the secret files' do."""
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            reg = await start_registry(nursery, tmp_path / "registry", build=False, htpasswd={"puller": "first-Pa55"})
            image = await reg.push_blank("app/web", "1")
            a, b_services, b_url = await two_nodes(nursery, db_url, tmp_path / "hub", nats_server.url)
            for s in (a.services, b_services):
                s.settings = replace(s.settings, registries=(reg.host,))
            device_id, token = await a.provision("edge-1")
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent", container_engine=FakeEngine())
            await wait_for(lambda: _online_at(a.services, device_id, "a"), timeout=20)

            async def call(node: str, method: str, path: str, **kw):
                return await a.client.request(method, f"{node}{path}", headers=a.headers, **kw)

            r = await call(a.base_url, "POST", "/v1/registry-credentials",
                           json={"registry": reg.host, "username": "puller", "password": "first-Pa55"})
            assert r.status_code == 201, r.text
            r = await call(a.base_url, "POST", "/v1/configurations",
                           json={"name": "app", "spec": {"containers": [{"name": "web", "image": image}]}})
            assert r.status_code == 201, r.text
            r = await call(a.base_url, "PUT", f"/v1/devices/{device_id}/configuration",
                           json={"configId": r.json()["data"]["id"]})
            assert r.status_code == 202, r.text
            await wait_for(lambda: _applied(a, device_id), timeout=20)
            auth_file = agent.agent.data_dir / "registry-auth.json"

            def login() -> str:
                return base64.b64decode(json.loads(auth_file.read_text())["auths"][reg.host]["auth"]).decode()

            assert login() == "puller:first-Pa55"
            r = await call(b_url, "POST", "/v1/registry-credentials",
                           json={"registry": reg.host, "username": "puller", "password": "second-Pa55"})
            assert r.status_code == 200, r.text
            await wait_for(lambda: login() == "puller:second-Pa55", timeout=20)
            nursery.cancel_scope.cancel()
