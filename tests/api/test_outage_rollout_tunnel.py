"""PostgreSQL stopped for over a minute under a hub in the middle of a rollout and of a tunnel session
(issue 14, item 1). Everything is real: the embedded PostgreSQL (stopped and started on its data dir,
as tests/api/test_db_outage.py does), the hub, device agents applying a workload that logs each start,
and a WebRTC tunnel from the in-process client to an agent.

The hub stays up and says it is not ready while PostgreSQL is away; no actor restarts; afterwards the
rollout completes with every device's workload started exactly once for the version, and the tunnel,
whose grant ran out during the outage (renewals need storage), is closed and recorded with its bytes.
"""

from __future__ import annotations

import uuid

import pytest
import trio

from device_client.shared.paths import VOLUMES_DIR
from device_client.tunnel import TunnelConfig
from storage.embedded import EmbeddedPostgres
from tests.api.test_rollouts import config, fleet_with_agents, rollout_state
from tests.api.test_tunnels import entitle
from tests.e2e.killtools import COUNTING_WORKLOAD, EchoServer, workload_starts
from tests.hubtools import assert_error, metric_value, metrics, start_agent, start_hub, wait_for
from tests.ports import free_port
from webrtc.client import Credentials
from webrtc.trio_client import run_tunnel_in_trio

OUTAGE = 62.0  # seconds PostgreSQL is down: over the supervisor's 60 s escalation window
GRANT = 20.0   # the tunnel's grant runs out during the outage


@pytest.fixture
def loopback_ice(monkeypatch):
    monkeypatch.setenv("FLEETHUB_ICE_ADDRESSES", "127.0.0.1")


async def echo(port: int, payload: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(payload)
        got = b""
        while len(got) < len(payload):
            got += await stream.receive_some(65536)
    return got


async def test_postgresql_down_a_minute_mid_rollout_and_mid_tunnel(nursery, tmp_path, loopback_ice, request):
    pg = EmbeddedPostgres(tmp_path / "pg", port=free_port())  # free for the restart too (tests/ports.py)
    await trio.to_thread.run_sync(pg.start)
    echo_server = EchoServer()
    request.addfinalizer(echo_server.close)
    try:
        with trio.fail_after(OUTAGE + 110):
            hub = await start_hub(nursery, pg.dsn, tmp_path / "hub", heartbeat_interval=0.5,
                                  command_timeout=10.0, tunnel_grant_seconds=GRANT)
            s = hub.services
            await entitle(hub)

            # ---- a tunnel session carrying bytes ----
            tun_id, tun_token = await hub.provision("tunnel-device")
            await start_agent(nursery, hub.base_url, tun_token, tmp_path / "tun", tunnel=TunnelConfig(
                targets={"echo": ("127.0.0.1", echo_server.port)}, allowed_ports=frozenset(), ssh=False))
            creds = Credentials(org_id=hub.org_id, pat_id=hub.pat[0], pat_secret=hub.pat[1])
            ended: list[str] = []

            async def tunnel(task_status=trio.TASK_STATUS_IGNORED):
                ended.append(await run_tunnel_in_trio(hub.base_url, creds, tun_id, "echo", task_status=task_status))

            ready = await nursery.start(tunnel)
            payload = b"x" * 50_000
            assert await echo(ready.port, payload) == payload
            sid = uuid.UUID(ready.session_id)

            # ---- a rollout half way: canary done, the next device updating ----
            for i in range(3):  # where COUNTING_WORKLOAD logs its starts (the simulator makes it)
                (tmp_path / f"o-{i}" / "root" / VOLUMES_DIR.lstrip("/")).mkdir(parents=True)
            fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 3, name="o")
            cid, vid = await config(hub, "counting", COUNTING_WORKLOAD)
            r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid,
                                                             "batch_size": 1})
            assert r.status_code == 201, r.text
            rid = r.json()["data"]["id"]

            async def mid_rollout() -> bool:
                counts = (await rollout_state(hub, rid))["counts"]
                return counts["succeeded"] >= 1 and counts["updating"] + counts["verifying"] >= 1
            await wait_for(mid_rollout, timeout=30, interval=0.05)

            # ---- PostgreSQL away for over a minute ----
            await trio.to_thread.run_sync(pg.stop)
            down_at = trio.current_time()
            r = await hub.client.get(hub.base_url + "/readyz")
            assert r.status_code == 503, r.text
            assert_error(await hub.call("GET", f"/v1/rollouts/{rid}"), 503, "database_unavailable")
            while trio.current_time() - down_at < OUTAGE:
                await trio.sleep(5)
                assert (await hub.client.get(hub.base_url + "/healthz")).status_code == 200, "the hub is up"
                assert (await hub.client.get(hub.base_url + "/readyz")).status_code == 503
            text = await metrics(hub)
            assert metric_value(text, "fleethub_actor_restarts_total") == 0
            assert metric_value(text, "fleethub_actor_storage_waits_total") > 0
            assert ended, "the device closed the tunnel when its grant ran out, PostgreSQL or not"
            assert metric_value(text, "fleethub_write_behind_pending", {"kind": "tunnel_usage"}) == 1  # its final usage waits

            # ---- back ----
            await trio.to_thread.run_sync(pg.start)

            async def ready_again() -> bool:
                return (await hub.client.get(hub.base_url + "/readyz")).status_code == 200
            await wait_for(ready_again, timeout=30, interval=0.2)

            async def settled() -> bool:
                return (await rollout_state(hub, rid))["state"] != "running"
            await wait_for(settled, timeout=60, interval=0.2)
            final = await rollout_state(hub, rid)
            assert final["state"] == "completed" and final["counts"]["succeeded"] == 3, final
            for i, (dev, running) in enumerate(agents.items()):
                assert running.agent.configs.version_applied() == vid
                # started exactly once for the version: the outage made nobody apply it again
                assert workload_starts(tmp_path / f"o-{i}") == [vid], (dev, workload_starts(tmp_path / f"o-{i}"))

            async def recorded() -> dict | None:
                row = await s.tunnels.store.get(sid)
                return row if row["state"] == "closed" and row["bytes_in"] + row["bytes_out"] > 0 else None
            await wait_for(recorded, timeout=30, interval=0.2)
            row = await s.tunnels.store.get(sid)
            assert row["bytes_in"] + row["bytes_out"] >= len(payload), row
            assert s.supervisor.restarts_total == 0
    finally:
        await trio.to_thread.run_sync(pg.stop)
