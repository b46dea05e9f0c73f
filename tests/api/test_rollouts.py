"""Rollouts end to end: real hub, PostgreSQL and device agents applying versions for real."""

from __future__ import annotations

import datetime as dt
import sys
import uuid

import trio

from tests.hubtools import open_hub, start_agent, start_hub, start_stoppable, wait_for

HEALTHY = {"command": [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
           "healthCheck": {"timeoutSeconds": 2, "graceSeconds": 0.2}}
# Without a health command a workload is healthy when it is still running at the end of its grace. A
# grace as short as HEALTHY's let a loaded host (CI, 2026-11-29) start this Python after 0.2 s had
# passed: the version was applied, then crash-looped. The grace is waited only until the process exits,
# so a long one costs nothing and the rejection no longer depends on how fast a process starts.
FAILING = {"command": [sys.executable, "-c", "import sys; sys.exit(3)"],
           "healthCheck": {"timeoutSeconds": 1, "graceSeconds": 20}}


async def fleet_with_agents(hub, nursery, tmp_path, n, name="f", **fleet):
    r = await hub.call("POST", "/v1/fleets", json={"name": name, **fleet})
    fid = r.json()["data"]["id"]
    agents = {}
    for i in range(n):
        dev, token = await hub.provision(f"{name}-{i}", fleet_id=fid)
        agents[dev] = await start_agent(nursery, hub.base_url, token, tmp_path / f"{name}-{i}")
    return fid, agents


async def config(hub, name, workload) -> tuple[str, str]:
    r = await hub.call("POST", "/v1/configurations", json={"name": name, "spec": {"workload": workload}})
    data = r.json()["data"]
    return data["id"], data["version"]["id"]


async def rollout_state(hub, rid) -> dict:
    return (await hub.call("GET", f"/v1/rollouts/{rid}")).json()["data"]


EVERY_DAY = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def closed_window(hub) -> dict:
    """A window closed now and for days: one minute a week (on Tuesday if that minute is now)."""
    closed = {"enabled": True, "timezone": "UTC", "start_time": "00:00", "end_time": "00:01",
              "days_of_week": ["Monday"]}
    now = hub.services.clock.now()
    if now.weekday() == 0 and now.hour == 0 and now.minute < 1:
        closed["days_of_week"] = ["Tuesday"]
    return closed


def open_window(closed: dict) -> dict:
    """The same window open all day, every day."""
    return {**closed, "start_time": "00:00", "end_time": "00:00", "days_of_week": EVERY_DAY}


async def test_batched_rollout_canary_then_batches_to_completion(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 5)
        cid, vid = await config(hub, "app", HEALTHY)
        r = await hub.call("POST", "/v1/rollouts/impact", json={"fleet_id": fid, "target_version_id": vid,
                                                                "force": False})
        assert r.status_code == 200 and r.json()["data"]["eligible_devices"] == 5
        assert r.json()["data"]["in_window"] == 5 and r.json()["data"]["next_window_at"] is None
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 2})
        assert r.status_code == 201, r.text
        ro = r.json()["data"]
        assert [b["counts"]["pending"] + b["counts"]["updating"] for b in ro["batches"]] == [1, 2, 2]
        assert ro["batches"][0]["canary"] is True
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_id": fid, "config_id": cid, "force": True})
        assert r.status_code == 409  # one active rollout per fleet

        async def done():
            return (await rollout_state(hub, ro["id"]))["state"] == "completed"

        await wait_for(done, timeout=60, interval=0.2)
        final = await rollout_state(hub, ro["id"])
        assert final["counts"]["succeeded"] == 5
        for dev, running in agents.items():
            d = (await hub.call("GET", f"/v1/devices/{dev}")).json()["data"]
            assert d["configuration"]["applied_version_id"] == vid
            assert running.agent.configs.version_applied() == vid
        # the steps changed batch by batch: the canary settled before batch 1 started
        steps = {s["device_id"]: s for s in final["devices"]}
        canary = [s for s in steps.values() if s["batch"] == 0][0]
        batch1 = [s for s in steps.values() if s["batch"] == 1]
        assert all(s["updated_at"] >= canary["updated_at"] for s in batch1)


async def test_failing_health_check_pauses_at_the_canary(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 3)
        cid, vid = await config(hub, "bad", FAILING)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 5})
        rid = r.json()["data"]["id"]

        async def paused():
            return (await rollout_state(hub, rid))["state"] == "paused"

        await wait_for(paused, timeout=60, interval=0.2)
        st = await rollout_state(hub, rid)
        assert st["reason"] == "the canary batch failed" and st["counts"]["failed"] == 1
        assert st["counts"]["pending"] == 2  # nobody else was touched
        failed = next(d for d in st["devices"] if d["step"] == "failed")
        assert "health" in failed["error"]
        r = await hub.call("POST", f"/v1/rollouts/{rid}/cancel")
        assert r.status_code == 200 and r.json()["data"]["state"] == "cancelled"
        assert (await hub.call("POST", f"/v1/rollouts/{rid}/resume")).status_code == 409


