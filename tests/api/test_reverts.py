"""Reverts (issue 37 item 5): a fleet or a device back to the version it ran before, as a rollout with a
rollout's gates. Real hub, PostgreSQL and agents applying versions for real.

Before the change there was no revert route (404 for each call here), and the hub kept nothing of what
a device ran before the version it runs."""

from __future__ import annotations

import sys
import uuid

import trio

from tests.api.test_rollouts import HEALTHY, closed_window, config, fleet_with_agents, rollout_state
from tests.api.test_windows import headers_for
from tests.hubtools import assert_error, device, start_hub, wait_for

# A second healthy workload: a new version must differ from the one before it.
HEALTHY_2 = {**HEALTHY, "command": [sys.executable, "-c", "import time\nwhile True: time.sleep(2)"]}


async def new_version(hub, cid: str, workload: dict) -> str:
    r = await hub.call("POST", f"/v1/configurations/{cid}/versions", json={"spec": {"workload": workload}})
    assert r.status_code == 201, r.text
    return r.json()["data"]["id"]


async def settled(hub, rid: str, state: str = "completed", timeout: float = 60) -> dict:
    async def done():
        return (await rollout_state(hub, rid))["state"] == state

    await wait_for(done, timeout=timeout, interval=0.2)
    return await rollout_state(hub, rid)


async def rolled_out(hub, fid: str, cid: str, vid: str) -> str:
    r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid,
                                                     "version_id": vid, "batch_size": 5})
    assert r.status_code == 201, r.text
    rid = r.json()["data"]["id"]
    await settled(hub, rid)
    return rid


async def runs(hub, dev: str) -> str | None:
    conf = (await device(hub, dev))["configuration"]
    return conf["applied_version_id"] if conf["status"] == "applied" else None


async def audited(hub, path: str) -> list[dict]:
    await hub.services.audit_log.flush()
    r = await hub.call("GET", "/v1/audit-events", params={"pathPrefix": path, "method": "POST"})
    assert r.status_code == 200, r.text
    return r.json()["data"]


async def test_fleet_revert_goes_back_to_what_the_fleet_ran_before_its_rollout(nursery, db_url, tmp_path):
    with trio.fail_after(170):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 2)
        cid, v1 = await config(hub, "app", HEALTHY)
        revert = f"/v1/fleets/{fid}/revert"
        assert_error(await hub.call("POST", revert), 409, "no_earlier_version")  # no rollout yet
        first = await rolled_out(hub, fid, cid, v1)
        assert_error(await hub.call("POST", revert), 409, "no_earlier_version")  # before it, nothing ran
        v2 = await new_version(hub, cid, HEALTHY_2)
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_id": fid, "config_id": cid, "version_id": v2,
                                                         "batch_size": 1})
        assert r.status_code == 201, r.text
        second = r.json()["data"]["id"]
        assert (await hub.call("POST", f"/v1/rollouts/{second}/pause")).status_code == 200
        body = assert_error(await hub.call("POST", revert), 409, "rollout_active")
        assert f"/v1/rollouts/{second}/cancel" in body["message"]
        assert (await hub.call("POST", f"/v1/rollouts/{second}/resume")).status_code == 200
        await settled(hub, second)
        for dev in agents:
            assert await runs(hub, dev) == v2
            assert (await device(hub, dev))["configuration"]["previous_version_id"] == v1

        r = await hub.call("POST", revert)  # no body: the reverted rollout's batches and thresholds
        assert r.status_code == 201, r.text
        back = r.json()["data"]
        assert (back["version_id"], back["revert_of"], back["batch_size"]) == (v1, second, 1)
        assert back["revert"]["from_version_id"] == v2 and back["revert"]["to_version_id"] == v1
        assert back["revert"]["versions_before"] == [{"version_id": v1, "devices": 2}]
        assert back["batches"][0]["canary"] is True  # a canary first, as any batched rollout
        await settled(hub, back["id"])
        for dev, running in agents.items():
            assert await runs(hub, dev) == v1
            assert running.agent.configs.version_applied() == v1

        # again: the same version (the revert looks past reverts), never the version reverted from
        r = await hub.call("POST", revert, json={"force": True})
        assert r.status_code == 201, r.text
        assert (r.json()["data"]["version_id"], r.json()["data"]["revert_of"]) == (v1, second)
        await settled(hub, r.json()["data"]["id"])
        assert [await runs(hub, dev) for dev in agents] == [v1, v1]

        [entry, *_] = await audited(hub, revert)
        assert entry["status"] == 201
        assert (entry["details"]["revertOf"], entry["details"]["fromVersionId"],
                entry["details"]["toVersionId"]) == (second, v2, v1)
        listed = {x["id"]: x for x in (await hub.call("GET", "/v1/rollouts", params={"limit": 10})).json()["data"]}
        assert set(listed) >= {first, second, back["id"]}
        assert (listed[back["id"]]["revert_kind"], listed[back["id"]]["revert_of"]) == ("fleet", second)
        assert listed[second]["revert_kind"] is None


