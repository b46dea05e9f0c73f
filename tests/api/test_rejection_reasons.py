"""Why a device rejected a configuration reaches the operator (issue 37 items 3 and 4): a real agent
runs a version whose health check prints "db unreachable" and exits 1; the device's configuration in
the API says so, with the check's output and the workload log's end, and the device list shows and
filters by each device's configuration status."""

from __future__ import annotations

import base64
import sys

import trio

from tests.hubtools import start_agent, start_hub, wait_for

IDLE = "import time\nprint('app up', flush=True)\nwhile True: time.sleep(1)"


def _spec(check: str) -> dict:
    return {"workload": {"command": [sys.executable, "-c", IDLE],
                         "healthCheck": {"command": [sys.executable, "-c", check], "timeoutSeconds": 2,
                                         "graceSeconds": 0.2}}}


async def _configuration(hub, dev: str) -> dict:
    return (await hub.call("GET", f"/v1/devices/{dev}")).json()["data"]["configuration"]


async def _listed(hub, status: str) -> set[str]:
    r = await hub.call("GET", f"/v1/devices?config_status={status}")
    assert r.status_code == 200, r.text
    return {d["name"] for d in r.json()["data"]}


async def test_the_health_checks_words_reach_the_api_and_the_list_filters_by_status(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        devices = {name: await hub.provision(name) for name in ("rejecting", "running", "bare")}
        for name in ("rejecting", "running"):
            await start_agent(nursery, hub.base_url, devices[name][1], tmp_path / name)
        r = await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": _spec("raise SystemExit(0)")})
        cid = r.json()["data"]["id"]
        for name in ("rejecting", "running"):
            r = await hub.call("PUT", f"/v1/devices/{devices[name][0]}/configuration", json={"configId": cid})
            assert r.status_code == 202, r.text

        async def status_is(name: str, status: str) -> bool:
            return (await _configuration(hub, devices[name][0]))["status"] == status

        for name in ("rejecting", "running"):
            await wait_for(lambda: status_is(name, "applied"), timeout=30)

        # version 2: a secret in its environment and a file, and a health check that says why it fails
        secret = "pw-" + base64.b32encode(b"not-in-any-answer").decode()
        spec = _spec("import sys; print('connecting to db:5432', flush=True); print('db unreachable', file=sys.stderr); "
                     "sys.exit(1)")
        spec["workload"]["env"] = {"DB_PASSWORD": secret}
        r = await hub.call("PUT", f"/v1/configurations/{cid}", json={"spec": spec})
        assert r.status_code == 200, r.text
        v2 = r.json()["data"]["version"]["id"]
        r = await hub.call("POST", f"/v1/configurations/{cid}/secret-files",
                           json={"path": "/var/lib/fleethub/secrets/db", "content_base64": base64.b64encode(
                               secret.encode()).decode()})
        assert r.status_code == 201, r.text
        r = await hub.call("PUT", f"/v1/devices/{devices['rejecting'][0]}/configuration",
                           json={"configId": cid, "versionId": v2})
        assert r.status_code == 202, r.text
        await wait_for(lambda: status_is("rejecting", "rejected"), timeout=30)

        conf = await _configuration(hub, devices["rejecting"][0])
        assert conf["error"].endswith("the health check exited with code 1: db unreachable"), conf["error"]
        assert conf["check_output"] == "connecting to db:5432\ndb unreachable"
        # the log's end: the checks tried until the deadline, each one's lines appended
        assert conf["workload_log"].endswith("connecting to db:5432\ndb unreachable")
        assert (conf["version"], conf["applied_version"]) == (2, 1)  # assigned 2, still runs 1
        r = await hub.call("GET", f"/v1/devices/{devices['rejecting'][0]}")
        assert secret not in r.text

        # the list: each device's status with its versions' numbers, and a filter by status
        r = await hub.call("GET", "/v1/devices")
        listed = {d["name"]: d["configuration"] for d in r.json()["data"]}
        assert listed["rejecting"]["status"] == "rejected" and listed["rejecting"]["check_output"]
        assert (listed["running"]["status"], listed["running"]["applied_version"]) == ("applied", 1)
        assert listed["bare"]["status"] is None
        assert await _listed(hub, "rejected") == {"rejecting"}
        assert await _listed(hub, "applied") == {"running"}
        assert await _listed(hub, "none") == {"bare"}
        r = await hub.call("GET", "/v1/devices?config_status=broken")
        assert r.status_code == 400, r.text

        # assigning again clears the device's words: they belong to the rejection only
        r = await hub.call("PUT", f"/v1/devices/{devices['rejecting'][0]}/configuration",
                           json={"configId": cid, "versionId": v2})
        conf = await _configuration(hub, devices["rejecting"][0])
        if conf["status"] != "rejected":  # it may already be rejected again: then with new words
            assert conf["check_output"] is None and conf["workload_log"] is None
        await wait_for(lambda: status_is("rejecting", "rejected"), timeout=30)
        assert (await _configuration(hub, devices["rejecting"][0]))["check_output"].endswith("db unreachable")


async def test_a_rollouts_failed_step_says_what_the_check_said(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        r = await hub.call("POST", "/v1/fleets", json={"name": "f"})
        fid = r.json()["data"]["id"]
        dev, token = await hub.provision("canary", fleet_id=fid)
        await start_agent(nursery, hub.base_url, token, tmp_path / "canary")
        spec = _spec("print('db unreachable'); raise SystemExit(1)")
        r = await hub.call("POST", "/v1/configurations", json={"name": "bad", "spec": spec})
        cid = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fid], "configuration_id": cid,
                                                         "batch_size": 1})
        assert r.status_code in (200, 201, 202), r.text
        rid = r.json()["data"]["id"]

        async def step() -> dict:
            return (await hub.call("GET", f"/v1/rollouts/{rid}")).json()["data"]["devices"][0]

        async def failed() -> bool:
            return (await step())["step"] == "failed"

        await wait_for(failed, timeout=60, interval=0.2)
        failed_step = await step()
        assert failed_step["error"].endswith("the health check exited with code 1: db unreachable")
        assert failed_step["check_output"] == "db unreachable"
        assert (await _configuration(hub, dev))["check_output"] == "db unreachable"