async def test_out_of_window_queues_force_bypasses_and_a_restart_continues(nursery, db_url, tmp_path):
    with trio.fail_after(120):
        first = await start_stoppable(nursery, lambda n: start_hub(n, db_url, tmp_path / "hub",
                                                                    heartbeat_interval=0.5))
        hub = first.value
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 2, name="w")
        # a window that is closed now: it opens in six hours (UTC)
        now = hub.services.clock.now()
        opens = (now + dt.timedelta(hours=6)).replace(second=0, microsecond=0)
        window = {"enabled": True, "timezone": "UTC", "start_time": opens.strftime("%H:%M"),
                  "end_time": (opens + dt.timedelta(hours=1)).strftime("%H:%M"),
                  "days_of_week": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]}
        assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=window)).status_code == 200
        cid, vid = await config(hub, "app", HEALTHY)
        r = await hub.call("POST", "/v1/rollouts/impact", json={"fleet_id": fid, "target_version_id": vid,
                                                                "force": False})
        impact = r.json()["data"]
        assert impact["in_window"] == 0 and impact["queued_for_next_window"] == 2 and impact["next_window_at"]
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1})
        rid = r.json()["data"]["id"]

        async def queued():
            return (await rollout_state(hub, rid))["counts"]["QUEUED_MAINTENANCE"] == 1

        await wait_for(queued, timeout=20, interval=0.1)
        # stop the hub mid-rollout, start another on the same database and port: the agents reconnect
        port = int(hub.base_url.rsplit(":", 1)[1])
        await first.stop()
        services, base_url = await open_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, port=port)
        hub.services, hub.base_url = services, base_url
        await wait_for(lambda: len(services.links) == 2, timeout=30)
        assert (await rollout_state(hub, rid))["state"] == "running"
        # the window opens now: the queued devices go
        window.update(start_time="00:00", end_time="00:00")
        assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=window)).status_code == 200

        async def done():
            return (await rollout_state(hub, rid))["state"] == "completed"

        await wait_for(done, timeout=60, interval=0.2)
        for i, dev in enumerate(agents):
            assert agents[dev].agent.configs.version_applied() == vid


async def test_progress_stream_and_forced_rollout_audit(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 2, name="s")
        closed = closed_window(hub)
        assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=closed)).status_code == 200
        cid, vid = await config(hub, "streamed", HEALTHY)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1})
        rid = r.json()["data"]["id"]
        events: list[str] = []
        async with hub.client.stream("GET", hub.base_url + f"/v1/rollouts/{rid}/events", headers=hub.headers) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = stream.aiter_lines()
            opened = False
            async for line in lines:
                if line.startswith("event: "):
                    events.append(line[7:])
                if events == ["rollout.snapshot"] and not opened:
                    opened = True
                    always = open_window(closed)
                    assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=always)).status_code == 200
                if line.startswith("data: ") and '"state":"completed"' in line:
                    break
        assert events[0] == "rollout.snapshot" and "rollout.progress" in events and events[-1] == "rollout.state"
        # a forced rollout is audited with who forced it
        cid2, _ = await config(hub, "forced", HEALTHY)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_id": fid, "config_id": cid2, "force": True})
        assert r.status_code == 201
        await hub.services.audit_log.flush()
        r = await hub.call("GET", "/v1/audit-events", params={"pathPrefix": "/v1/rollouts", "method": "POST"})
        forced = [e for e in r.json()["data"] if e["details"].get("force")]
        assert len(forced) == 1 and forced[0]["details"]["forcedBy"] == str(hub.user_id)


async def test_pause_holds_new_devices_and_resume_continues(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 3, name="p")
        closed = closed_window(hub)
        await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=closed)
        cid, vid = await config(hub, "paused", HEALTHY)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1})
        rid = r.json()["data"]["id"]
        r = await hub.call("POST", f"/v1/rollouts/{rid}/pause")
        assert r.status_code == 200 and r.json()["data"]["state"] == "paused"
        assert (await hub.call("POST", f"/v1/rollouts/{rid}/pause")).json()["data"]["state"] == "paused"
        always = open_window(closed)
        await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=always)
        await trio.sleep(1.5)  # the window is open, but a paused rollout starts nobody
        st = await rollout_state(hub, rid)
        assert st["state"] == "paused" and st["counts"]["succeeded"] == 0
        assert st["counts"]["updating"] == 0 and st["counts"]["verifying"] == 0
        r = await hub.call("POST", f"/v1/rollouts/{rid}/resume")
        assert r.status_code == 200 and r.json()["data"]["state"] == "running"

        async def done():
            return (await rollout_state(hub, rid))["state"] == "completed"

        await wait_for(done, timeout=60, interval=0.2)
        assert (await hub.call("POST", f"/v1/rollouts/{rid}/pause")).status_code == 409


