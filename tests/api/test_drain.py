"""Graceful shutdown: a stopping hub turns not-ready, tells its devices to reconnect to its successor
(FLEETHUB_SUCCESSOR_URL) within the drain window, lets HTTP finish, and returns; the devices come
back on the successor without waiting out a backoff."""

from __future__ import annotations

import uuid

import trio

from hub.server import ServerStopped, run_hub
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


async def _outcome_of_run_hub(nursery, settings):
    """Start ``run_hub`` (no ``stopping``); the list its outcome lands in once it ends."""
    ended: list[BaseException | None] = []

    async def hub(task_status=trio.TASK_STATUS_IGNORED):
        try:
            await run_hub(settings, task_status=task_status)
        except Exception as exc:  # noqa: BLE001 — what the test looks at (trio's nurseries group it)
            while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]
            ended.append(exc)
        else:
            ended.append(None)

    services, _ = await nursery.start(hub)
    return services, ended


async def test_a_hub_whose_services_stop_unasked_raises_instead_of_returning(nursery, db_url, tmp_path):
    """Only ``stopping`` ends run_hub with a return (`fleethub serve` exiting 0). A scope inside it
    cancelled by mistake is an error a supervisor sees, not a quiet stop."""
    with trio.fail_after(30):
        services, ended = await _outcome_of_run_hub(
            nursery, Settings(data_dir=tmp_path / "hub", database_url=db_url, port=0))
        services.nursery.cancel_scope.cancel()
        await wait_for(lambda: ended, timeout=10)
    assert isinstance(ended[0], ServerStopped), ended
    assert "services stopped without being asked to" in str(ended[0])


async def test_a_hub_whose_http_server_returns_unasked_raises(nursery, db_url, tmp_path, monkeypatch):
    """hypercorn returns without an error when its worker is told to terminate or a KeyboardInterrupt
    reaches its tasks; the hub then stops with an error, not as if asked to."""
    import hub.server

    async def serve_then_return(app, config, *, shutdown_trigger=None, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started(["http://127.0.0.1:1"])
        await trio.sleep(0.2)

    monkeypatch.setattr(hub.server, "serve", serve_then_return)
    with trio.fail_after(30):
        _, ended = await _outcome_of_run_hub(nursery, Settings(data_dir=tmp_path / "hub", database_url=db_url, port=0))
        await wait_for(lambda: ended, timeout=10)
    assert isinstance(ended[0], ServerStopped), ended
    assert "HTTP server stopped without being asked to" in str(ended[0])
