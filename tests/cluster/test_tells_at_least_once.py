"""Tells that must arrive do, at least once (issue 38): a secret file saved and one deleted through a node
cut off from NATS reach the device another node holds once the bus is back, with the device staying
linked (no hello to make good a lost tell)."""

from __future__ import annotations

import base64

import trio

from tests.cluster.natstools import CuttableLink
from tests.cluster.test_two_nodes import _online_at
from tests.hubtools import open_hub, start_agent, start_hub, wait_for


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_a_tell_sent_while_the_bus_is_down_arrives_when_it_is_back(nats_server, db_url, tmp_path):
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            link = await nursery.start(CuttableLink(int(nats_server.url.rsplit(":", 1)[1])).run)
            data = tmp_path / "hub"
            a = await start_hub(nursery, db_url, data, nats_url=nats_server.url, node_id="a")
            b_services, b_url = await open_hub(nursery, db_url, data, nats_url=link.url, node_id="b")
            device_id, token = await a.provision("edge-1")
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent")
            root = agent.agent.root
            await wait_for(lambda: _online_at(a.services, device_id, "a"), timeout=20)
            url = f"/v1/devices/{device_id}/secret-files"

            async def on_b(method: str, path: str, **kw):
                return await a.client.request(method, f"{b_url}{path}", headers=a.headers, **kw)

            r = await on_b("POST", url, json={"path": "/etc/app/old", "content_base64": b64(b"old")})
            assert r.status_code == 201, r.text
            old_id = r.json()["data"]["id"]
            await wait_for(lambda: (root / "etc/app/old").exists(), timeout=15)

            tells = b_services.topology.tells
            before = tells.delivered
            link.cut()  # B cannot reach NATS; PostgreSQL it still reaches, and it answers REST
            r = await on_b("POST", url, json={"path": "/etc/app/new", "content_base64": b64(b"new")})
            assert r.status_code == 201, r.text
            assert (await on_b("DELETE", f"{url}/{old_id}")).status_code == 200
            await trio.sleep(3)  # longer than a tell's first tries: they fail and are tried again
            assert not (root / "etc/app/new").exists() and (root / "etc/app/old").exists()
            assert tells.retries > 0 and tells.delivered == before

            await link.restore()
            await wait_for(lambda: (root / "etc/app/new").exists(), timeout=20)
            await wait_for(lambda: not (root / "etc/app/old").exists(), timeout=20)
            assert (root / "etc/app/new").read_bytes() == b"new"
            assert agent.agent.statistics().links == 1  # no relink: the tells themselves arrived
            # Either tell's reconcile sends the device the whole file set, so both files can be right
            # while the other tell still waits out its backoff: it must still arrive, and none dropped.
            await wait_for(lambda: tells.delivered == before + 2, timeout=20)
            assert tells.dropped == 0
            await agent.kill()
            nursery.cancel_scope.cancel()
