"""/metrics from prometheus_client: a registry per hub, histograms with buckets, the process collector,
the wait for a pooled connection counted apart from the crossing (storage/db.py), and the event loop's
stalls (device_client/shared/loopwatch.py)."""

from __future__ import annotations

import time

import pytest
import trio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from device_client.shared import loopwatch
from hub.metrics import Metrics
from storage.db import Database
from actors.machines import window as window_machine
from hub import server
from tests.hubtools import metric_value, metrics, start_hub, threads_calling


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path)


def _samples(text: str, name: str) -> list:
    """The samples of one family, read by prometheus_client's own parser (labels in any order)."""
    return [s for f in text_string_to_metric_families(text) if f.name == name for s in f.samples]


def _buckets(text: str, name: str, **labels: str) -> list[tuple[str, float]]:
    """(le, count) of a histogram's buckets with these labels, in the order exposed."""
    return [(s.labels["le"], s.value) for s in _samples(text, name) if s.name == name + "_bucket"
            and all(s.labels.get(k) == v for k, v in labels.items())]


async def test_request_latency_histogram_process_collector_and_pool_wait(hub):
    with trio.fail_after(30):
        for _ in range(3):
            assert (await hub.call("GET", "/v1/devices")).status_code == 200
        text = await metrics(hub)
        assert "# TYPE fleethub_http_request_duration_seconds histogram" in text
        buckets = _buckets(text, "fleethub_http_request_duration_seconds", method="GET")
        assert len(buckets) > 5 and buckets[-1][0] == "+Inf", buckets
        counts = [n for _, n in buckets]
        assert counts == sorted(counts), "buckets are cumulative"
        count = metric_value(text, "fleethub_http_request_duration_seconds_count", {"method": "GET"})
        assert count == counts[-1] >= 3
        assert count == metric_value(text, "fleethub_http_requests_total", {"method": "GET", "status": "200"})
        assert metric_value(text, "fleethub_http_request_duration_seconds_sum", {"method": "GET"}) > 0
        # the process collector: what the benchmarks read instead of /proc
        assert metric_value(text, "process_resident_memory_bytes") > 10_000_000
        assert metric_value(text, "process_open_fds") > 0
        assert metric_value(text, "process_cpu_seconds_total") > 0
        # each crossing waited for a pooled connection (maybe for no time at all): one wait per crossing
        assert "# TYPE fleethub_storage_pool_wait_seconds histogram" in text
        waits = metric_value(text, "fleethub_storage_pool_wait_seconds_count")
        assert waits and waits > 0
        assert metric_value(text, "fleethub_storage_pool_wait_seconds_bucket", {"le": "+Inf"}) == waits


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what an import, a large document or a blocking call does on the trio thread


async def test_a_stall_of_the_event_loop_is_counted_and_logged_with_the_code_that_held_it(
        nursery, db_url, tmp_path, caplog, monkeypatch):
    monkeypatch.delenv(loopwatch.ENV, raising=False)  # the default, whatever the suite was run with
    hub = await start_hub(nursery, db_url, tmp_path)
    watch = loopwatch.current()
    assert watch is not None and watch.stalls.threshold == loopwatch.DEFAULT_THRESHOLD  # run_hub started it
    with trio.fail_after(30):
        text = await metrics(hub)
        before = metric_value(text, "fleethub_event_loop_stalls_total")
        assert before is not None
        # a stall while this hub started on a busy machine (building its app) may have taken the
        # watch's one warning per 10 s: this test's hold is logged whatever came before
        monkeypatch.setattr(watch.stalls, "report_every", 0.0)
        # 2 s: the watch's thread looks every 0.125 s and sees the stall from 0.6 s on, even when busy
        _hold_the_loop(2.0)
        await trio.sleep(0.3)  # the watch's task runs again: the stall has ended and is counted
        text = await metrics(hub)
    assert metric_value(text, "fleethub_event_loop_stalls_total") >= before + 1
    assert metric_value(text, "fleethub_event_loop_longest_stall_seconds") >= 1.5
    assert metric_value(text, "fleethub_event_loop_stall_seconds_total") >= 1.5
    logged = [r.getMessage() for r in caplog.records if r.name == "fleethub.loop"]
    held = [m for m in logged if "_hold_the_loop" in m]
    assert held, logged
    # the frames that held it, innermost last, without source lines or values
    assert held[0].startswith("the event loop has been held for ") and "test_metrics.py" in held[0]
    assert "the process ran little of it" in held[0]  # a sleep runs nothing: the CPU clocks say so
    assert held[0].rstrip().splitlines()[-1].endswith("in _hold_the_loop")


