"""What the console's rollout, fleet and billing pages read, as the API answers it (issue 37 items 6,
7, 8 and 12): a device waiting for its fleet's window says until when, apart from those in progress;
controls that do not apply are refused with 409; the rollout names its configuration and fleets; a
fleet carries its window; thresholds read back as sent; billing quantities name the unit they count,
billed quantities carry no float noise, and a feature is billed only for days the organisation has
lived."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
import trio

from tests.api.billing_helpers import admin
from tests.api.test_memtests import COMMAND_TIMEOUT, connect, mt
from tests.api.test_rollouts import HEALTHY, config, fleet_with_agents, rollout_state
from tests.hubtools import assert_error, start_hub, wait_for

EVERY_DAY = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


async def test_a_queued_device_waits_for_its_window_until_the_next_opening(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, _ = await fleet_with_agents(hub, nursery, tmp_path, 2, name="night")
        opens = (hub.services.clock.now() + dt.timedelta(hours=6)).replace(second=0, microsecond=0)
        window = {"enabled": True, "timezone": "Asia/Tokyo", "start_time": "00:00", "end_time": "00:00",
                  "days_of_week": EVERY_DAY}
        tokyo = opens.astimezone(dt.timezone(dt.timedelta(hours=9)))
        window.update(start_time=tokyo.strftime("%H:%M"), end_time=(tokyo + dt.timedelta(hours=1)).strftime("%H:%M"))
        assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=window)).status_code == 200
        next_at = (await hub.call("GET", f"/v1/fleets/{fid}/update-window/check")).json()["data"]["next_window_at"]
        assert next_at is not None

        # the fleet list carries its window, as the window's own GET shows it
        fleets = (await hub.call("GET", "/v1/fleets")).json()["data"]
        assert [f["update_window"] for f in fleets if f["id"] == fid] == [window]

        cid, _ = await config(hub, "nightly", HEALTHY)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1,
                                                         "success_threshold": 0.9, "failure_threshold": 0.1})
        assert r.status_code == 201, r.text
        rid = r.json()["data"]["id"]

        async def queued():
            return (await rollout_state(hub, rid))["counts"]["QUEUED_MAINTENANCE"] == 1

        await wait_for(queued, timeout=20, interval=0.1)
        ro = await rollout_state(hub, rid)
        assert ro["waiting_for_window"] == {"devices": 1, "until": next_at}
        waiting = [d for d in ro["devices"] if d["step"] == "QUEUED_MAINTENANCE"]
        assert [d["waiting_for_window_until"] for d in waiting] == [next_at]
        assert all(d["waiting_for_window_until"] is None for d in ro["devices"] if d["step"] != "QUEUED_MAINTENANCE")
        # a REAL column gave 0.10000000149011612 back
        assert (ro["success_threshold"], ro["failure_threshold"]) == (0.9, 0.1)
        # names, not identifiers
        assert (ro["config_name"], ro["version_number"]) == ("nightly", 1)
        assert ro["fleets"] == [{"id": fid, "name": "night"}]

        listed = [x for x in (await hub.call("GET", "/v1/rollouts")).json()["data"] if x["id"] == rid]
        assert [x["waiting_for_window"] for x in listed] == [{"devices": 1, "until": next_at}]
        assert [(x["config_name"], x["version_number"], x["fleets"]) for x in listed] == [
            ("nightly", 1, [{"id": fid, "name": "night"}])]


async def test_controls_that_do_not_apply_are_refused_with_409(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, _ = await fleet_with_agents(hub, nursery, tmp_path, 1, name="c")
        closed = {"enabled": True, "timezone": "UTC", "start_time": "00:00", "end_time": "00:01",
                  "days_of_week": ["Monday"]}
        now = hub.services.clock.now()
        if now.weekday() == 0 and now.hour == 0 and now.minute < 1:
            closed["days_of_week"] = ["Tuesday"]
        assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=closed)).status_code == 200
        cid, _ = await config(hub, "held", HEALTHY)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1})
        rid = r.json()["data"]["id"]

        async def running():
            return (await rollout_state(hub, rid))["state"] == "running"

        await wait_for(running, timeout=20, interval=0.1)
        body = assert_error(await hub.call("POST", f"/v1/rollouts/{rid}/resume"), 409, "invalid_state")
        assert "running" in body["message"]
        assert (await hub.call("POST", f"/v1/rollouts/{rid}/pause")).json()["data"]["state"] == "paused"
        assert (await hub.call("POST", f"/v1/rollouts/{rid}/cancel")).json()["data"]["state"] == "cancelled"
        for verb in ("pause", "resume", "cancel"):
            body = assert_error(await hub.call("POST", f"/v1/rollouts/{rid}/{verb}"), 409, "invalid_state")
            assert "cancelled" in body["message"]


async def test_usage_names_what_it_counts_and_bills_features_for_days_lived(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)  # the organisation is created now
        await admin(hub, tmp_path, "billing-profile", hub.org_id, "--plan", "pro")
        today = hub.services.clock.now().astimezone(dt.UTC).date()
        org = uuid.UUID(hub.org_id)
        hub.services.meter.add(org, "tunnel_bytes", 5_034_686, day=today)
        r = await hub.call("GET", "/v1/billing/usage")
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        by = {p["product"]: p for p in data["products"]}
        assert (by["tunnel_bytes"]["quantity"], by["tunnel_bytes"]["quantity_unit"], by["tunnel_bytes"]["unit"]) == (
            5_034_686, "byte", "GB")
        assert by["tunnel_bytes"]["billed_quantity"] == 0.005035  # GB, to a millionth
        # audit_log is on by default: billed for today only, not for the period's days before the
        # organisation existed nor for the days still to come
        audit = by["feature_audit_log"]
        assert (audit["quantity"], audit["quantity_unit"], audit["unit"]) == (1, "day", "month")
        month_days = data["days"] if data["from"][8:] == "01" else None
        if month_days:
            assert audit["billed_quantity"] == round(1 / month_days, 6)
        assert len(repr(audit["billed_quantity"])) <= len("0.033333")
        assert by["active_device"]["quantity_unit"] == "device_day"
        assert by["tunnel_minutes"]["quantity_unit"] == "minute"


@pytest.fixture
async def scripted_hub(nursery, db_url, tmp_path):
    """A hub for tests/api/test_memtests.py's scripted device (its short command timeout)."""
    return await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=COMMAND_TIMEOUT)


