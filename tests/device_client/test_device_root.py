"""``--device-root``: where device paths land. By default a sandbox below the data dir; on a device in
service ``/``, so a file for /etc/app/key is the real /etc/app/key. Here a directory of the test's
stands in for ``/``: a real hub, a real agent, a device secret file uploaded through the API."""

from __future__ import annotations

import base64

import pytest
import trio

from device_client.agentconfig import AgentConfig
from device_client.check import check_dirs
from tests.hubtools import start_agent, start_hub, wait_for


async def test_a_file_lands_under_the_device_root_and_not_in_the_data_dir(nursery, db_url, tmp_path):
    root, data = tmp_path / "device", tmp_path / "agent-data"
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        dev, token = await hub.provision("real-paths")
        await start_agent(nursery, hub.base_url, token, data, device_root=root)
        r = await hub.call("POST", f"/v1/devices/{dev}/secret-files",
                           json={"path": "/etc/app/key", "content_base64": base64.b64encode(b"k3y").decode()})
        assert r.status_code == 201, r.text
        await wait_for(lambda: _exists(root / "etc/app/key"), timeout=20)
    assert (root / "etc/app/key").read_bytes() == b"k3y"
    assert not (data / "root" / "etc").exists()


async def _exists(path) -> bool:
    return path.exists()


def test_the_data_dir_may_not_sit_in_the_platform_directory(tmp_path):
    with pytest.raises(ValueError, match="inside the device's platform directory"):
        AgentConfig("http://hub", "t", tmp_path / "var/lib/fleethub/agent", device_root=tmp_path)
    with pytest.raises(ValueError, match="absolute"):
        AgentConfig("http://hub", "t", tmp_path / "data", device_root="relative/root")
    assert AgentConfig("http://hub", "t", tmp_path / "var/lib/fleethub-agent", device_root=tmp_path).device_root == tmp_path


def test_the_check_probes_the_platform_directory_of_a_device_root(tmp_path):
    data, root = tmp_path / "data", tmp_path / "root"
    data.mkdir()
    root.mkdir()
    [_, made_later] = check_dirs(data, root)
    assert made_later.ok and "made at the first start" in made_later.detail
    (root / "var/lib/fleethub").mkdir(parents=True)
    [_, writable] = check_dirs(data, root)
    assert writable.ok and "platform directory) is writable" in writable.detail
    assert sorted(p.name for p in (root / "var/lib/fleethub").iterdir()) == []  # the probe left nothing
