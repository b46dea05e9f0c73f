"""The console's server side without a browser: its pages and CSP, `/`, and the organisation event
stream (who may open it, and that a device's change arrives on it)."""

from __future__ import annotations

import json

import pytest
import trio

from tests.hubtools import start_agent, start_hub


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)


async def test_pages_carry_a_strict_csp_and_check_their_ids(hub):
    with trio.fail_after(20):
        r = await hub.client.get(hub.base_url + "/console/devices")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe" not in csp
        assert "<script>" not in r.text and " style=" not in r.text  # no inline script or style
        assert (await hub.client.get(hub.base_url + "/console/devices/%3Cimg%3E")).status_code == 404
        r = await hub.client.get(hub.base_url + "/console/static/app.js")
        assert r.status_code == 200 and "javascript" in r.headers["content-type"]
        assert (await hub.client.get(hub.base_url + "/console/static/../pages.py")).status_code == 404
        r = await hub.client.get(hub.base_url + "/")
        assert r.status_code == 302 and r.headers["location"].endswith("/console/signin")
        r = await hub.client.get(hub.base_url + "/", headers={"Cookie": "fleethub_session=x"})
        assert r.headers["location"].endswith("/console/devices")


async def test_organisation_stream_needs_org_viewer_and_carries_device_state(hub, nursery, tmp_path):
    with trio.fail_after(30):
        url = hub.base_url + "/console/api/events"
        pat_id, secret = await hub.new_user("member")
        member = {"X-API-Token-ID": pat_id, "X-API-Secret-Key": secret, "X-Organization-ID": hub.org_id}
        r = await hub.client.get(url, headers=member)
        assert r.status_code == 403, r.text
        assert (await hub.client.get(url, headers={"X-Organization-ID": hub.org_id})).status_code == 401
        dev, token = await hub.provision("streamed")
        async with hub.client.stream("GET", url, headers=hub.headers) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = r.aiter_lines()
            assert await anext(lines) == "event: org.snapshot"
            await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
            async for line in lines:
                if line.startswith("data: ") and '"device.state"' in line:
                    event = json.loads(line[6:])
                    if event["deviceId"] == dev and event["payload"]["online"]:
                        break