async def test_memory_test_progress_is_the_share_of_planned_work_not_of_memory_touched(scripted_hub, nursery):
    hub = scripted_hub
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)
        seen: list[dict] = []
        got = trio.Event()

        async def watch(task_status=trio.TASK_STATUS_IGNORED) -> None:
            async with hub.client.stream("GET", hub.base_url + f"/v1/devices/{dev_id}/events",
                                         headers=hub.headers) as r:
                task_status.started()
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and '"phase":"testing"' in line.replace(" ", ""):
                        seen.append(json.loads(line[6:])["payload"])
                        got.set()

        async with trio.open_nursery() as watchers:
            await watchers.start(watch)
            r = await hub.call("POST", mt(dev_id), json={"quick": True, "maxBytes": 64 << 20})
            assert r.status_code == 202, r.text
            # a 64 MiB region swept three times (192 MiB verified) with ten seconds of work left at
            # 64 MiB/s: every byte was touched (coverage 1) but 3 of 13 sweeps are done
            mib = 1 << 20
            device.running = {**device.running, "phase": "testing", "pass": 1, "pattern": "checkerboard",
                              "testedBytes": 192 * mib, "coverageBytes": 64 * mib, "rateBps": 64 * mib,
                              "etaSeconds": 10}
            await device.event("memtest.progress", device.running)
            with trio.fail_after(5):
                await got.wait()
            watchers.cancel_scope.cancel()
        op = seen[-1]
        assert (op["coverage"], op["progress"], op["etaSeconds"], op["testedBytes"]) == (1.0, 0.2308, 10, 192 * mib)
        live = (await hub.call("GET", mt(dev_id))).json()["data"]
        assert live["progress"] == 0.2308


async def test_thresholds_stored_as_real_read_back_as_sent_after_the_migration(db_url):
    """Migration 0023: a rollout written while the thresholds were REAL (0.1 stored as
    0.10000000149011612) reads back 0.1 and 0.9, as it was sent."""
    from storage.db import Database
    from storage.migrate import migrate

    with trio.fail_after(30):
        db = Database(db_url, min_size=1, max_size=1)
        await db.open()
        try:
            async def old_row(conn) -> None:
                await conn.execute("SET session_replication_role = replica")  # one synthetic row: no foreign keys
                await conn.execute("ALTER TABLE rollouts ALTER COLUMN success_threshold TYPE real, "
                                   "ALTER COLUMN failure_threshold TYPE real")
                await conn.execute(
                    "INSERT INTO rollouts (id, org_id, fleet_ids, config_id, version_id, force, success_threshold, "
                    "failure_threshold, state, created_at, updated_at) VALUES (gen_random_uuid(), gen_random_uuid(), "
                    "'{}', gen_random_uuid(), gen_random_uuid(), false, 0.9, 0.1, 'completed', now(), now())")
                await conn.execute("DELETE FROM schema_migrations WHERE version = '0023_rollout_threshold_precision'")

            await db.run(old_row, transaction=True)
            assert (await db.fetchval("SELECT failure_threshold::float8 FROM rollouts")) != 0.1  # the float4 noise
            assert "0023_rollout_threshold_precision" in await migrate(db)
            row = await db.fetchrow("SELECT success_threshold, failure_threshold FROM rollouts")
            assert (row["success_threshold"], row["failure_threshold"]) == (0.9, 0.1)
        finally:
            await db.close()
