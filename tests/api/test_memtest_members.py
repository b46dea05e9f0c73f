"""The memory-test members a device sends (Status, Health, Result) are typed in the link's schema and
the hub holds devices to them: a malformed report is a protocol error (dropped, shown in the
diagnosis, told to the device with link.notice), as for the other strict payloads. Real hub and
PostgreSQL; the device is tests/api/test_memtests.py's ScriptedDevice on a real WebSocket."""

from __future__ import annotations

import trio

from tests.api.test_memtests import COMMAND_TIMEOUT, HEALTH, ScriptedDevice, mt, result
from tests.hubtools import start_hub, wait_for


async def linked(hub, nursery, name: str) -> tuple[str, ScriptedDevice]:
    dev_id, token = await hub.provision(name)
    device = ScriptedDevice(hub, token)
    await nursery.start(device.run)

    async def online() -> bool:
        return (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]["online"] is True

    await wait_for(online, timeout=10)
    return dev_id, device


async def protocol_errors(hub, dev_id: str) -> str:
    issues = (await hub.call("GET", f"/v1/devices/{dev_id}/diagnosis")).json()["data"]["issues"]
    return " ".join(i["message"] for i in issues if i["code"] == "DeviceProtocolError")


async def stored_runs(hub, dev_id: str) -> list[str]:
    return [x["runId"] for x in (await hub.call("GET", mt(dev_id, "/results"))).json()["data"]["results"]]


async def test_a_malformed_result_or_progress_is_a_protocol_error_and_changes_nothing(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=COMMAND_TIMEOUT)
        dev_id, device = await linked(hub, nursery, "guesser")
        # the guesses a device written without the types made: a count as text, an outcome not the spec's
        await device.event("memtest.result", {"result": result("bad-count", errorCount="none")})
        await device.event("memtest.result", {"result": result("bad-outcome", outcome="passed")})
        await wait_for(lambda: _contains(protocol_errors(hub, dev_id), "outcome"), timeout=10)
        text = await protocol_errors(hub, dev_id)
        assert "event memtest.result: result.errorCount" in text or "result.outcome" in text
        await wait_for(lambda: _notices(device) >= 2, timeout=10)
        assert all(p["code"] == "malformed_result" for v, p in device.commands if v == "link.notice")
        assert await stored_runs(hub, dev_id) == []
        assert device.acked == []

        r = await hub.call("POST", mt(dev_id), json={"passes": 3})
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["runId"]
        await device.event("memtest.progress", {**device.running, "phase": "testing", "testedBytes": "lots"})
        await wait_for(lambda: _contains(protocol_errors(hub, dev_id), "testedBytes"), timeout=10)
        status = (await hub.call("GET", mt(dev_id))).json()["data"]["status"]
        assert status["phase"] == "preparing" and status.get("testedBytes") != "lots"

        # well-formed ones are taken as before
        await device.event("memtest.result", {"result": result(run_id)})
        await wait_for(lambda: _contains(stored_runs(hub, dev_id), run_id), timeout=10)


async def test_a_malformed_status_reply_is_a_protocol_error_and_read_as_no_answer(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=COMMAND_TIMEOUT)
        dev_id, device = await linked(hub, nursery, "sloppy")

        async def status(p: dict) -> dict:
            return {"supported": True, "status": device.running, "health": {**HEALTH, "edac": {"correctable": "n/a", "uncorrectable": -1}},
                    "history": []}

        device.handlers["memtest.status"] = status
        # read as a device that did not answer: what the hub stored, never the malformed health
        r = await hub.call("GET", mt(dev_id))
        assert r.status_code == 200, r.text
        assert r.json()["data"]["source"] == "stored" and "edac" not in r.json()["data"]["health"]
        assert "reply to memtest.status: health.edac.correctable" in await protocol_errors(hub, dev_id)
        # a device that says busy and then reads out a malformed status: the 409 carries no status
        device.running = {"runId": "other", "phase": "testing"}
        r = await hub.call("POST", mt(dev_id), json={})
        assert r.status_code == 409 and r.json()["error"] == "busy", r.text
        assert r.json().get("status") is None


async def test_the_schema_types_status_health_and_result_with_the_specs_names(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        doc = (await hub.call("GET", "/v1/device/protocol.json")).json()
        status = doc["verbs"]["memtest.status"]
        assert status["strict"] is True
        defs = status["reply"]["$defs"]
        assert set(defs["MemtestStatus"]["properties"]) >= {
            "runId", "plan", "phase", "pass", "passes", "pattern", "testedBytes", "coverageBytes", "totalBytes",
            "rateBps", "etaSeconds", "errors", "confirmedErrors", "tempMilliC", "startedAt"}
        assert set(defs["MemtestHealth"]["properties"]) >= {
            "capabilities", "hardwareCorruptedBytes", "edac", "retiredPages", "fault", "faultReason", "lastResult"}
        result_ = doc["events"]["memtest.result"]["payload"]["$defs"]["MemtestResult"]
        assert set(result_["properties"]) >= {
            "runId", "plan", "source", "startedAt", "finishedAt", "outcome", "verdict", "summary", "passesCompleted",
            "patternsRun", "testedBytes", "coverageBytes", "totalBytes", "maxTempMilliC", "kernel", "errors",
            "errorCount", "retired", "fault", "interrupted", "pages"}
        assert result_["properties"]["outcome"]["enum"] == ["pass", "fail", "cancelled", "interrupted", "error"]
        assert set(result_["required"]) == {"runId", "outcome", "verdict"}
        progress = doc["events"]["memtest.progress"]
        assert progress["strict"] is True and "phase" in progress["payload"]["required"]


async def _contains(value, item) -> bool:
    return item in await value


def _notices(device: ScriptedDevice) -> int:
    return sum(1 for v, _ in device.commands if v == "link.notice")
