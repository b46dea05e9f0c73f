"""A device is never locked out by its own data (issue 19, item 2), against a real hub and agent.

The hub here refuses frames past 48 KiB (``hub.frames.MAX_FRAME_BYTES`` lowered; its welcome still
says 1 MiB, as a hub behind a stricter proxy would): so a real memory-test result of a data-line
fault is refused with 1009 and a reason. The agent must trim it, record that it did, come back online
and never send the refused frame again; the hub counts the refusal on /metrics and in the diagnosis.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import trio

from device_client.memtest import MemtestConfig
from device_client.shared import pagemap
from hub import frames
from tests.hubtools import assert_error, metric_value, metrics, start_agent, start_hub, wait_for

SMALL_LIMIT = 48 << 10


@pytest.fixture
async def strict_hub(nursery, db_url, tmp_path, monkeypatch):
    monkeypatch.setattr(frames, "MAX_FRAME_BYTES", SMALL_LIMIT)
    return await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=2.0)


async def _results(hub, dev_id: str) -> list[dict]:
    r = await hub.call("GET", f"/v1/devices/{dev_id}/memory-test/results")
    assert r.status_code == 200, r.text
    return r.json()["data"]["results"]


async def _refused(hub, dev_id: str) -> float:
    return metric_value(await metrics(hub), "fleethub_device_frames_refused_by_device_total",
                        {"device_id": dev_id}) or 0


async def test_a_result_the_hub_refuses_is_trimmed_once_and_the_device_comes_back(strict_hub, nursery, tmp_path):
    hub = strict_hub
    with trio.fail_after(120):
        dev_id, token = await hub.provision("faulty")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent",
                                    memtest=MemtestConfig(budget=2 << 20, fault="data_line"))
        r = await hub.call("POST", f"/v1/devices/{dev_id}/memory-test", json={"quick": True})
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["runId"]

        async def stored() -> bool:
            return any(x["runId"] == run_id for x in await _results(hub, dev_id))

        await wait_for(stored, timeout=60, interval=0.2)
        [res] = await _results(hub, dev_id)
        assert (res["outcome"], res["verdict"]) == ("fail", "data_line")
        assert res["errorCount"] > 1_000_000 and res["trimmed"]["stage"] == 0
        assert "over the limit of 49152 bytes" in res["trimmed"]["reason"]
        assert len(res["pages"]) == 16 and res["pageSummary"]["omittedPages"] == 512 - 16
        # the device is back and stays: the refused frame was not sent again
        await wait_for(lambda: running.agent.connected, timeout=10)
        await trio.sleep(1.0)
        assert await _refused(hub, dev_id) == 1
        assert running.agent.statistics().links == 2
        [record] = running.agent.frames.records()
        assert (record["frame"], record["by"], record["action"]) == ("event memtest.result", "hub", "trimmed")
        assert record["reported"] is True  # sent to the hub as link.refused at the next link
        await wait_for(lambda: running.agent.memtest.store.unacked() == [], timeout=10)

        async def faulted() -> bool:
            d = (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]
            return d["online"] and any(c["type"] == "MemoryFault" for c in d["conditions"])

        await wait_for(faulted, timeout=10)
        diag = (await hub.call("GET", f"/v1/devices/{dev_id}/diagnosis")).json()["data"]
        codes = {i["code"]: i for i in diag["issues"]}
        assert diag["status"] == "critical" and codes["MemoryFault"]["details"]["verdict"] == "data_line"
        assert codes["LinkFramesRefused"]["details"]["lastFrame"] == "event memtest.result"
        summarised = codes["MemoryTestPageMapSummarised"]
        assert summarised["severity"] == "info" and summarised["details"]["pagesWithErrors"] == 512
        assert "496 pages" in summarised["message"] and "trimmed" in summarised["message"]


async def test_a_refused_frame_nobody_can_trim_is_dropped_and_never_sent_again(strict_hub, nursery, tmp_path):
    hub = strict_hub
    with trio.fail_after(60):
        dev_id, token = await hub.provision("chatty")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        blob = {"blob": "x" * (SMALL_LIMIT + 1)}
        assert await running.agent.send_event("test.blob", blob)
        await wait_for(lambda: running.agent.statistics().links == 2 and running.agent.connected, timeout=10)
        assert await _refused(hub, dev_id) == 1
        # the same frame again: the agent knows the hub refused it and does not send it
        assert await running.agent.send_event("test.blob", blob)
        # nor another one over the limit the refusal showed (the welcome said 1 MiB)
        assert running.agent.frames.limit == SMALL_LIMIT
        assert await running.agent.send_event("test.other", {"blob": "y" * (SMALL_LIMIT + 1)})
        await trio.sleep(0.5)
        assert await _refused(hub, dev_id) == 1 and running.agent.statistics().links == 2
        assert [(r["by"], r["action"]) for r in running.agent.frames.records()] == [
            ("hub", "dropped"), ("agent", "dropped"), ("agent", "dropped")]
        actor = hub.services.registry.lookup(("device", uuid.UUID(dev_id)))
        assert actor is not None and actor.machine.online


# -- the full page map goes over HTTP (issue 19, item 3) -------------------------------------------------
async def test_the_full_page_map_is_uploaded_stored_and_read_by_operators(nursery, db_url, tmp_path):
    import gzip

    hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=2.0)
    with trio.fail_after(120):
        dev_id, token = await hub.provision("faulty")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent",
                                    memtest=MemtestConfig(budget=2 << 20, fault="data_line"))
        r = await hub.call("POST", f"/v1/devices/{dev_id}/memory-test", json={"quick": True})
        run_id = r.json()["data"]["runId"]
        path = f"/v1/devices/{dev_id}/memory-test/results/{run_id}/page-map"

        async def uploaded() -> bool:
            return (await hub.call("GET", path)).status_code == 200

        await wait_for(uploaded, timeout=60, interval=0.2)
        [res] = await _results(hub, dev_id)
        assert res["pageSummary"]["fullMap"] is True and len(res["pages"]) == 256
        full = (await hub.call("GET", path)).json()["data"]
        assert full["complete"] is True and full["pagesWithErrors"] == 512 == res["pageSummary"]["pagesWithErrors"]
        assert sum(n for _, n, _ in full["runs"]) == 512
        assert sum(n * e for _, n, e in full["runs"]) == res["errorCount"] == full["errorCount"]
        assert len(full["runs"]) < 10  # a data line fails every page alike: a few runs, whatever the size
        await wait_for(lambda: running.agent.memtest.store.page_maps() == [], timeout=10)
        # the device's status reply carries its history brief (eleven full results could pass the
        # frame limit); the hub serves the stored full result in its place
        status = (await running.agent.memtest._status({}))
        assert status["history"][0]["brief"] is True and status["history"][0]["pages"] == []
        live = (await hub.call("GET", f"/v1/devices/{dev_id}/memory-test")).json()["data"]
        assert live["source"] == "live" and len(live["history"][0]["pages"]) == 256
        assert "brief" not in live["history"][0] and len(live["health"]["lastResult"]["errors"]) == 256

        put = f"{hub.base_url}/v1/device/memory-tests/{run_id}/page-map"
        auth = {"Authorization": f"Bearer {token}"}
        assert (await hub.client.put(put, content=b"x")).status_code == 401
        assert (await hub.client.put(put, content=b"not gzip", headers=auth)).status_code == 400
        bomb = gzip.compress(b" " * (64 << 20))  # inflates past 16 MiB
        r = await hub.client.put(put, content=bomb, headers=auth)
        assert r.status_code == 400 and "inflates" in r.json()["message"]
        r = await hub.client.put(put, content=b"\0" * ((1 << 20) + 1), headers=auth)
        assert r.status_code == 413
        assert (await hub.call("GET", path.replace(run_id, "other"))).status_code == 404
        other_id, other_token = await hub.provision("other")
        assert (await hub.call("GET", path.replace(dev_id, other_id))).status_code == 404

        # Issue 31 item 4: one device token filled the table with maps of invented runs (60 x 1 MiB,
        # all 201). A map now belongs to a stored result of that device; a device keeps 8 maps and
        # uploads at most 6 a minute.
        hostile = {"Authorization": f"Bearer {other_token}"}
        org = uuid.UUID(hub.org_id)

        def body_for(rid: str) -> bytes:
            runs = np.array([[0x1000, 1, 1]], dtype=np.int64)
            return pagemap.encode(rid, runs, page_size=4096, address_kind="virtual", error_count=1)

        r = await hub.client.put(f"{hub.base_url}/v1/device/memory-tests/invented/page-map",
                                 content=body_for("invented"), headers=hostile)
        assert_error(r, 404, "run_not_found")
        r = await hub.client.put(put, content=body_for(run_id), headers=hostile)  # another device's run
        assert_error(r, 404, "run_not_found")
        s = hub.services
        for i in range(10):  # ten real results of the hostile device, stored as the hub stores them
            await s.stores.memtests.save_result(org, uuid.UUID(other_id), {"runId": f"r{i}", "outcome": "pass"},
                                         s.clock.now())
        codes = []
        for i in range(10):
            r = await hub.client.put(f"{hub.base_url}/v1/device/memory-tests/r{i}/page-map",
                                     content=body_for(f"r{i}"), headers=hostile)
            codes.append(r.status_code)
        # two refusals above, four stored: then the minute's uploads are spent
        assert codes == [201] * 4 + [429] * 6, codes
        assert int(r.headers["Retry-After"]) >= 1
        s.access.upload_limiter = type(s.access.upload_limiter)(window=60)  # the next minute
        for i in range(4, 10):
            r = await hub.client.put(f"{hub.base_url}/v1/device/memory-tests/r{i}/page-map",
                                     content=body_for(f"r{i}"), headers=hostile)
            assert r.status_code == 201, r.text
        kept = await s.db.fetch("SELECT run_id FROM memtest_page_maps WHERE device_id = $1 ORDER BY run_id",
                                uuid.UUID(other_id))
        assert [k["run_id"] for k in kept] == [f"r{i}" for i in range(2, 10)]  # the 8 newest


async def test_a_command_too_big_for_the_link_is_never_sent_and_the_caller_hears_why(nursery, db_url, tmp_path):
    """Hub → device: a command over the limit is refused before it is sent (the device would close
    the link with 1009 and come back to the same command); the device stays linked."""
    from device_client.shared.protocol import subject
    from hub.errors import DeviceError

    hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=2.0)
    with trio.fail_after(30):
        dev_id, token = await hub.provision("dev")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        with pytest.raises(DeviceError) as info:
            await hub.services.bus.request(subject(dev_id, "ping"), {"blob": "x" * (1 << 20)}, timeout=5)
        assert info.value.code == "frame_too_large" and "1048576" in info.value.message
        r = await hub.call("POST", f"/v1/devices/{dev_id}/ping")
        assert r.status_code == 200 and running.agent.statistics().links == 1
