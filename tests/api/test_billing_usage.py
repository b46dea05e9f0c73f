"""Proof of billing figures from real activity (issue 8, item 9): real agents connecting (active
devices per UTC day), the bytes the hub's registry proxy served (metered as it meters them,
hub/registry/proxy.py), a tunnel session, priced to the cent with a price change in the middle of the
period and a period across a month boundary.

The days are in 2025, behind the real clock on purpose: service-account tokens carry an ``iat`` that
the JWT library checks against the OS clock, so a hub clock ahead of it would make them immature.

The hub runs on a TestClock whose wall time the test moves from 30 November to 1 December; the
agents share that clock, so the day they report is the hub's day. The tunnel session is written
the way the tunnels module records one — its tunnel_sessions row, and the metering of its minutes
and bytes through ``services.meter`` (hub/metering.py) — because opening a real WebRTC session is
that module's own test.
"""

from __future__ import annotations

import datetime as dt
import uuid

import trio

from device_client.shared.clock import TestClock
from hub.billing.devices import telemetry_counts
from hub.registry.proxy import Puller
from hub.registry.routes import proxy_of
from tests.api.billing_helpers import admin, bearer
from tests.hubtools import start_agent, start_hub, wait_for

UTC = dt.UTC
NOV30 = dt.datetime(2025, 11, 30, 12, 0, tzinfo=UTC)
GB = 10**9


def clock_at(target: dt.datetime) -> TestClock:
    return TestClock(target - dt.timedelta(seconds=trio.current_time()))


async def usage(hub, **params) -> dict:
    r = await hub.call("GET", "/v1/billing/usage", params=params)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    data["by"] = {p["product"]: p for p in data["products"]}
    return data


async def add_tunnel_session(hub, device_id: str, opened: dt.datetime, minutes: int, *, relayed: int = 0,
                             bytes_in: int = 0, bytes_out: int = 0) -> uuid.UUID:
    s, org = hub.services, uuid.UUID(hub.org_id)
    sid = uuid.uuid4()
    closed = opened + dt.timedelta(minutes=minutes)
    await s.db.execute(
        """INSERT INTO tunnel_sessions (id, org_id, device_id, principal_kind, principal_id, target, relay_allowed,
               state, opened_at, expires_at, closed_at, close_reason, duration_seconds, bytes_in, bytes_out,
               relayed_bytes, updated_at)
           VALUES ($1, $2, $3, 'user', $4, 'ssh', true, 'closed', $5, $6, $6, 'client_closed', $7, $8, $9, $10, $6)""",
        sid, org, uuid.UUID(device_id), hub.user_id, opened, closed, minutes * 60, bytes_in, bytes_out, relayed)
    day = opened.date()
    s.meter.add(org, "tunnel_minutes", minutes, day=day)
    s.meter.add(org, "tunnel_bytes", bytes_in + bytes_out, day=day)
    s.meter.add(org, "tunnel_relayed_bytes", relayed, day=day)
    return sid


