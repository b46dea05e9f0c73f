"""Every frame of the device link fits its limit by construction (issue 19, item 1).

Each frame type's worst case is built from the limits the code names (device_client/memtest/bounds.py,
confirm.py, storage/secrets.py, device_client/shared/paths.py, linkframes.py) with every number at its widest
and every free text at its longest in 4-byte characters, and encoded with ``protocol.encode``, which
refuses anything over ``MAX_FRAME_BYTES``. The memory-test result comes from a real run whose lists
reach their caps (a data-line fault fails every page), then widened.
"""

from __future__ import annotations

import copy
import json

import pytest
import trio
import trio.testing

from device_client.shared import protocol
from device_client.shared.clock import TestClock
from device_client.configs import MAX_REGISTRY_LOGINS
from device_client.linkframes import KEEP, FrameGuard
from device_client.shared import imageref
from hub.api.registry_credentials import MAX_PASSWORD, MAX_USERNAME
from device_client.memtest import bounds
from device_client.memtest.confirm import CONFIRM_MAX_PAGES
from device_client.memtest.hwsim import Hardware
from device_client.memtest.runner import Run
from device_client.memtest.tester import _ended_status
from device_client.shared.paths import MAX_PATH_BYTES
from storage.secrets import MAX_FILES, MAX_TOTAL_BYTES

LIMIT = protocol.MAX_FRAME_BYTES
WIDE_INT = 2**64 - 1
WIDE_CHAR = "\U0001F4A5"  # 4 bytes in UTF-8: the widest a character gets in a frame


def widen(value, text_len: dict[str, int] | None = None, key: str = ""):
    """Every int at its widest; free-text members (``text_len``: name → max characters) at their longest."""
    text_len = text_len or {}
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return WIDE_INT
    if isinstance(value, float):
        return -1.7976931348623157e308
    if isinstance(value, str):
        return WIDE_CHAR * text_len[key] if key in text_len else value
    if isinstance(value, list):
        return [widen(v, text_len, key) for v in value]
    return {k: widen(v, text_len, k) for k, v in value.items()}


def size(frame: protocol._Frame) -> int:
    return len(protocol.encode(frame).encode())  # encode raises FrameTooLarge past the limit


@pytest.fixture(scope="module")
def worst_result():
    """A real data-line run over 2 MiB (512 pages, every one failing: more than RESULT_PAGES) made a
    test boot (kernel ranges), every number widened, every list at its cap."""

    async def run() -> dict:
        plan = {"mode": "test_boot", "passes": 1, "kernelPasses": 1, "bitFade": False, "holdOnFailure": True,
                "timeBudgetSeconds": 43200, "quick": False, "impact": "stopped", "placement": "offline",
                "maxBytes": 2**50}

        async def progress(status):
            pass

        r = Run("r" * 36, plan, size=2 << 20, clock=TestClock(), hw=Hardware(simulated=True),
                checkpoint=lambda c: None, progress=progress, fault="data_line", physical=False,
                chunk_words=1 << 15)
        return await r.execute()

    result = trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(result["errors"]) == bounds.RESULT_ERRORS and len(result["pages"]) == bounds.RESULT_PAGES
    assert result["pageSummary"]["omittedPages"] == 512 - bounds.RESULT_PAGES
    result["kernel"]["badRanges"] = [{"start": 0, "end": 0}] * bounds.KERNEL_RANGES
    result["retired"] = [0] * CONFIRM_MAX_PAGES
    result["message"] = "x"
    result["faultReason"] = "x"
    # what the tester adds (tester.MemoryTester._details): the hardware and versions of the run
    result["hardware"] = {"architecture": "x" * 64, "memTotalBytes": 0, "simulated": True, "budgetBytes": 0,
                          "edac": {"correctable": 0, "uncorrectable": 0}}
    result["versions"] = {"agent": "x" * 64, "firmware": "x", "engine": "x" * 64}
    worst = widen(result, {"message": bounds.MESSAGE_MAX, "faultReason": 200, "firmware": protocol.FACT_MAX})
    assert bounds.bound(worst) == worst, "the real result is at the caps: bound() leaves it alone"
    return worst


def test_a_result_is_bounded_whatever_the_memory_size(worst_result):
    n = size(protocol.Event(kind="memtest.result", payload={"result": worst_result}))
    assert n <= LIMIT // 4, n  # a quarter of the limit: room for the hello's other members


