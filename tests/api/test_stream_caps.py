"""Event streams (SSE) held open at once are capped per organisation: 429 too_many_streams."""

from __future__ import annotations

import contextlib
import uuid

import trio

from tests.hubtools import assert_error, start_hub


async def test_the_stream_over_the_cap_is_refused_and_a_closed_one_frees_its_slot(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        hub.services.events.max_per_owner = 2
        device_id, _ = await hub.provision("watched")
        url = f"{hub.base_url}/v1/devices/{device_id}/events"
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(2):
                r = await stack.enter_async_context(hub.client.stream("GET", url, headers=hub.headers))
                assert r.status_code == 200
            r = await hub.call("GET", f"/v1/devices/{device_id}/events")
            assert_error(r, 429, "too_many_streams")
            assert r.headers["Retry-After"] == "5"
        # both streams closed by the client: the hub notices at its next write (an event or keepalive)
        hub.services.events.publish(("device", uuid.UUID(device_id)), {"kind": "probe"})
        with trio.fail_after(10):
            while True:
                async with hub.client.stream("GET", url, headers=hub.headers) as r:
                    if r.status_code == 200:
                        break
                await trio.sleep(0.1)