async def test_usage_and_cost_to_the_cent_across_a_month_boundary_with_a_price_change(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        clock = clock_at(NOV30)
        hub = await start_hub(nursery, db_url, tmp_path, clock=clock, heartbeat_interval=0.1)
        org = hub.org_id
        await admin(hub, tmp_path, "billing-profile", org, "--plan", "pro")
        for argv in (("active_device", "3.00"), ("registry_fallback_bytes", "0.50"), ("tunnel_minutes", "0.10"),
                     ("tunnel_relayed_bytes", "2.00")):
            await admin(hub, tmp_path, "price", *argv, "--from", "2025-01-01")
        # the price change in the middle of the period: this organisation pays 0.80/GB from 1 December
        await admin(hub, tmp_path, "price", "registry_fallback_bytes", "0.80", "--org", org, "--from", "2025-12-01")
        await admin(hub, tmp_path, "price", "tunnel_minutes", "0.20", "--from", "2025-12-02")  # after: no effect

        r = await hub.call("POST", "/v1/fleets", json={"name": "proxied", "registry_proxy": True})
        proxied = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/fleets", json={"name": "aaa-direct"})
        direct = r.json()["data"]["id"]
        a_id, a_token = await hub.provision("a", fleet_id=proxied)
        b_id, b_token = await hub.provision("b", fleet_id=proxied)
        _, c_token = await hub.provision("c", fleet_id=direct)

        # 30 November: three devices connect; a's registry proxy carries 1.5 GB
        agents = [await start_agent(nursery, hub.base_url, t, tmp_path / n, clock=clock)
                  for n, t in (("a", a_token), ("b", b_token), ("c", c_token))]
        proxy = proxy_of(hub.services)  # what the proxy meters as it serves a's pulls (hub/registry/)
        a_puller = Puller(uuid.UUID(a_id), uuid.UUID(org), uuid.UUID(proxied), True)
        proxy.carried(a_puller, 1_000_000_000)
        proxy.carried(a_puller, 500_000_000)

        async def nov30_counted() -> bool:
            u = await usage(hub, **{"from": "2025-11-30", "to": "2025-11-30"})
            return u["by"]["active_device"]["quantity"] == 3 and u["by"]["registry_fallback_bytes"]["quantity"] == 1.5 * GB

        await wait_for(nov30_counted)
        for running in agents:
            await running.kill()

        # 1 December: a and b come back; b's proxy carries 2 GB; a tunnel session of 10 minutes
        clock.epoch += dt.timedelta(days=1)
        agents = [await start_agent(nursery, hub.base_url, t, tmp_path / n, clock=clock)
                  for n, t in (("a", a_token), ("b", b_token))]
        proxy.carried(Puller(uuid.UUID(b_id), uuid.UUID(org), uuid.UUID(proxied), True), 2 * GB)
        await add_tunnel_session(hub, a_id, dt.datetime(2025, 12, 1, 10, 0, tzinfo=UTC), 10, relayed=GB // 2,
                                 bytes_in=1000, bytes_out=2000)

        async def dec1_counted() -> bool:
            u = await usage(hub, **{"from": "2025-12-01", "to": "2025-12-01"})
            return u["by"]["active_device"]["quantity"] == 2 and u["by"]["registry_fallback_bytes"]["quantity"] == 2 * GB

        await wait_for(dec1_counted)

        u = await usage(hub, **{"from": "2025-11-30", "to": "2025-12-01"})
        by = u["by"]
        assert (u["from"], u["to"], u["days"]) == ("2025-11-30", "2025-12-01", 2)
        # devices: 3 × 3.00/30 (30 Nov) + 2 × 3.00/31 (1 Dec) = 0.3 + 0.193548… = 0.49
        assert by["active_device"]["quantity"] == 5 and by["active_device"]["cost"] == 0.49
        # registry: 1.5 GB × 0.50 + 2 GB × 0.80 = 0.75 + 1.60
        assert by["registry_fallback_bytes"]["cost"] == 2.35 and by["registry_fallback_bytes"]["cost_cents"] == 235
        assert by["registry_fallback_bytes"]["prices"] == [{"from": "2025-11-30", "unit_price": 0.5},
                                                           {"from": "2025-12-01", "unit_price": 0.8}]
        assert by["tunnel_minutes"]["quantity"] == 10 and by["tunnel_minutes"]["cost"] == 1.00
        assert by["tunnel_relayed_bytes"]["billed_quantity"] == 0.5 and by["tunnel_relayed_bytes"]["cost"] == 1.00
        assert by["tunnel_bytes"]["quantity"] == 3000 and by["tunnel_bytes"]["cost"] is None  # no price set
        assert by["feature_audit_log"]["quantity"] == 2 and by["feature_audit_log"]["cost"] is None
        assert (u["total"], u["total_cents"]) == (4.84, 484)

        # the default period on 1 December is December: only that day's usage
        u = await usage(hub)
        assert (u["from"], u["end_exclusive"]) == ("2025-12-01", "2026-01-01")
        assert u["by"]["active_device"]["cost"] == 0.19 and u["by"]["registry_fallback_bytes"]["cost"] == 1.60
        assert u["total_cents"] == 19 + 160 + 100 + 100
        # an RFC 3339 to is an exclusive instant: midnight of 1 December leaves only 30 November
        u = await usage(hub, **{"from": "2025-11-30T00:00:00Z", "to": "2025-12-01T00:00:00Z"})
        assert u["days"] == 1 and u["total_cents"] == 30 + 75

        # the console's usage over time: the same rows, one value per day and product
        r = await hub.call("GET", "/console/api/usage-daily", params={"from": "2025-11-30", "to": "2025-12-01"})
        assert r.status_code == 200, r.text
        d = r.json()["data"]
        series = {x["product"]: x for x in d["series"]}
        assert d["days"] == ["2025-11-30", "2025-12-01"]
        assert series["active_device"]["values"] == [3, 2] and series["active_device"]["unit"] == "devices"
        assert series["registry_fallback_bytes"]["values"] == [1.5 * GB, 2 * GB]
        assert series["tunnel_minutes"]["values"] == [0, 10] and series["tunnel_minutes"]["total"] == 10
        assert series["tunnel_bytes"]["values"] == [0, 3000]
        assert series["tunnel_relayed_bytes"]["values"] == [0, GB // 2]
        # unasked, the last 30 days up to the hub's today (1 December)
        r = await hub.call("GET", "/console/api/usage-daily")
        d = r.json()["data"]
        assert (len(d["days"]), d["from"], d["to"]) == (30, "2025-11-02", "2025-12-01")
        assert {x["product"]: x for x in d["series"]}["active_device"]["values"][-3:] == [0, 3, 2]
        r = await hub.call("GET", "/console/api/usage-daily", params={"from": "2025-12-01", "to": "2025-11-01"})
        assert r.status_code == 400 and r.json()["error"] == "invalid_period"

        # registry fallback: per fleet, fleets with the proxy on first, a daily series
        r = await hub.call("GET", "/v1/billing/registry-fallback", params={"start": "2025-11-30", "end": "2025-12-02"})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert [(f["name"], f["registry_proxy"], f["registry_proxy_mode"], f["bytes"]) for f in data["fleets"]] == [
            ("proxied", True, "fallback", 3_500_000_000), ("aaa-direct", False, "fallback", 0)]
        assert data["daily"] == [{"day": "2025-11-30", "bytes": 1_500_000_000}, {"day": "2025-12-01", "bytes": 2 * GB}]
        assert data["totals"] == {"bytes": 3_500_000_000, "fleets": 2, "fleets_with_proxy": 1, "unattributed_bytes": 0}
        r = await hub.call("GET", "/v1/billing/registry-fallback")  # current UTC month to date
        data = r.json()["data"]
        assert (data["start"], data["end"], data["totals"]["bytes"]) == ("2025-12-01", "2025-12-02", 2 * GB)

        # tunnel usage, read with a Bearer token; to is inclusive
        headers = await bearer(hub)
        r = await hub.call("GET", "/v1/billing/tunnel/usage", headers=headers,
                           params={"from": "2025-12-01", "to": "2025-12-01"})
        assert r.status_code == 200, r.text
        t = r.json()["data"]
        assert (t["sessions"], t["minutes"], t["relayed_bytes"], t["bytes_total"]) == (1, 10, GB // 2, 3000)
        r = await hub.call("GET", "/v1/billing/tunnel/usage", headers=headers, params={"to": "2025-11-30"})
        assert r.json()["data"]["sessions"] == 0


async def test_tunnel_records_page_by_a_keyset_cursor_stable_under_inserts(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path, clock=clock_at(NOV30))
        device_id, _ = await hub.provision("d")
        base = dt.datetime(2025, 11, 20, tzinfo=UTC)
        made = [await add_tunnel_session(hub, device_id, base + dt.timedelta(hours=i), 1 + i) for i in range(5)]
        # two sessions opened at the same instant: the id breaks the tie
        made += [await add_tunnel_session(hub, device_id, base + dt.timedelta(hours=10), 1) for _ in range(2)]
        headers = await bearer(hub)
        seen, cursor, pages = [], None, 0
        while True:
            params = {"limit": "2", "from": "2025-11-01"}
            if cursor:
                params["cursor"] = cursor
            r = await hub.call("GET", "/v1/billing/tunnel/usage/records", headers=headers, params=params)
            assert r.status_code == 200, r.text
            data = r.json()["data"]
            seen += [x["id"] for x in data["records"]]
            pages += 1
            if pages == 1:
                # a session opened meanwhile is newer than every page boundary: it neither shifts nor repeats
                await add_tunnel_session(hub, device_id, base + dt.timedelta(hours=20), 5)
            cursor = data["next_cursor"]
            if cursor is None:
                break
        assert pages == 4 and len(seen) == len(set(seen)) == 7
        assert set(seen) == {str(x) for x in made}
        r = await hub.call("GET", "/v1/billing/tunnel/usage/records", headers=headers)
        data = r.json()["data"]
        assert data["limit"] == 50 and len(data["records"]) == 8 and data["next_cursor"] is None
        first = data["records"][0]
        assert first["minutes"] == 5 and first["state"] == "closed" and first["device_id"] == device_id


async def test_a_devices_own_registry_bytes_report_is_not_billed(nursery, db_url, tmp_path):
    """The hub meters what its proxy served; an agent's registry.bytes event (older agents sent one
    from a simulation) is an ordinary event, billed nothing."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        r = await hub.call("POST", "/v1/fleets", json={"name": "f", "registry_proxy": True})
        fleet = r.json()["data"]["id"]
        _, token = await hub.provision("d", fleet_id=fleet)
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "d")
        org = uuid.UUID(hub.org_id)
        heard = telemetry_counts(hub.services)[org]
        assert await running.agent.context.send_event("registry.bytes", {"fleetBytes": 12_345})
        assert await running.agent.context.send_event("telemetry", {"cpu": 1})
        await wait_for(lambda: telemetry_counts(hub.services)[org] > heard)  # the device's events were handled
        r = await hub.call("GET", "/v1/billing/registry-fallback")  # this month, today included
        assert r.status_code == 200, r.text
        assert r.json()["data"]["totals"]["bytes"] == 0
