"""PostgreSQL stopped and started under a running hub: /readyz says so, requests answer 503 at once
instead of hanging, and the hub recovers by itself (pool and LISTEN connection) when it is back."""

from __future__ import annotations

import json
import time

import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from device_client.agent import link_url

from storage.embedded import EmbeddedPostgres
from tests.hubtools import assert_error, start_hub, wait_for
from tests.ports import free_port


async def test_database_outage_and_recovery(nursery, tmp_path):
    pg = EmbeddedPostgres(tmp_path / "pg", port=free_port())  # free for the restart too (tests/ports.py)
    await trio.to_thread.run_sync(pg.start)
    try:
        with trio.fail_after(120):
            hub = await start_hub(nursery, pg.dsn, tmp_path / "hub")
            s = hub.services
            assert (await hub.call("GET", "/v1/devices")).status_code == 200
            assert s.db.listening()

            await trio.to_thread.run_sync(pg.stop)
            started = time.monotonic()
            r = await hub.client.get(hub.base_url + "/readyz")
            assert r.status_code == 503 and r.json()["error"] in ("not_ready", "database_unavailable")
            r = await hub.call("GET", "/v1/devices")
            assert_error(r, 503, "database_unavailable")
            r = await hub.call("POST", "/v1/fleets", json={"name": "during-outage"})
            assert_error(r, 503, "database_unavailable")
            # a device's link handshake is refused the same way (served in front of Quart:
            # hub/asgi_websocket.py), and the hub goes on serving
            with pytest.raises(ConnectionRejected) as refused:
                async with open_websocket_url(link_url(hub.base_url),
                                              extra_headers=[(b"authorization", b"Bearer dev_not-checked-yet")]):
                    pass
            assert refused.value.status_code == 503
            assert json.loads(refused.value.body)["error"] == "database_unavailable"
            assert time.monotonic() - started < 10, "requests waited instead of failing fast"
            assert (await hub.client.get(hub.base_url + "/healthz")).status_code == 200, "the process is up"

            await trio.to_thread.run_sync(pg.start)  # same data dir and port

            async def ready() -> bool:
                return (await hub.client.get(hub.base_url + "/readyz")).status_code == 200
            await wait_for(ready, timeout=30)
            r = await hub.call("POST", "/v1/fleets", json={"name": "after-outage"})
            assert r.status_code == 201, r.text
            names = [f["name"] for f in (await hub.call("GET", "/v1/fleets")).json()["data"]]
            assert "after-outage" in names and "during-outage" not in names
            # the LISTEN connection for access invalidations is back too
            await wait_for(lambda: s.db.listening() and s.db.reconnects >= 1, timeout=15)
    finally:
        await trio.to_thread.run_sync(pg.stop)