async def test_a_device_that_sends_more_than_the_bound_fails_the_apply_and_nothing_of_it_is_kept(nursery, db_url,
                                                                                                tmp_path):
    # a device written from the document, not our agent (NUL and the like never get this far: the
    # link refuses such a frame whole, device_client/shared/protocol.py)
    from tests.api.test_link_protocol import connect

    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5)
        sent = {"checkOutput": "x" * 2048, "workloadLog": "app log"}

        async def answer(verb, payload):
            if verb == "config.apply":
                return {"status": "rejected", "configId": payload["configId"], "versionId": payload["versionId"],
                        "error": "health check failed", "rolledBackTo": None, "files": [], **sent}
            return {}

        r = await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": {}})
        cid = r.json()["data"]["id"]
        results = []
        for name in ("at-the-bound", "past-it"):
            dev, token = await hub.provision(name)
            await connect(nursery, hub, token, answer=answer)
            assert (await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid})).status_code == 202

            async def settled(dev=dev) -> bool:
                return (await _configuration(hub, dev))["status"] in ("rejected", "failed")

            await wait_for(settled, timeout=15)
            results.append(await _configuration(hub, dev))
            sent["checkOutput"] += "x"
        at, past = results
        assert at["status"] == "rejected", at["error"]
        assert at["check_output"] == "x" * 2048 and at["workload_log"] == "app log"
        assert past["status"] == "failed" and "checkOutput" in past["error"], past["error"]
        assert past["check_output"] is None and past["workload_log"] is None
