"""The tunnel control plane against a real agent (webrtc/device_tunnel.py) and a real aiortc offer:
the agent verifies the hub's grant with the keys from its welcome, answers with its SDP or refuses
with the spec's codes, and reports usage the hub records when the session closes.
"""

from __future__ import annotations

import uuid

import pytest
import trio

from device_client.tunnel import TunnelConfig
from tests.api.test_tunnels import bearer, entitle, tunnel_error, tunnel_token
from tests.hubtools import start_agent, start_hub, wait_for

pytestmark = pytest.mark.usefixtures("loopback_ice")


@pytest.fixture
def loopback_ice(monkeypatch):
    monkeypatch.setenv("FLEETHUB_ICE_ADDRESSES", "127.0.0.1")


async def real_offer() -> tuple[object, dict]:
    from webrtc.peer import TunnelPeer

    peer = TunnelPeer()
    return peer, await peer.create_offer()


async def test_real_agent_answers_refuses_and_reports(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=10.0)
        await entitle(hub)
        dev_id, token = await hub.provision("agent")
        config = TunnelConfig(targets={"echo": ("127.0.0.1", 9)}, allowed_ports=frozenset({8080}), ssh=False)
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent", tunnel=config)
        assert running.agent.hub_keys == hub.services.tunnels.grants.hub_keys
        ttoken = await tunnel_token(hub)

        async def call(target: str, offer: dict):
            return await hub.call("POST", "/v1/cli/tunnel/session", headers=bearer(ttoken),
                                  json={"device_id": dev_id, "target": target, "offer": offer})

        peer, offer = await real_offer()
        try:
            # Refusals by the agent itself, after it verified the grant.
            tunnel_error(await call("ssh", offer), 409, "ssh_disabled")
            tunnel_error(await call("db", offer), 404, "target_not_configured")  # the hub's, from the hello
            r = await call("echo", offer)
            assert r.status_code == 200, r.text
            data = r.json()["data"]
            assert data["answer"]["type"] == "answer" and "a=fingerprint:" in data["answer"]["sdp"]
            sid = data["session_id"]
            r = await hub.call("DELETE", f"/v1/cli/tunnel/session/{sid}", headers=bearer(ttoken))
            assert r.status_code == 200, r.text
            assert r.json()["data"]["device_acknowledged"] is True
        finally:
            await peer.close()

        async def closed() -> bool:
            row = await hub.services.tunnels.store.get(uuid.UUID(sid))
            return row["state"] == "closed"
        await wait_for(closed)
        row = await hub.services.tunnels.store.get(uuid.UUID(sid))
        assert row["close_reason"] == "closed by the client" and row["duration_seconds"] > 0
