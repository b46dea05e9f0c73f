import trio
from tests.hubtools import start_hub


async def test_smoke(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        r = await hub.call("GET", "/healthz")
        assert r.status_code == 200
        dev_id, token = await hub.provision("a")
        r = await hub.call("GET", f"/v1/devices/{dev_id}")
        assert r.status_code == 200, r.text
        print(r.json())
        nursery.cancel_scope.cancel()