async def test_device_revert_takes_one_device_back_and_only_once(nursery, db_url, tmp_path):
    with trio.fail_after(150):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        s = hub.services
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 2)
        one, other = agents
        cid, v1 = await config(hub, "app", HEALTHY)
        await rolled_out(hub, fid, cid, v1)
        assert_error(await hub.call("POST", f"/v1/devices/{one}/revert"), 409, "no_earlier_version")
        v2 = await new_version(hub, cid, HEALTHY_2)
        second = await rolled_out(hub, fid, cid, v2)

        # a viewer of the fleet may not revert (a rollout needs editor on it)
        member = await hub.new_user("member")
        mh = headers_for(member, hub.org_id)
        me = (await hub.call("GET", "/v1/me", headers=mh)).json()["data"]["userId"]
        r = await hub.call("POST", "/v1/relations", json={"object_type": "fleet", "object_id": fid,
                                                          "relation": "viewer", "subject_type": "user",
                                                          "subject_id": me})
        assert r.status_code == 201, r.text
        assert_error(await hub.call("POST", f"/v1/devices/{one}/revert", headers=mh), 403)
        assert_error(await hub.call("POST", f"/v1/fleets/{fid}/revert", headers=mh), 403)
        assert_error(await hub.call("POST", f"/v1/devices/{uuid.uuid4()}/revert"), 404)
        assert_error(await hub.call("POST", f"/v1/fleets/{uuid.uuid4()}/revert"), 404)

        r = await hub.call("POST", f"/v1/devices/{one}/revert")
        assert r.status_code == 201, r.text
        back = r.json()["data"]
        assert (back["version_id"], back["total_devices"], back["fleet_ids"]) == (v1, 1, [fid])
        assert [d["device_id"] for d in back["devices"]] == [one]
        assert back["revert"] == {"device_id": one, "from_version_id": v2, "to_version_id": v1, "to_version": 1}
        await settled(hub, back["id"])
        assert (await runs(hub, one), await runs(hub, other)) == (v1, v2)
        assert agents[one].agent.configs.version_applied() == v1
        # back on the version it ran before: nothing earlier is known, so not again (never to v2)
        assert (await device(hub, one))["configuration"]["previous_version_id"] is None
        assert_error(await hub.call("POST", f"/v1/devices/{one}/revert"), 409, "no_earlier_version")
        # the fleet's revert looks past the device's: back to what the fleet ran before its rollout of v2
        r = await hub.call("POST", f"/v1/fleets/{fid}/revert")
        assert r.status_code == 201, r.text
        assert (r.json()["data"]["version_id"], r.json()["data"]["revert_of"]) == (v1, second)
        assert (back["revert_kind"], r.json()["data"]["revert_kind"]) == ("device", "fleet")
        await settled(hub, r.json()["data"]["id"])
        assert (await runs(hub, one), await runs(hub, other)) == (v1, v1)
        ok = [e for e in await audited(hub, f"/v1/devices/{one}/revert") if e["status"] == 201]
        assert ok and ok[0]["details"]["revertDevice"] == one and ok[0]["details"]["toVersionId"] == v1

        # a device with a version before but offline, or in no fleet: refused, saying why
        now = s.clock.now()
        org = uuid.UUID(hub.org_id)
        for name, fleet in (("offline", fid), ("fleetless", None)):
            dev = uuid.UUID((await hub.provision(name, **({"fleet_id": fleet} if fleet else {})))[0])
            for vid in (v1, v2):
                await s.stores.devices.assign_config(org, dev, uuid.UUID(cid), uuid.UUID(vid), now)
                await s.stores.devices.set_config_result(dev, "applied", None, uuid.UUID(vid), now,
                                                        assigned=uuid.UUID(vid))
            assert (await device(hub, str(dev)))["configuration"]["previous_version_id"] == v1
            code = "device_ineligible" if fleet else "device_not_in_fleet"
            body = assert_error(await hub.call("POST", f"/v1/devices/{dev}/revert"), 409, code)
            assert ("offline" in body["message"]) if fleet else (v1 in body["message"])