def test_bound_caps_a_result_an_older_agent_stored():
    pages = [{"page": p * 4096, "errors": p % 7, "confirmed": None} for p in range(100_000)]
    old = {"runId": "old", "errorCount": 5_452_595_200, "errors": [{"physAddr": 1}] * 10_000, "pages": pages,
           "kernel": {"badRanges": [{"start": 0, "end": 4096}] * 10_000}, "message": "m" * 10_000}
    capped = bounds.bound(old)
    assert len(capped["pages"]) == bounds.RESULT_PAGES and len(capped["errors"]) == bounds.RESULT_ERRORS
    assert all(p["errors"] == 6 for p in capped["pages"])  # the most errors first
    assert capped["pageSummary"] == {"pagesWithErrors": 100_000, "listedPages": 256, "omittedPages": 99_744,
                                     "omittedErrors": 5_452_595_200 - 256 * 6, "order": "most errors first"}
    assert len(capped["kernel"]["badRanges"]) == bounds.KERNEL_RANGES and capped["kernel"]["badPages"] == 10_000
    assert len(capped["message"]) == bounds.MESSAGE_MAX
    assert len(json.dumps(capped)) < 200_000


def _worst_status(result: dict) -> dict:
    status = _ended_status(result)
    status["pattern"] = "x"
    return widen(status, {"pattern": 32})


def _worst_health(result: dict) -> dict:
    return widen({"capabilities": {"online": True, "offline": False, "offlineReason": "x"},
                  "hardwareCorruptedBytes": 0, "edac": {"correctable": 0, "uncorrectable": 0}, "simulated": True,
                  "retiredPages": 0, "retired": [0] * bounds.RETIRED_LISTED, "fault": True, "faultReason": "x",
                  "kernelErrors": ["x"] * bounds.KERNEL_LINES, "lastResult": bounds.brief(result)},
                 {"offlineReason": 100, "faultReason": 200, "kernelErrors": bounds.KERNEL_LINE_MAX})


