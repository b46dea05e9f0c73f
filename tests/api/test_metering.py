"""Metering: sums per organisation, day, product and key, written in batches; active devices once a day."""

from __future__ import annotations

import datetime as dt
import uuid

import trio

from hub.metering import Meter
from storage.usage import Usage
from tests.components import new_org, open_stores
from tests.hubtools import metric_value, metrics, start_agent, start_hub


async def test_meter_sums_and_flushes_in_one_batch(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        async with open_stores(db_url, tmp_path) as stores:
            org = await new_org(stores)
            meter = Meter(stores.usage)
            day = dt.date(2026, 11, 1)
            for _ in range(100):
                meter.add(org, "tunnel_bytes", 1000, day=day)
            meter.add(org, "registry_fallback_bytes", 5, day=day, key="fleet-a")
            meter.add(org, "tunnel_bytes", 0, day=day)  # nothing to count
            assert meter.pending() == 2
            await meter.flush()
            assert meter.pending() == 0
            meter.add(org, "tunnel_bytes", 7, day=day)
            await meter.flush()
            rows = await stores.usage.daily(org, day, day + dt.timedelta(days=1))
            got = {(r["product"], r["key"]): int(r["quantity"]) for r in rows}
            assert got == {("tunnel_bytes", ""): 100_007, ("registry_fallback_bytes", "fleet-a"): 5}


def test_unknown_product_is_refused():
    meter = Meter(Usage(None))  # refused where it is counted: nothing reaches storage
    try:
        meter.add(uuid.uuid4(), "free_lunch", 1, day=dt.date(2026, 1, 1))
    except ValueError as exc:
        assert "free_lunch" in str(exc)
    else:
        raise AssertionError("an unknown product was accepted")
    assert meter.pending() == 0


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
        # the meter's two outboxes are on /metrics by kind (hub/metrics.py), as every outbox is
        text = await metrics(hub)
        assert metric_value(text, "fleethub_write_behind_rows_total", {"kind": "active_device"}) >= 1
        assert metric_value(text, "fleethub_write_behind_pending", {"kind": "metering"}) == 0
