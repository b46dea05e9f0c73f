"""Metering: sums per organisation, day, product and key, written in batches; active devices once a day."""

from __future__ import annotations

import datetime as dt
import uuid

import trio

from tests.hubtools import start_agent, start_hub


async def test_meter_sums_and_flushes_in_one_batch(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        org = uuid.UUID(hub.org_id)
        day = dt.date(2026, 11, 1)
        for _ in range(100):
            s.meter.add(org, "tunnel_bytes", 1000, day=day)
        s.meter.add(org, "registry_fallback_bytes", 5, day=day, key="fleet-a")
        s.meter.add(org, "tunnel_bytes", 0, day=day)  # nothing to count
        assert s.meter.pending() == 2
        await s.meter.flush()
        assert s.meter.pending() == 0
        s.meter.add(org, "tunnel_bytes", 7, day=day)
        await s.meter.flush()
        rows = await s.stores.usage.daily(org, day, day + dt.timedelta(days=1))
        got = {(r["product"], r["key"]): int(r["quantity"]) for r in rows}
        assert got == {("tunnel_bytes", ""): 100_007, ("registry_fallback_bytes", "fleet-a"): 5}


async def test_unknown_product_is_refused(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        try:
            hub.services.meter.add(uuid.UUID(hub.org_id), "free_lunch", 1, day=dt.date(2026, 1, 1))
        except ValueError as exc:
            assert "free_lunch" in str(exc)
        else:
            raise AssertionError("an unknown product was accepted")


async def test_a_connected_device_counts_as_active_once_per_day(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path, heartbeat_interval=0.05)
        device_id, token = await hub.provision("metered")
        await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        await trio.sleep(0.3)  # several heartbeats
        s = hub.services
        today = s.clock.now().astimezone(dt.timezone.utc).date()

        async def counted():
            await s.meter.flush()
            rows = await s.stores.usage.active_devices_daily(uuid.UUID(hub.org_id), today, today + dt.timedelta(days=1))
            return rows == [{"day": today, "devices": 1}]

        deadline = trio.current_time() + 5
        while not await counted():
            assert trio.current_time() < deadline, "the device was never counted"
            await trio.sleep(0.05)