async def test_steps_stored_with_the_old_spelling_are_renamed_by_the_migration(db_url):
    """Migration 0011: a step saved as queued_maintenance before the spec's spelling reads back as
    QUEUED_MAINTENANCE, so a hub restarted on an older database continues the rollout."""
    from storage.db import Database
    from storage.migrate import migrate

    with trio.fail_after(30):
        db = Database(db_url, min_size=1, max_size=1)
        await db.open()
        try:
            async def old_row(conn) -> None:
                # Only this table matters here: skip its foreign keys for the one synthetic row.
                await conn.execute("SET session_replication_role = replica")
                await conn.execute(
                    "INSERT INTO rollout_devices (rollout_id, device_id, fleet_id, batch, step, updated_at) "
                    "VALUES (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 0, 'queued_maintenance', now())")
                await conn.execute("DELETE FROM schema_migrations WHERE version = '0011_rollout_step_spelling'")

            await db.run(old_row, transaction=True)
            assert "0011_rollout_step_spelling" in await migrate(db)
            steps = [r["step"] for r in await db.fetch("SELECT step FROM rollout_devices")]
            assert steps == ["QUEUED_MAINTENANCE"]
        finally:
            await db.close()


async def test_a_window_changed_while_the_rollout_actor_starts_is_read_again(nursery, db_url, tmp_path, monkeypatch):
    """fleet_changed tells the rollout actors in the registry; one still in its on_start is not there
    yet. The window is changed right after that actor read it (closed, opening only next week): the
    actor reads it again at its first tick, and the now-open window lets the rollout finish."""
    from actors.rollout import RolloutActor

    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 1, name="w")
        closed = closed_window(hub)
        assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=closed)).status_code == 200
        always = open_window(closed)
        load, changed = RolloutActor._load_windows, []

        async def load_then_change(actor):
            await load(actor)
            if not changed:  # the first read is the starting actor's: change the window under it
                changed.append(actor.rollout_id)
                assert hub.services.registry.lookup(("rollout", actor.rollout_id)) is None  # not told
                r = await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=always)
                assert r.status_code == 200

        monkeypatch.setattr(RolloutActor, "_load_windows", load_then_change)
        cid, vid = await config(hub, "window-during-start", HEALTHY)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid, "batch_size": 1})
        assert r.status_code == 201, r.text
        rid = r.json()["data"]["id"]
        assert changed == [uuid.UUID(rid)]

        async def done():
            return (await rollout_state(hub, rid))["state"] == "completed"

        await wait_for(done, timeout=30, interval=0.2)
        assert next(iter(agents.values())).agent.configs.version_applied() == vid


async def test_rollout_active_names_the_rollout_only_to_who_may_view_it(nursery, db_url, tmp_path):
    """Issue 31 item 9: rollout_active gave a member the id of an admin's rollout over a fleet the
    member cannot view (a 403 on it). The member now hears that one is active, not which."""
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        mine, _ = await fleet_with_agents(hub, nursery, tmp_path, 1, name="mine")
        theirs, _ = await fleet_with_agents(hub, nursery, tmp_path, 1, name="theirs")
        closed = closed_window(hub)
        for fid in (mine, theirs):  # the rollout stays active: its devices wait for the window
            await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=closed)
        cid, _ = await config(hub, "busy", HEALTHY)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [mine, theirs], "configuration_id": cid})
        assert r.status_code == 201, r.text
        rid = r.json()["data"]["id"]
        member = await hub.new_user("member")
        mh = {"X-API-Token-ID": member[0], "X-API-Secret-Key": member[1], "X-Organization-ID": hub.org_id}
        me = (await hub.call("GET", "/v1/me", headers=mh)).json()["data"]["userId"]
        for object_type, object_id in (("fleet", mine), ("configuration", cid)):
            r = await hub.call("POST", "/v1/relations", json={"object_type": object_type, "object_id": object_id,
                                                              "relation": "editor", "subject_type": "user",
                                                              "subject_id": me})
            assert r.status_code == 201, r.text
        assert (await hub.call("GET", f"/v1/rollouts/{rid}", headers=mh)).status_code == 403
        r = await hub.call("POST", "/v1/rollouts", headers=mh, json={"fleet_id": mine, "config_id": cid})
        assert r.status_code == 409 and r.json()["error"] == "rollout_active"
        assert rid not in r.text and "cannot all view" in r.json()["message"]
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_id": mine, "config_id": cid})  # the admin
        assert r.status_code == 409 and f"/v1/rollouts/{rid}/cancel" in r.json()["message"]
