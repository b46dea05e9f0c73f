"""The memory tester's engine, patterns, fault model, confirmation and verdicts, over real memory.

No IO beyond memory (and /proc/self/pagemap). Runs go through runner.Run on trio's autojump clock so
idle decay's 5 minutes cost nothing.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import trio

from device_client.shared import protocol
from device_client.shared.clock import TestClock
from device_client.memtest import confirm as confirm_mod
from device_client.memtest.engine import PAGE_WORDS, Engine, Region, drain
from device_client.memtest.faults import ADDRESS_LINE_BIT, DATA_LINE_BIT, FaultModel
from device_client.memtest.hwsim import Hardware
from device_client.memtest.patterns import (
    ALL,
    HALVES,
    Pair,
    Random,
    full_suite,
    memtester_suite,
    splitmix64,
)
from device_client.memtest.runner import Run
from device_client.memtest.verdict import Findings

U64 = np.uint64


def test_splitmix_replays_any_word_alone():
    whole = splitmix64(42, np.arange(10_000, dtype=U64))
    assert len(set(whole.tolist())) == 10_000  # no repeats: it is random-looking data
    picked = np.array([0, 1, 4095, 9999], dtype=U64)
    assert splitmix64(42, picked).tolist() == whole[[0, 1, 4095, 9999]].tolist()
    assert splitmix64(43, picked).tolist() != whole[[0, 1, 4095, 9999]].tolist()


def test_suite_names_every_pattern_of_the_spec():
    names = [p.name for p in full_suite(1, idle_decay=True)]
    for wanted in ("stuck_address", "random_value", "compare_xor", "compare_sub", "compare_mul",
                   "compare_or", "compare_and", "solid_bits", "block_sequential", "checkerboard",
                   "bit_spread", "bit_flip", "walking_ones", "walking_zeros", "moving_inversions",
                   "idle_decay"):
        assert wanted in names
    counts = {p.name: len(p.steps) for p in memtester_suite(1)}
    assert counts["solid_bits"] == 64 and counts["block_sequential"] == 256 and counts["bit_flip"] == 512
    assert counts["walking_ones"] == 128 and counts["stuck_address"] == 16


def test_region_is_real_locked_memory_with_physical_addresses():
    with Region(1 << 20) as region:
        assert region.words.size == (1 << 20) // 8
        assert region.words.ctypes.data == region.address
        if os.geteuid() == 0:
            assert region.locked
            assert region.address_kind == "physical"
            frames = {region.page_address(p) for p in range(region.nbytes // 4096)}
            assert len(frames) == region.nbytes // 4096  # distinct frames, page aligned
            assert all(a % 4096 == 0 and a > 0 for a in frames)
        region.shrink(region.nbytes // 2)
        assert region.active_bytes == 1 << 19


def test_every_step_writes_what_expected_says_and_healthy_memory_passes():
    with Region(512 << 10) as region:
        found = Findings()
        engine = Engine(region, found.add, chunk_words=1 << 13)
        for pattern in full_suite(7, idle_decay=False):
            for step in pattern.steps[:3]:
                if pattern.special == "moving_inversions":
                    drain(engine.moving_inversion(step))
                    continue
                drain(engine.write(step))
                view = region.view()
                if step.check == HALVES:
                    h = view.size // 2
                    idx = np.arange(h, dtype=U64)
                    assert np.array_equal(view[:h], step.expected(idx)), step
                    assert np.array_equal(view[h:], view[:h]), step
                else:
                    assert np.array_equal(view, step.expected(np.arange(view.size, dtype=U64))), step
                drain(engine.verify(step))
        assert found.count == 0
        assert engine.verified_bytes > 0


def test_a_flipped_bit_is_reported_at_its_word_with_values():
    with Region(256 << 10) as region:
        found = Findings()
        engine = Engine(region, found.add, chunk_words=1 << 12)
        step = Pair("solid_bits", 0, ALL, 0)
        drain(engine.write(step))
        region.view()[1000] ^= U64(1 << 5)
        drain(engine.verify(step))
        assert found.count == 1
        m = found.details[0]
        assert (m.offset, m.expected, m.actual) == (1000, ALL, ALL ^ (1 << 5))
        assert found.top(10) == [1000 // PAGE_WORDS] and found.pages_with_errors() == 1
        # random data compared in halves: the expected value says which half is wrong
        found2 = Findings()
        engine.sink = found2.add
        rnd = Random("random_value", 9)
        drain(engine.write(rnd))
        h = region.view().size // 2
        region.view()[h + 77] ^= U64(1)
        drain(engine.verify(rnd))
        assert found2.count == 1 and found2.details[0].offset == h + 77 and found2.details[0].index == 77


async def _run(kind, *, bit_fade=False, size=256 << 10, seed=1, passes=1, budget=7200, mode="full_online"):
    plan = {"mode": mode, "passes": passes, "bitFade": bit_fade, "timeBudgetSeconds": budget,
            "kernelPasses": 2}
    run = Run("run-1", plan, size=size, clock=TestClock(), hw=Hardware(simulated=True),
              checkpoint=lambda c: None, progress=_ignore, fault=kind, fault_seed=seed, physical=False,
              chunk_words=1 << 13)
    return run, await run.execute()


async def _ignore(status):
    return None


def _bad_pages(result):
    return {p["offset"] // 4096 for p in result["pages"]}


async def test_good_memory_passes(autojump_clock):
    with trio.fail_after(60):
        _, result = await _run(None)
    assert result["outcome"] == "pass" and result["verdict"] == "ok" and result["errorCount"] == 0
    assert result["fault"] is False and result["retired"] == [] and result["pages"] == []
    assert result["coverageBytes"] == result["totalBytes"] == 256 << 10
    assert result["addressKind"] == "virtual"


async def test_stuck_bits_are_confirmed_retired_weak_cells(autojump_clock):
    with trio.fail_after(60):
        _, result = await _run("stuck")
    model = FaultModel("stuck", (256 << 10) // 8, seed=1)
    assert result["outcome"] == "fail" and result["verdict"] == "weak_cells"
    assert _bad_pages(result) == model.bad_pages()
    assert all(p["confirmed"] and p["rounds"] == 3 and p["reproduced"] == 3 for p in result["pages"])
    assert sorted(result["retired"]) == sorted(p * 4096 for p in model.bad_pages())
    assert result["fault"] is False  # two pages: no MemoryFault
    assert len(result["errors"]) <= 256 and result["errorCount"] >= len(result["errors"])


async def test_weak_cells_need_idle_decay_and_are_confirmed_with_it(autojump_clock):
    with trio.fail_after(3600):  # virtual seconds: the waits below are 20 minutes of them
        _, without = await _run("weak")
        assert without["outcome"] == "pass"  # no pattern but idle decay leaves the cells alone long enough
        start = trio.current_time()
        _, result = await _run("weak", bit_fade=True)
        waited = trio.current_time() - start
    assert result["verdict"] == "weak_cells"
    assert {e["pattern"] for e in result["errors"]} == {"idle_decay"}
    assert all(p["confirmed"] and p["retired"] for p in result["pages"])
    assert _bad_pages(result) == FaultModel("weak", (256 << 10) // 8, seed=1).bad_pages()
    # one 5-minute idle decay, then one 5-minute wait per confirmation round (3 rounds)
    assert waited == pytest.approx(4 * 300)


async def test_data_line_is_a_memory_fault_and_retires_nothing(autojump_clock):
    with trio.fail_after(60):
        _, result = await _run("data_line")
    assert result["verdict"] == "data_line" and result["fault"] is True
    assert "verdict data_line" in result["faultReason"]
    assert result["retired"] == []
    assert {int(e["mask"], 16) for e in result["errors"]} == {1 << DATA_LINE_BIT}
    assert len(result["errors"]) == 256 and result["errorCount"] > 100_000
    assert len(result["pages"]) == 64


async def test_address_line_is_found_from_partner_data(autojump_clock):
    with trio.fail_after(60):
        _, result = await _run("address_line")
    assert result["verdict"] == "address_line" and result["fault"] is True
    # a page written alone reads back: not reproducible in place, nothing retired
    assert result["retired"] == [] and not any(p["confirmed"] for p in result["pages"])
    bad = _bad_pages(result)
    bit_pages = (1 << ADDRESS_LINE_BIT) // PAGE_WORDS
    assert bad and all((page // bit_pages) % 2 == 0 for page in bad)  # the low partner reads wrong


async def test_thermal_errors_are_hot_one_offs(autojump_clock):
    with trio.fail_after(60):
        _, result = await _run("thermal")
    assert result["verdict"] == "thermal" and result["outcome"] == "fail"
    assert result["retired"] == [] and result["errorCount"] >= 3
    assert all(e["tempMilliC"] >= 70_000 for e in result["errors"])
    assert not any(p["confirmed"] for p in result["pages"])


async def test_intermittent_pages_get_eight_rounds(autojump_clock):
    with trio.fail_after(60):
        _, result = await _run("intermittent")
    assert result["verdict"] == "unknown"
    pages = result["pages"]
    assert _bad_pages(result) == FaultModel("intermittent", (256 << 10) // 8, seed=1).bad_pages()
    for p in pages:
        assert p["rounds"] == 8 and p["intermittent"]
        assert p["confirmed"] == (p["reproduced"] >= 2) == p["retired"]


async def test_confirmation_rules(autojump_clock):
    """3 rounds; all reproduce: confirmed; none: one-off; some: 8 rounds, confirmed at >= 2."""
    with Region(64 << 10) as region:
        found = Findings()
        engine = Engine(region, found.add, chunk_words=1 << 12)
        step = Pair("solid_bits", 0, ALL, 0)
        drain(engine.write(step))
        view = region.view()
        for word in (0, 3 * PAGE_WORDS, 6 * PAGE_WORDS):
            view[word] ^= U64(1)
        drain(engine.verify(step))

        class Scripted:
            """Corrupts page 0 every time, page 3 never, page 6 on calls 1 and 9 only."""
            idle_seconds = temp_c = 0.0

            def __init__(self):
                self.calls = {0: 0, 3: 0, 6: 0}

            def corrupt(self, view, spans, step):
                for s, e in spans:
                    page = s // PAGE_WORDS
                    if page in self.calls and e - s == PAGE_WORDS:
                        self.calls[page] += 1
                        n = self.calls[page]
                        if page == 0 or (page == 6 and n in (1, 9)):
                            view[s + 1] ^= U64(2)

        engine.fault = Scripted()
        pages = await confirm_mod.confirm(found, engine, pause=trio.lowlevel.checkpoint, idle_wait=trio.sleep)
        by_page = {p.page: p for p in pages}
        assert (by_page[0].rounds, by_page[0].reproduced, by_page[0].confirmed) == (3, 3, True)
        assert (by_page[3].rounds, by_page[3].reproduced, by_page[3].confirmed) == (3, 0, False)
        assert by_page[6].rounds == 8 and by_page[6].intermittent and by_page[6].reproduced == 2
        assert by_page[6].confirmed is True


SPEC_RESULT = {"runId", "plan", "source", "startedAt", "finishedAt", "outcome", "verdict", "summary",
               "passesCompleted", "patternsRun", "testedBytes", "coverageBytes", "totalBytes", "maxTempMilliC",
               "kernel", "errors", "errorCount", "retired", "fault", "interrupted", "pages"}
# our extensions, each documented in docs/memtests.md
EXTENSIONS = {"mode", "message", "seed", "durationSeconds", "pageSize", "addressKind", "locked", "backoffs",
              "confirmedErrors", "faultReason", "simulatedFault", "pageSummary"}
SPEC_ERROR = {"physAddr", "expected", "actual", "mask", "pattern", "pass", "tempMilliC", "confirmed"}


@pytest.mark.parametrize("kind", ["stuck", "thermal"])
async def test_a_result_has_the_spec_members_and_each_error_exactly_the_spec_fields(autojump_clock, kind):
    """Issue 15 §1: result members as the spec lists them; errors entries as the spec names them
    (two documented extensions: offset, iteration); verdict one of the spec's."""
    with trio.fail_after(60):
        _, result = await _run(kind)
    assert SPEC_RESULT - {"source", "interrupted"} <= set(result) <= SPEC_RESULT | EXTENSIONS
    # "source" is the hub's (live or stored) and "interrupted" only for an interrupted run (issue 31
    # items 11 and 12): a device sends neither
    assert "source" not in result and "interrupted" not in result and result["verdict"] in protocol.MEMTEST_VERDICTS
    assert result["patternsRun"][:2] == ["stuck_address", "random_value"]
    assert "moving_inversions" in result["patternsRun"] and "idle_decay" not in result["patternsRun"]
    assert result["maxTempMilliC"] >= max(e["tempMilliC"] for e in result["errors"])
    assert result["summary"].startswith(f"fail: {result['verdict']}, {result['errorCount']:,} errors")
    for e in result["errors"]:
        assert set(e) == SPEC_ERROR | {"offset", "iteration"}
        assert int(e["mask"], 16) == int(e["expected"], 16) ^ int(e["actual"], 16)
    confirmed = {p["page"] for p in result["pages"] if p["confirmed"]}
    assert {e["confirmed"] for e in result["errors"]} == ({True} if kind == "stuck" else {False})
    assert all(e["confirmed"] == (e["physAddr"] // 4096 * 4096 in confirmed) for e in result["errors"])
