"""Device facts (issue 37 item 9) through a real hub: a real agent's hello and telemetry carry its
uptime, addresses and CPU, memory and disk use, and GET /v1/devices/{id} shows them; a hostile hello
is cut to its bounds, the link goes on, and the cut is counted in the device's diagnosis."""

from __future__ import annotations

import json
import uuid

import trio

from device_client.agent import AGENT_VERSION
from device_client.shared import systemfacts
from tests.api.billing_helpers import admin
from tests.api.test_link_protocol import connect, diagnosis
from tests.hubtools import device, start_agent, start_hub, wait_for


async def test_a_real_agents_facts_arrive_and_telemetry_refreshes_them(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.2)
        dev_id, token = await hub.provision("facts")
        agent = (await start_agent(nursery, hub.base_url, token, tmp_path / "agent")).agent
        shown = await device(hub, dev_id)
        assert shown["agent_version"] == AGENT_VERSION
        system = shown["system"]
        assert system["uptime_seconds"] > 0 and 0 <= system["cpu_percent"] <= 100
        assert 0 < system["memory_percent"] <= 100 and system["memory_total_bytes"] > 0
        assert 0 <= system["disk_percent"] <= 100 and system["disk_total_bytes"] > 0
        assert len(system["ip_addresses"]) <= systemfacts.MAX_IP_ADDRESSES
        assert all(not a.startswith("127.") and a != "::1" for a in system["ip_addresses"])
        first_at = system["at"]

        # with the telemetry feature on, every sample brings the newest facts
        await admin(hub, tmp_path, "billing-profile", hub.org_id, "--plan", "pro")
        r = await hub.call("PUT", "/v1/billing/features/telemetry", json={"enabled": True})
        assert r.status_code == 200, r.text
        agent.telemetry.configure(interval=0.05)
        await wait_for(lambda: agent.telemetry.sent >= 2)

        async def refreshed() -> bool:
            return (await device(hub, dev_id))["system"]["at"] > first_at

        with trio.fail_after(10):
            while not await refreshed():
                await trio.sleep(0.05)
        # and stored: the presence row written behind carries them, for when the actor is gone
        with trio.fail_after(10):
            while (((await hub.services.stores.devices.get_any(uuid.UUID(dev_id)))["facts"] or {}).get("system") or {}).get(
                    "at", "") <= first_at:
                await trio.sleep(0.1)


async def test_a_hello_with_fifty_thousand_addresses_is_cut_counted_and_said(nursery, db_url, tmp_path, caplog):
    """Issue 31 item 5 found a hello with 50,000 tunnelTargets made GET device 821 KB: facts stay small,
    tunnel targets included."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        dev_id, token = await hub.provision("hostile")
        addresses = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(50_000)]
        targets = {"names": [f"t{i}" for i in range(10_000)] + ["n" * 65], "ports": list(range(1, 5_000)) + [0, 70_000]}
        hello = {"firmware": "fw", "architecture": "x86_64", "agentVersion": "v" * 10_000, "tunnelTargets": targets,
                 "system": {"ipAddresses": addresses, "cpuPercent": 1e300, "uptimeSeconds": 60,
                            "junk": ["x"] * 10_000}}
        dev = await connect(nursery, hub, token, hello=hello)
        r = await hub.call("GET", f"/v1/devices/{dev_id}")
        assert r.status_code == 200 and len(r.content) < 4096, len(r.content)
        shown = r.json()["data"]
        assert shown["online"] and dev.closed is None  # the link goes on
        assert shown["agent_version"] == "v" * 64
        assert shown["system"]["ip_addresses"] == addresses[:16]
        assert shown["system"]["cpu_percent"] is None and shown["system"]["uptime_seconds"] == 60
        issue = (await diagnosis(hub, dev_id))["DeviceProtocolError"]
        # every note in the log line; the diagnosis keeps the first 300 characters of them
        logged = [r.getMessage() for r in caplog.records if r.name == "fleethub.link" and "hello:" in r.getMessage()]
        assert len(logged) == 1 and "system.ipAddresses: 50000 given, the first 16 kept" in logged[0]
        assert "system.cpuPercent: out of bounds or of the wrong type, left out" in logged[0]
        assert shown["tunnel_targets"]["names"] == targets["names"][:64]
        assert shown["tunnel_targets"]["ports"] == list(range(1, 65))
        # the first notes are the targets' (the diagnosis keeps 300 characters of the last error)
        assert issue["details"]["last"].startswith(
            "hello: agentVersion: 10000 characters, the first 64 kept; tunnelTargets.names: 1 longer than 64 "
            "characters, left out; tunnelTargets.ports: 2 not a TCP port, left out; tunnelTargets.names: 10000 "
            "given, the first 64 kept")
        assert issue["details"]["count"] == 1
        # the list reads the same bounded document
        listed = (await hub.call("GET", "/v1/devices")).json()["data"]
        assert len(json.dumps(listed)) < 4096