def test_the_hello_with_every_list_at_its_limit(worst_result):
    # the device's own files and its configuration's: each at most MAX_FILES, paths at their longest
    digests = {f"/{i:04d}" + WIDE_CHAR * ((MAX_PATH_BYTES - 6) // 4): "f" * 64 for i in range(2 * MAX_FILES)}
    hello = protocol.Hello(
        agentVersion="x" * 64, firmware=WIDE_CHAR * protocol.FACT_MAX, architecture=WIDE_CHAR * protocol.FACT_MAX,
        bootReason="memory_test_done", deviceClock="2026-01-01T00:00:00.000000Z", tunnelPublicKey="k" * 44,
        configVersionApplied="v" * 36, secretFileDigests=digests, retiredPages=[WIDE_INT] * bounds.RETIRED_LISTED,
        lastMemoryTest=worst_result, memoryTestRunning=_worst_status(worst_result), maintenance=True,
        workloadHeld=True, pendingActions=["health_check", "battery_discharging", "mission_critical"])
    assert size(hello) <= LIMIT


def test_memtest_status_reply_progress_and_health(worst_result):
    reply = protocol.Reply(id="x" * 32, ok=True, payload={
        "supported": True, "status": _worst_status(worst_result), "health": _worst_health(worst_result),
        "history": [bounds.brief(worst_result)] * 10})
    assert size(reply) <= LIMIT
    assert size(protocol.Event(kind="memtest.progress", payload=_worst_status(worst_result))) <= 16 << 10
    assert size(protocol.Event(kind="memtest.health", payload={"health": _worst_health(worst_result)})) <= LIMIT


def test_link_refused_report(tmp_path):
    record = widen({"frame": "event memtest.result", "bytes": 0, "limit": 0, "by": "hub", "action": "trimmed",
                    "reason": "x", "at": "2026-01-01T00:00:00.000Z"}, {"reason": 200})
    assert size(protocol.Event(kind="link.refused", payload={"refusals": [record] * KEEP})) <= 64 << 10


def test_files_put_with_every_device_file_at_its_limit():
    each = MAX_TOTAL_BYTES // MAX_FILES
    files = [{"fileId": "f" * 36, "path": "/" + WIDE_CHAR * ((MAX_PATH_BYTES - 1) // 4), "mode": 0o600,
              "uid": WIDE_INT, "gid": WIDE_INT, "contentB64": "A" * (4 * -(-each // 3)), "sha256": "0" * 64,
              "source": "device", "configId": "c" * 36} for _ in range(MAX_FILES)]
    assert size(protocol.Command(id="x" * 32, subject="cmd." + "d" * 36 + ".files.put",
                                 payload={"files": files})) <= LIMIT


def test_config_apply_with_the_largest_spec_and_every_file_at_its_limit():
    """The hub refuses a spec over CONFIG_SPEC_MAX_BYTES when it is saved (hub/api/configurations.py), so
    the largest config.apply is that spec beside a configuration's files at their limits."""
    each = MAX_TOTAL_BYTES // MAX_FILES
    files = [{"fileId": "f" * 36, "path": "/" + WIDE_CHAR * ((MAX_PATH_BYTES - 1) // 4), "mode": 0o600,
              "uid": WIDE_INT, "gid": WIDE_INT, "contentB64": "A" * (4 * -(-each // 3)), "sha256": "0" * 64,
              "source": "configuration", "configId": "c" * 36} for _ in range(MAX_FILES)]
    spec = {"blob": "x" * (protocol.CONFIG_SPEC_MAX_BYTES - len('{"blob":""}'))}
    assert len(json.dumps(spec, separators=(",", ":")).encode()) == protocol.CONFIG_SPEC_MAX_BYTES
    # a login per container's registry, each at the hub's limits (hub/api/registry_credentials.py: ASCII)
    logins = {f"{i:02d}" + "r" * (imageref.MAX_NAME - 4): {"username": "u" * MAX_USERNAME, "password": "p" * MAX_PASSWORD}
              for i in range(MAX_REGISTRY_LOGINS)}
    payload = {"configId": "c" * 36, "versionId": "v" * 36, "version": WIDE_INT, "spec": spec, "files": files,
               "registryAuth": logins}
    assert size(protocol.Command(id="x" * 32, subject="cmd." + "d" * 36 + ".config.apply", payload=payload)) <= LIMIT


async def test_a_frame_over_the_limit_is_never_encoded_and_a_reply_becomes_too_large(tmp_path):
    big = {"blob": "x" * (LIMIT + 1)}
    with trio.fail_after(10):
        await trio.lowlevel.checkpoint()
    with pytest.raises(protocol.FrameTooLarge):
        protocol.encode(protocol.Event(kind="test.big", payload=big))
    guard = FrameGuard(tmp_path, TestClock())
    text, reply = guard.encode_reply(protocol.Reply(id="r1", ok=True, payload=big))
    assert len(text) < 1024 and reply.error.code == "too_large"
    assert guard.encode_event("test.big", big) is None  # no trimmer for this kind: dropped, recorded
    assert [r["action"] for r in guard.records()] == ["dropped", "dropped"]


async def test_a_hello_past_the_limit_drops_what_the_hub_learns_again_later(tmp_path, worst_result):
    with trio.fail_after(10):
        await trio.lowlevel.checkpoint()
    guard = FrameGuard(tmp_path, TestClock(), limit=64 << 10)
    fields = {"agentVersion": "1", "bootReason": "power_on", "lastMemoryTest": worst_result,
              "retiredPages": [1] * 10}
    text = guard.encode_hello(copy.deepcopy(fields))
    hello = protocol.decode(text)
    assert hello.lastMemoryTest is None and hello.retiredPages == [1] * 10
    assert guard.records()[0]["frame"] == "hello" and guard.records()[0]["action"] == "trimmed"


async def test_a_hello_the_hub_refused_starts_one_stage_smaller_next_time(tmp_path, worst_result):
    with trio.fail_after(10):
        await trio.lowlevel.checkpoint()
    guard = FrameGuard(tmp_path, TestClock())
    fields = {"agentVersion": "1", "bootReason": "power_on", "lastMemoryTest": worst_result}
    assert protocol.decode(guard.encode_hello(dict(fields))).lastMemoryTest is not None
    guard.refused_by_hub("hello frame of 160000 bytes is over the limit of 100000 bytes")
    assert guard.learned == 100_000 and guard.hello_stage == 1
    assert protocol.decode(guard.encode_hello(dict(fields))).lastMemoryTest is None
    guard.linked(1 << 20)  # a welcome that says more does not undo what the refusal showed
    assert guard.limit == 100_000


def test_what_the_device_keeps_for_the_hub_is_bounded_whatever_the_history(tmp_path):
    from device_client.memtest.store import HISTORY, UNACKED, MemtestStore

    store = MemtestStore(tmp_path)
    big = {"errorCount": 10**10, "errors": [{"physAddr": 1}] * 1000, "pages": [{"page": 0, "errors": 1}] * 1000}
    for i in range(UNACKED + 8):
        store.add_result({"runId": f"r{i}", **big})
    assert len(store.history()) == HISTORY and len(store.unacked()) == UNACKED
    assert store.unacked()[-1]["runId"] == f"r{UNACKED + 7}"  # the newest are kept
    assert all(len(r["errors"]) == bounds.RESULT_ERRORS and len(r["pages"]) == bounds.RESULT_PAGES
               for r in store.unacked())
