"""Graceful shutdown: a stopping hub turns not-ready, tells its devices to reconnect to its successor
(FLEETHUB_SUCCESSOR_URL) within the drain window, lets HTTP finish, and returns; the devices come
back on the successor without waiting out a backoff."""

from __future__ import annotations

import uuid

import trio

from hub.server import run_hub
from hub.settings import Settings
from tests.hubtools import start_agent, start_hub, wait_for


async def test_stopping_hub_hands_its_devices_to_the_successor(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        successor = await start_hub(nursery, db_url, tmp_path / "successor")
        device_id, token = await successor.provision("drained")

        stopping, returned = trio.Event(), trio.Event()
        settings = Settings(data_dir=tmp_path / "old", database_url=db_url, port=0, drain_window=3.0,
                            successor_url=successor.base_url)

        async def old_hub(task_status=trio.TASK_STATUS_IGNORED):
            try:
                await run_hub(settings, stopping=stopping, task_status=task_status)
            finally:
                returned.set()

        old_services, old_url = await nursery.start(old_hub)
        # a slow backoff: without the drain the device would take a minute to come back
        running = await start_agent(nursery, old_url, token, tmp_path / "agent", backoff_initial=60, backoff_max=60)
        agent = running.agent
        assert uuid.UUID(device_id) in old_services.links and agent.statistics().links == 1

        stopping.set()
        await wait_for(lambda: old_services.draining, timeout=5)
        r = await successor.client.get(old_url + "/readyz")
        assert r.status_code == 503 and r.json()["error"] == "draining"
        await wait_for(returned.is_set, timeout=20)  # the old hub finished by itself

        await wait_for(lambda: uuid.UUID(device_id) in successor.services.links, timeout=10)
        assert agent.hub_url == successor.base_url and agent.statistics().links == 2
        r = await successor.call("POST", f"/v1/devices/{device_id}/ping")
        assert r.status_code == 200, r.text


async def test_drain_payload_is_checked_by_the_agent(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        device_id, token = await hub.provision("picky")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        s = hub.services
        for bad in ({"reconnectAfter": -1}, {"reconnectAfter": "soon"}, {"url": "ftp://elsewhere"}):
            try:
                await s.bus.request(f"cmd.{device_id}.link.drain", bad, timeout=5)
            except Exception as exc:  # the device's error reply
                assert "invalid_payload" in f"{getattr(exc, 'code', '')}{exc}"
            else:
                raise AssertionError(f"{bad} was accepted")
        assert running.agent.connected and running.agent.statistics().links == 1
