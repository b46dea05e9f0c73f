"""An SSE stream on one node that may have missed events while the bus was down says so (issue 38 item
4): when the node's bus comes back, it reads the event log after the last cursor it sent (the events it
missed, in order: docs/events.md), or, with the log off, sends a fresh snapshot. Before, a stream on
node B went on showing a device online (or a rollout running) that had changed on node A during the
outage."""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest
import trio

from tests.cluster.test_two_nodes import two_nodes
from tests.hubtools import start_agent, wait_for
from tests.proctools import sigstop

BOUND = 15.0  # from SIGCONT to the fresh snapshot: a reconnect (0.5 s), A's write-behind, B's row cache (2 s)


async def _collect(response, into: list[dict]) -> None:
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            into.append(json.loads(line[6:]))


@pytest.mark.parametrize("event_log", [True, False], ids=["missed-events-from-the-log", "fresh-snapshot"])
async def test_a_stream_on_node_b_shows_what_it_missed_when_nats_comes_back(nats_server, db_url, tmp_path, event_log):
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            a, b_services, b_url = await two_nodes(nursery, db_url, tmp_path / "hub", nats_server.url,
                                                   event_log=event_log)
            device_id, token = await a.provision("edge-1")
            agent = await start_agent(nursery, a.base_url, token, tmp_path / "agent")  # linked to A

            async def online_on_b() -> bool:
                r = await a.client.get(f"{b_url}/v1/devices/{device_id}", headers=a.headers)
                return r.json()["data"]["online"]

            await wait_for(online_on_b, timeout=20, interval=0.1)
            seen: list[dict] = []
            async with a.client.stream("GET", f"{b_url}/v1/devices/{device_id}/events", headers=a.headers) as r, \
                    trio.open_nursery() as reading:
                assert r.status_code == 200
                reading.start_soon(_collect, r, seen)
                await wait_for(lambda: seen and seen[0]["payload"]["online"] is True, timeout=10)
                await wait_for(lambda: ("device", uuid.UUID(device_id)) in b_services.events._remote, timeout=5)

                sigstop(nats_server.proc.pid)  # returns once it has stopped
                try:
                    await wait_for(lambda: not a.services.bus.connected and not b_services.bus.connected, timeout=10)
                    await agent.kill()  # the change B cannot hear: A sees the link close, the device is offline
                    await wait_for(lambda: uuid.UUID(device_id) not in a.services.links, timeout=10)
                    await trio.sleep(1.5)  # A's presence row is written behind (0.5 s)
                    heard = len(seen)
                finally:
                    os.kill(nats_server.proc.pid, signal.SIGCONT)
                back = trio.current_time()
                assert all(e["kind"] != "device.state" for e in seen[1:heard]), seen  # lost, as expected

                # with the log: the device.state event it missed; without: a second snapshot
                shown = "device.state" if event_log else "device.snapshot"

                def offline_shown() -> bool:
                    latest = [e for e in seen[heard:] if e["kind"] == shown]
                    return bool(latest) and latest[-1]["payload"]["online"] is False

                await wait_for(offline_shown, timeout=BOUND, interval=0.1)
                took = trio.current_time() - back
                assert b_services.events.resyncs >= 1
                print(f"node B's stream showed the device offline ({shown}) {took:.2f} s after nats-server was resumed")
                reading.cancel_scope.cancel()
            nursery.cancel_scope.cancel()
