"""The simulator: N real agents in one process, each in its own device directory."""

from __future__ import annotations

import functools
import json
import stat

import httpx
import pytest
import trio

from device_client.sim import SimError, run_sim

from device_fakehub import FakeHub

FAST = {"backoff_initial": 0.01, "backoff_max": 0.04}
FLEET_ID = "5b0c1f3e-8d2a-4c61-9f0e-3a7b2c4d5e6f"


@pytest.fixture
async def hub(nursery):
    return await nursery.start(FakeHub().serve)


async def collect_links(hub: FakeHub, n: int) -> list:
    return [await hub.next_link() for _ in range(n)]


async def test_pre_provisioned_devices_connect_into_their_own_dirs(hub, nursery, tmp_path):
    devices = [(f"d{i}", f"tok{i}") for i in range(5)]
    hub.tokens = {token: device_id for device_id, token in devices}
    with trio.fail_after(10):
        agents = await nursery.start(functools.partial(
            run_sim, hub.url, 5, tmp_path, devices=devices, connect_concurrency=2, agent_options=FAST))
        assert len(agents) == 5 and all(a.connected for a in agents)
        assert sorted(a.device_id for a in agents) == [d for d, _ in devices]
        links = await collect_links(hub, 5)
        assert sorted(link.authorization for link in links) == sorted(f"Bearer {t}" for _, t in devices)
        # five distinct identities, one per device directory
        assert len({link.hello.tunnelPublicKey for link in links}) == 5
        for device_id, _ in devices:
            assert (tmp_path / "devices" / device_id / "root").is_dir()
            assert (tmp_path / "devices" / device_id / "identity.key").is_file()
        registry = json.loads((tmp_path / "sim.json").read_text())
        assert registry == {"devices": [{"id": d, "token": t} for d, t in devices]}
        assert stat.S_IMODE((tmp_path / "sim.json").stat().st_mode) == 0o600
        # they are real agents: they answer commands
        assert all([(await link.command("ping")).ok for link in links])


async def test_provisions_missing_devices_with_a_pat(hub, nursery, tmp_path):
    hub.tokens = {"tok-old": "old"}
    (tmp_path / "sim.json").write_text(json.dumps({"devices": [{"id": "old", "token": "tok-old"}]}))
    requests = []
    lookups = []

    def provision(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # --fleet by its name: looked up once, with the PAT
            lookups.append(request)
            return httpx.Response(200, json={"data": [{"id": FLEET_ID, "name": "edge"}],
                                             "pagination": {"page": 1, "limit": 5, "total": 1, "totalPages": 1}})
        requests.append(request)
        body = json.loads(request.content)
        device_id = f"new-{body['name']}"
        hub.tokens[f"tok-{device_id}"] = device_id
        return httpx.Response(201, json={"data": {"id": device_id, "token": f"tok-{device_id}",
                                                  "name": body["name"]}})

    with trio.fail_after(10):
        agents = await nursery.start(functools.partial(
            run_sim, hub.url, 3, tmp_path, pat_id="pid", pat_secret="psecret", org_id="org1",
            fleet="edge", http_transport=httpx.MockTransport(provision), agent_options=FAST))
        assert all(a.connected for a in agents)
        assert len(requests) == 2
        for request in requests:
            assert request.method == "POST" and request.url.path == "/v1/devices"
            assert request.headers["X-API-Token-ID"] == "pid"
            assert request.headers["X-API-Secret-Key"] == "psecret"
            assert request.headers["X-Organization-ID"] == "org1"
        bodies = sorted(json.loads(r.content)["name"] for r in requests)
        assert bodies == ["sim-2", "sim-3"]
        assert all(json.loads(r.content)["fleet_id"] == FLEET_ID for r in requests)
        assert [(r.url.path, dict(r.url.params)) for r in lookups] == [("/v1/fleets", {"name": "edge", "limit": "5"})]
        assert lookups[0].headers["X-API-Token-ID"] == "pid" and lookups[0].headers["X-Organization-ID"] == "org1"
        ids = [d["id"] for d in json.loads((tmp_path / "sim.json").read_text())["devices"]]
        assert ids[0] == "old" and sorted(ids[1:]) == ["new-sim-2", "new-sim-3"]
        assert sorted(a.device_id for a in agents) == sorted(ids)


async def test_hub_refusing_to_provision_keeps_what_was_created(tmp_path):
    def refuse(request):
        return httpx.Response(403, json={"error": {"code": "forbidden"}})

    with trio.fail_after(5):
        with pytest.raises(SimError, match="HTTP 403"):
            await run_sim("http://127.0.0.1:9", 2, tmp_path, pat_id="p", pat_secret="s",
                          http_transport=httpx.MockTransport(refuse))
        assert json.loads((tmp_path / "sim.json").read_text()) == {"devices": []}


async def test_too_few_devices_without_a_pat_is_a_clear_error(tmp_path):
    with trio.fail_after(5):
        with pytest.raises(SimError, match="has 1 devices, 3 wanted"):
            await run_sim("http://127.0.0.1:9", 3, tmp_path, devices=[("a", "t")])


async def test_unsafe_device_ids_are_refused(tmp_path):
    with trio.fail_after(5):
        with pytest.raises(SimError, match="directory name"):
            await run_sim("http://127.0.0.1:9", 1, tmp_path, devices=[("../etc", "t")])
