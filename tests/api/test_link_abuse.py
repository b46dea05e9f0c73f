"""The device link fed what a broken or hostile device might send — frames that are not JSON, not
frames, out of order, or too big: that connection closes with a reason, and nothing else is
affected (another device stays online and answers, the hub stays ready)."""

from __future__ import annotations

import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from device_client.shared import protocol
from device_client.agent import link_url
from hub.api.link import CLOSE_BAD_FRAME, CLOSE_OUT_OF_ORDER, MAX_FRAME_BYTES
from tests.hubtools import start_agent, start_hub, wait_for


async def _linked(hub, token):
    headers = [(b"authorization", f"Bearer {token}".encode())]
    cm = open_websocket_url(link_url(hub.base_url), extra_headers=headers, max_message_size=4 * MAX_FRAME_BYTES)
    ws = await cm.__aenter__()
    await ws.send_message(protocol.encode(protocol.Hello(firmware="raw", architecture="x")))
    assert isinstance(protocol.decode(await ws.get_message()), protocol.Welcome)
    return cm, ws


async def _closed_with(ws) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as info:
        with trio.fail_after(10):
            while True:
                await ws.get_message()
    return info.value.reason.code, info.value.reason.reason or ""


@pytest.mark.parametrize("frame, code, words", [
    ("this is not json", CLOSE_BAD_FRAME, "malformed"),
    ('{"no": "type"}', CLOSE_BAD_FRAME, "malformed"),
    ('{"type": "teleport"}', CLOSE_BAD_FRAME, "malformed"),
    ('[1, 2, 3]', CLOSE_BAD_FRAME, "malformed"),
    ('{"type": "event", "kind": 42}', CLOSE_BAD_FRAME, "malformed"),
    (protocol.encode(protocol.Hello(firmware="again")), CLOSE_OUT_OF_ORDER, "unexpected hello"),
    ('{"type": "command", "id": "x", "subject": "cmd.x.reboot"}', CLOSE_OUT_OF_ORDER, "unexpected command"),
    ('{"type": "welcome", "deviceId": "x", "heartbeatInterval": 1}', CLOSE_OUT_OF_ORDER, "unexpected welcome"),
    ("x" * (MAX_FRAME_BYTES + 1), 1009, ""),
])
async def test_a_bad_frame_closes_only_its_own_link(nursery, db_url, tmp_path, frame, code, words):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        good_id, good_token = await hub.provision("good")
        good = await start_agent(nursery, hub.base_url, good_token, tmp_path / "good")
        bad_id, bad_token = await hub.provision("bad")
        cm, ws = await _linked(hub, bad_token)
        try:
            # a reply nobody asked for is harmless (a late answer to a timed-out command)
            await ws.send_message(protocol.encode(protocol.Reply(id="never-sent", ok=True, payload={})))
            await ws.send_message(protocol.encode(protocol.Event(kind="heartbeat")))
            await ws.send_message(frame)
            got_code, reason = await _closed_with(ws)
        finally:
            await cm.__aexit__(None, None, None)
        assert got_code == code, (got_code, reason)
        assert words in reason

        async def bad_offline() -> bool:
            r = await hub.call("GET", f"/v1/devices/{bad_id}")
            return r.json()["data"]["online"] is False
        await wait_for(bad_offline, timeout=10)
        # the other device is untouched: online, same connection, and it answers a ping
        assert good.agent.connected and good.agent.statistics().links == 1
        r = await hub.call("POST", f"/v1/devices/{good_id}/ping")
        assert r.status_code == 200, r.text
        assert (await hub.client.get(hub.base_url + "/readyz")).status_code == 200