async def test_revert_waits_for_the_window_unless_forced(nursery, db_url, tmp_path):
    with trio.fail_after(150):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        fid, agents = await fleet_with_agents(hub, nursery, tmp_path, 1, name="w")
        (dev,) = agents
        cid, v1 = await config(hub, "app", HEALTHY)
        await rolled_out(hub, fid, cid, v1)
        v2 = await new_version(hub, cid, HEALTHY_2)
        bad = await rolled_out(hub, fid, cid, v2)
        assert (await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=closed_window(hub))).status_code == 200

        r = await hub.call("POST", f"/v1/fleets/{fid}/revert")
        assert r.status_code == 201, r.text
        queued = r.json()["data"]["id"]

        async def held():
            return [d["step"] for d in (await rollout_state(hub, queued))["devices"]] == ["QUEUED_MAINTENANCE"]

        await wait_for(held, timeout=20, interval=0.2)
        await trio.sleep(1.0)  # several ticks: the closed window still holds it
        assert await held() and await runs(hub, dev) == v2
        assert (await hub.call("POST", f"/v1/rollouts/{queued}/cancel")).status_code == 200

        # forced: through the closed window, and still to v1 (the cancelled revert is not reverted)
        r = await hub.call("POST", f"/v1/fleets/{fid}/revert", json={"force": True})
        assert r.status_code == 201, r.text
        forced = r.json()["data"]
        assert (forced["version_id"], forced["revert_of"], forced["force"]) == (v1, bad, True)
        await settled(hub, forced["id"])
        assert await runs(hub, dev) == v1
        entries = [e for e in await audited(hub, f"/v1/fleets/{fid}/revert") if e["details"].get("force")]
        assert len(entries) == 1 and entries[0]["details"]["forcedBy"] == str(hub.user_id)


async def test_rollout_and_impact_take_the_names_of_every_spec_form(nursery, db_url, tmp_path):
    """Item 13: the spec names the fleets, the configuration and the version differently in each
    request form; each form's names work in both calls, and the spec's own forms as before."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        f1 = (await hub.call("POST", "/v1/fleets", json={"name": "one"})).json()["data"]["id"]
        f2 = (await hub.call("POST", "/v1/fleets", json={"name": "two"})).json()["data"]["id"]
        cid, v1 = await config(hub, "app", HEALTHY)
        v2 = await new_version(hub, cid, HEALTHY_2)

        async def impact(body: dict) -> dict:
            r = await hub.call("POST", "/v1/rollouts/impact", json=body)
            assert r.status_code == 200, (body, r.text)
            return r.json()["data"]

        spec_form = await impact({"fleet_id": f1, "target_version_id": v1, "force": False})
        assert (spec_form["fleet_id"], spec_form["target_version_id"], spec_form["eligible_devices"]) == (f1, v1, 0)
        assert (await impact({"fleet_ids": [f1], "configuration_id": cid}))["target_version_id"] == v2  # current
        assert (await impact({"fleet_id": f1, "config_id": cid, "version_id": v1}))["target_version_id"] == v1
        assert (await hub.call("PUT", f"/v1/fleets/{f2}/update-window", json=closed_window(hub))).status_code == 200
        both = await impact({"fleet_ids": [f1, f2], "target_version_id": v1, "force": True})
        assert (both["fleet_id"], both["fleet_ids"], both["force"]) == (None, [f1, f2], True)
        assert both["window_bypassed"] is True and both["next_window_at"] is None
        held = await impact({"fleet_ids": [f1, f2], "target_version_id": v1})
        assert held["window_bypassed"] is False and held["next_window_at"].endswith("Z")  # f2's next opening
        await hub.call("DELETE", f"/v1/fleets/{f2}/update-window")

        for body, code in (({"fleet_id": f1, "fleet_ids": [f2], "target_version_id": v1}, "invalid_field"),
                           ({"fleet_id": f1, "config_id": cid, "configuration_id": str(uuid.uuid4())},
                            "invalid_field"),
                           ({"target_version_id": v1}, "missing_field"),
                           ({"fleet_id": f1}, "missing_field"),
                           ({"fleet_id": f1, "target_version_id": v1, "note": 1}, "unknown_field")):
            for path in ("/v1/rollouts/impact", "/v1/rollouts"):
                assert_error(await hub.call("POST", path, json=body), 400, code)
        other_config, _ = await config(hub, "other", HEALTHY)
        assert_error(await hub.call("POST", "/v1/rollouts", json={"fleet_id": f1, "config_id": other_config,
                                                                  "target_version_id": v1}),
                     400, "invalid_reference")

        for body, version in (({"fleet_id": f1, "config_id": cid, "force": True}, v2),               # spec: forced
                              ({"fleet_ids": [f1], "configuration_id": cid, "batch_size": 2}, v2),  # spec: batched
                              ({"fleet_id": f1, "configuration_id": cid, "force": True}, v2),
                              ({"fleet_ids": [f1, f2], "config_id": cid, "batch_size": 2}, v2),
                              ({"fleet_id": f1, "target_version_id": v1}, v1),                      # the impact's
                              ({"fleet_ids": [f1], "configuration_id": cid, "version_id": v1}, v1)):
            r = await hub.call("POST", "/v1/rollouts", json=body)
            assert r.status_code == 201, (body, r.text)
            made = r.json()["data"]
            assert (made["config_id"], made["version_id"]) == (cid, version), body
            await settled(hub, made["id"], timeout=20)  # no devices: it settles at once