async def test_the_hub_builds_its_app_and_reads_the_zone_names_in_worker_threads(nursery, db_url, tmp_path,
                                                                                 monkeypatch):
    """Building the app took 0.1-0.5 s of the loop at every start (a stall logged on a busy host), while
    the services' tasks already ran on it, and the first update window checked read the tz database's
    names from disk on it: both in worker threads now, as the hub starts, and that app serves."""
    built = threads_calling(monkeypatch, server, "create_app")
    zones = threads_calling(monkeypatch, window_machine, "zone_names")
    hub = await start_hub(nursery, db_url, tmp_path)
    assert zones == [False], zones  # before any window is checked, whoever asks next finds them read
    with trio.fail_after(30):
        r = await hub.call("GET", "/v1/devices")
    assert r.status_code == 200, r.text
    assert built == [False], built


async def test_every_outbox_has_the_same_four_families_by_kind(hub):
    # storage/behind.py: one mechanism for every write that waits out an outage, so one set of metrics
    with trio.fail_after(30):
        text = await metrics(hub)
        kinds = {"presence", "audit", "active_device", "metering", "tunnel_usage"}
        for family, sample in (("fleethub_write_behind_rows", "_total"), ("fleethub_write_behind_set_aside", "_total"),
                               ("fleethub_write_behind_dropped", "_total"), ("fleethub_write_behind_pending", "")):
            assert {s.labels["kind"] for s in _samples(text, family) if s.name == family + sample} == kinds, family


async def test_each_hub_has_its_own_registry():
    # Two hubs in one process (the tests start many): on prometheus_client's global registry the second
    # would fail with "Duplicated timeseries", or both would count each other's requests.
    with trio.fail_after(5):
        first, second = Metrics(), Metrics()
        first.observe_request("GET", 200, 0.003)
        first.observe_request("GET", 200, 0.2)
        one = generate_latest(first.registry).decode()
        other = generate_latest(second.registry).decode()
        assert metric_value(one, "fleethub_http_requests_total", {"method": "GET", "status": "200"}) == 2
        assert metric_value(other, "fleethub_http_requests_total", {"method": "GET", "status": "200"}) is None
        latency = dict(_buckets(one, "fleethub_http_request_duration_seconds", method="GET"))
        assert (latency["0.0025"], latency["0.005"], latency["0.1"], latency["0.25"]) == (0, 1, 1, 2)
        assert _buckets(other, "fleethub_http_request_duration_seconds") == []
        # a client's made-up methods share one series instead of one each
        for k in range(50):
            second.observe_request(f"BREW{k}", 405, 0.001)
        other = generate_latest(second.registry).decode()
        assert metric_value(other, "fleethub_http_requests_total", {"method": "other", "status": "405"}) == 50
        assert "BREW" not in other


async def test_waiting_for_a_pooled_connection_is_not_counted_as_the_crossing(db_url):
    # One connection: a statement holding it for 1 s makes the next one wait ~0.9 s for the pool. That
    # wait lands in pool_wait_stats; the second crossing itself stays short (under 0.1 s).
    db = Database(db_url, min_size=1, max_size=1)
    with trio.fail_after(30):
        await db.open()
        try:
            await db.fetchval("SELECT 1")  # warm: the pool's connection exists
            fast = db.stats.bounds.index(0.1)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(db.execute, "SELECT pg_sleep(1.0)")
                await trio.sleep(0.1)  # the sleeper has the only connection
                waits_before, fast_before = db.pool_wait_stats.count, db.stats.buckets[fast]
                assert await db.fetchval("SELECT 2") == 2
            waited = db.pool_wait_stats
            assert waited.count == waits_before + 2  # the sleeper's wait and ours
            assert waited.total_seconds >= 0.5, "our wait for the held connection was counted"
            assert waited.buckets[waited.bounds.index(0.1)] < waited.count, "a wait over 0.1 s is in no ≤ 0.1 bucket"
            # of the two crossings (the sleeper's 1 s, ours) ours is in the ≤ 0.1 s bucket: its wait is apart
            assert db.stats.buckets[fast] == fast_before + 1
        finally:
            await db.close()
