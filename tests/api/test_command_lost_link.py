"""A device whose link drops while a command waits for its reply: the caller hears device_offline
(503), the device's actor keeps serving, and the next command after it reconnects works. Before, the
link's DeviceOffline was not among the outcomes the actor expected, so it crashed the actor and the
caller got 500 ("actor ... crashed while sending reboot")."""

from __future__ import annotations

import uuid

import trio

from tests.api.test_memtests import ScriptedDevice, connect
from tests.hubtools import start_hub, wait_for


async def test_a_link_that_drops_before_the_reply_is_503_device_offline_and_the_actor_lives(
        nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=5.0)
        dev_id, device = await connect(hub, nursery, name="drops")
        actor = hub.services.registry.lookup(("device", uuid.UUID(dev_id)))
        restarts = actor.statistics().restarts

        async def drop_instead_of_answering(payload: dict) -> dict:
            await device.ws.aclose(1011, "power cut")
            await trio.sleep_forever()

        device.handlers["reboot"] = drop_instead_of_answering
        r = await hub.call("POST", f"/v1/devices/{dev_id}/reboot")
        assert r.status_code == 503 and r.json()["error"] == "device_offline", r.text

        # the same device comes back and is served by a live actor
        again = ScriptedDevice(hub, device.token)
        await nursery.start(again.run)
        again.handlers["reboot"] = lambda payload: _rebooting()

        async def answered() -> bool:
            r = await hub.call("POST", f"/v1/devices/{dev_id}/reboot")
            return r.status_code == 202

        await wait_for(answered, timeout=20, interval=0.2)
        # one actor throughout, never crashed and restarted
        assert hub.services.registry.lookup(("device", uuid.UUID(dev_id))) is actor
        assert actor.statistics().restarts == restarts


async def _rebooting() -> dict:
    return {"rebooting": True}
