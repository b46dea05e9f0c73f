"""A hub stopped and started again on the same database keeps what it was told."""

from __future__ import annotations

import uuid

import httpx
import trio

from tests.hubtools import assert_error, Hub, device, open_hub, start_agent, start_hub, start_stoppable, wait_for

FACTS = {"firmware": "persisted-fw 1.0", "architecture": "riscv64"}


async def test_devices_fleets_and_pats_survive_a_restart(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        first = await start_stoppable(nursery, lambda inner: start_hub(
            inner, db_url, tmp_path / "hub1", heartbeat_interval=0.5, command_timeout=2))
        hub: Hub = first.value
        r = await hub.call("POST", "/v1/fleets", json={"name": "kept", "tags": ["t"], "registry_proxy": True,
                                                       "architecture": "riscv64"})
        assert r.status_code == 201
        fleet = r.json()["data"]
        dev_id, token = await hub.provision("survivor", fleet_id=fleet["id"], tags=["x"])
        other_id, _ = await hub.provision("bystander")
        r = await hub.call("POST", "/v1/pats", json={"description": "kept pat"},
                           headers={k: v for k, v in hub.headers.items() if k != "X-Organization-ID"})
        pat = (r.json()["data"]["id"], r.json()["data"]["secret"])
        r = await hub.call("DELETE", f"/v1/devices/{other_id}")
        assert r.status_code == 200

        # a real agent reports its facts, then the hub stops (its agent with it)
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent", facts=FACTS)

        async def facts_stored() -> bool:
            return (await device(hub, dev_id))["firmware"] == FACTS["firmware"]

        await wait_for(facts_stored, timeout=10)
        await running.kill()
        await first.stop()
        await hub.client.aclose()

        # a new hub process on the same database
        services, base_url = await open_hub(nursery, db_url, tmp_path / "hub2", heartbeat_interval=0.5)
        client = httpx.AsyncClient(timeout=30)
        hub2 = Hub(services, base_url, hub.org_id, hub.user_id, hub.pat, client)
        d = await device(hub2, dev_id)
        assert (d["name"], d["tags"], d["fleet_id"]) == ("survivor", ["x"], fleet["id"])
        assert (d["firmware"], d["architecture"], d["boot_reason"]) == (FACTS["firmware"], "riscv64", "power_on")
        assert d["has_tunnel_identity"] is True
        assert d["online"] is False and d["state"] == "offline" and d["last_seen"] is not None
        r = await hub2.call("GET", f"/v1/devices/{other_id}")
        assert_error(r, 404)
        r = await hub2.call("GET", "/v1/devices")
        assert [x["id"] for x in r.json()["data"]] == [dev_id]

        r = await hub2.call("GET", f"/v1/fleets/{fleet['id']}")
        assert r.status_code == 200
        got = r.json()["data"]
        assert {k: got[k] for k in ("name", "tags", "registry_proxy", "architecture", "device_count")} == \
            {"name": "kept", "tags": ["t"], "registry_proxy": True, "architecture": "riscv64", "device_count": 1}

        # both PATs still authenticate, and the list still hides the secrets
        headers = {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1], "X-Organization-ID": hub.org_id}
        r = await hub2.call("GET", "/v1/devices", headers=headers)
        assert r.status_code == 200
        r = await hub2.call("GET", "/v1/pats")
        assert {p["id"] for p in r.json()["data"]} == {hub.pat[0], pat[0]}
        assert pat[1] not in r.text

        # the same device token connects to the new hub
        await start_agent(nursery, hub2.base_url, token, tmp_path / "agent", facts=FACTS)
        d = await device(hub2, dev_id)
        assert d["online"] is True and d["boot_reason"] == "power_on"
        assert uuid.UUID(dev_id) in services.links
        await client.aclose()


async def test_presence_written_behind_is_flushed_on_shutdown(nursery, db_url, tmp_path):
    """Facts the actor has taken in but not yet written are not lost when the hub stops."""
    with trio.fail_after(60):
        first = await start_stoppable(nursery, lambda inner: start_hub(
            inner, db_url, tmp_path / "hub1", heartbeat_interval=0.5))
        hub: Hub = first.value
        dev_id, token = await hub.provision("quick")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent", facts=FACTS)
        # online in the actor's live view: LinkUp was handled, its row is queued behind
        def actor_online() -> bool:
            actor = hub.services.registry.lookup(("device", uuid.UUID(dev_id)))
            return actor is not None and actor.machine is not None and actor.machine.online

        await wait_for(actor_online)
        await first.stop()
        await running.kill()
        await hub.client.aclose()

        services, base_url = await open_hub(nursery, db_url, tmp_path / "hub2")
        row = await services.stores.devices.get_any(uuid.UUID(dev_id))
        assert (row["firmware"], row["architecture"]) == (FACTS["firmware"], FACTS["architecture"])
        assert row["last_seen_at"] is not None and row["boot_reason"] == "power_on"
        assert row["online"] is False


async def test_agents_reconnect_by_themselves_after_a_hub_restart(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        first = await start_stoppable(nursery, lambda inner: start_hub(
            inner, db_url, tmp_path / "hub1", heartbeat_interval=0.5))
        hub: Hub = first.value
        port = int(hub.base_url.rsplit(":", 1)[1])
        dev_id, token = await hub.provision("loyal")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        await first.stop()
        await hub.client.aclose()
        await wait_for(lambda: not running.agent.connected, timeout=10)

        # the same address, a new process: the agent's backoff brings it back without help
        services, base_url = await open_hub(nursery, db_url, tmp_path / "hub2", heartbeat_interval=0.5,
                                            port=port)
        assert base_url == hub.base_url
        async with httpx.AsyncClient(timeout=30) as client:
            hub2 = Hub(services, base_url, hub.org_id, hub.user_id, hub.pat, client)

            async def back_online() -> bool:
                return (await device(hub2, dev_id))["online"]

            await wait_for(back_online, timeout=15)
            assert running.agent.statistics().links == 2
            assert running.agent.boot_count == 1, "a lost link is not a reboot"
            assert (await device(hub2, dev_id))["boot_reason"] == "power_on"
