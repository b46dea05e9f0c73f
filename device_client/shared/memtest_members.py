"""The members of the memory-test messages a device sends and the plan it receives, as models: the
spec's names (Resources → Memory test: Status, Health, Result, errors, the enumerations) with their
types, and our documented extensions (docs/memtests.md).

verbs.py uses them for the memtest verbs and events, so they are in the link's JSON Schema
(``GET /v1/device/protocol.json``) and in docs/device-protocol.md's tables; the hub validates what a
device sends against them (actors/device_memtests.py: a malformed one is a protocol error, dropped
and told to the device, as for other strict payloads), and the qualification kit checks them too.

What is required is what the hub cannot do without; every other member the spec names is typed
here, so a device that sends it sends it with this type. Extra members are allowed (a newer device
may say more), and ``null`` is allowed where a value can be unknown.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .protocol import (
    RESULT_LIST_KEPT,
    MEMTEST_OUTCOMES,
    MEMTEST_PHASES,
    MEMTEST_VERDICTS,
    MemoryTestCapabilities,
)

Phase = Literal[MEMTEST_PHASES]  # type: ignore[valid-type]
Outcome = Literal[MEMTEST_OUTCOMES]  # type: ignore[valid-type]
Verdict = Literal[MEMTEST_VERDICTS]  # type: ignore[valid-type]


def _count() -> Any:
    return Field(None, ge=0)


class _Members(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class MemtestPlan(_Members):
    """The plan the hub sends with memtest.start, every member with its mode default applied; a
    Status or Result repeats it."""
    mode: Literal["live", "live_quick", "full_online", "test_boot"] | None = None
    impact: Literal["running", "stopped"] | None = None
    placement: Literal["online", "offline"] | None = None
    quick: bool | None = None
    passes: int | None = Field(None, ge=1, le=20)
    kernelPasses: int | None = Field(None, ge=1, le=17, description="test boot only")
    bitFade: bool | None = Field(None, description="the idle-decay check")
    holdOnFailure: bool | None = Field(None, description="test boot only")
    timeBudgetSeconds: int | None = Field(None, ge=60, le=43200)
    maxBytes: int | None = Field(None, ge=1, description="optional cap on memory tested")


class MemtestStatus(_Members):
    """The current or last run (the spec's Status members; ``step`` is our extension). Also the
    payload of event memtest.progress."""
    runId: str | None = Field(description="the hub's runId of the run; null in an idle status (no test ever ran)")
    plan: MemtestPlan | None = None
    phase: Phase = Field(description="one of the spec's phases")
    step: str | None = Field(None, description="a sub-step the spec does not name (patterns, idle_decay, kernel, "
                                               "holding, ...)")
    pass_: int | None = Field(None, alias="pass", ge=0, description="the pass under way (1-based; 0 before the first)")
    passes: int | None = Field(None, ge=0)
    pattern: str | None = None
    testedBytes: int | None = _count()
    coverageBytes: int | None = _count()
    totalBytes: int | None = _count()
    rateBps: float | None = Field(None, ge=0, description="bytes per second")
    etaSeconds: float | None = Field(None, ge=0)
    errors: int | None = _count()
    confirmedErrors: int | None = _count()
    tempMilliC: int | None = Field(None, description="temperature in millidegrees C; null or -1 when unavailable")
    startedAt: str | None = Field(None, description="RFC 3339")


class MemtestError(_Members):
    """One entry of a Result's ``errors``."""
    physAddr: int | None = Field(None, ge=0, description="the failing word's address (physical when the result's "
                                                         "addressKind is physical)")
    expected: str | None = Field(None, description="hex, e.g. 0x00000000ffffffff")
    actual: str | None = Field(None, description="hex")
    mask: str | None = Field(None, description="hex: expected XOR actual")
    pattern: str | None = None
    pass_: int | None = Field(None, alias="pass", ge=0)
    tempMilliC: int | None = None
    confirmed: bool | None = None


class MemtestPage(_Members):
    """One entry of a Result's ``pages`` (the per-page error summary)."""
    page: int = Field(ge=0, description="the page's address")
    physAddr: int | None = Field(None, ge=0)
    errors: int = Field(ge=0)
    confirmed: bool | None = None
    retired: bool | None = None


class MemtestKernel(_Members):
    """A test boot's kernel sweep: passes run and bad ranges found at boot."""
    passes: int | None = Field(None, ge=0)
    errors: int | None = _count()
    badRanges: list[dict[str, int]] = Field(default_factory=list, description="[{start, end}] byte addresses")
    badPages: int | None = _count()


class MemtestInterrupted(_Members):
    """Where an interrupted run was when the device reset: the phase, pass and pattern last reached."""
    phase: Phase | None = None
    step: str | None = None
    pass_: int | None = Field(None, alias="pass", ge=0)
    pattern: str | None = None


class MemtestResult(_Members):
    """A finished run (the spec's Result members and our extensions). In a memtest.status reply's
    history, and as health.lastResult, a Result is brief (``brief`` true: no errors, pages or bad
    ranges)."""
    runId: str
    plan: MemtestPlan | None = None
    source: str | None = Field(None, description="live (the device answered) or stored: set by the hub as it "
                                                 "serves the result; a device sends none (what its addresses are "
                                                 "is addressKind, a simulation is hardware.simulated)")
    startedAt: str | None = Field(None, description="RFC 3339")
    finishedAt: str | None = Field(None, description="RFC 3339")
    outcome: Outcome
    verdict: Verdict
    summary: str | None = None
    passesCompleted: int | None = _count()
    patternsRun: list[str] | None = None
    testedBytes: int | None = _count()
    coverageBytes: int | None = _count()
    totalBytes: int | None = _count()
    maxTempMilliC: int | None = None
    kernel: MemtestKernel | None = Field(None, description="test boot only")
    # the spec's cap (Limits: errors kept per result), as the device bounds it (memtest/bounds.py); the
    # hub keeps the first RESULT_LIST_KEPT of a longer list (protocol.memtest_result), errorCount the count
    errors: list[MemtestError] | None = Field(None, max_length=RESULT_LIST_KEPT,
                                              description="at most 256; errorCount is the full count")
    errorCount: int | None = _count()
    confirmedErrors: int | None = _count()
    retired: list[int] | None = Field(None, description="addresses of the pages retired")
    fault: bool | None = None
    faultReason: str | None = None
    interrupted: MemtestInterrupted | None = Field(None, description="only for an interrupted run")
    pages: list[MemtestPage] | None = Field(None, max_length=RESULT_LIST_KEPT,
                                            description="the pages with the most errors, at most 256")
    hardware: dict[str, Any] | None = Field(None, description="the hardware the run was made on")
    versions: dict[str, Any] | None = Field(None, description="the software versions the run was made with")
    message: str | None = Field(None, description="why it ended so (error, cancelled, interrupted), at most 500 "
                                                  "characters")
    brief: bool | None = Field(None, description="true: errors, pages and kernel.badRanges left out")


class MemtestEdac(_Members):
    """The EDAC counters, summed over the memory controllers."""
    correctable: int = Field(ge=-1, description="corrected errors; -1 when unavailable")
    uncorrectable: int = Field(ge=-1, description="uncorrected errors; -1 when unavailable")


class MemtestHealth(_Members):
    """The tester's Health (the spec's members; ``retired`` and ``simulated`` are extensions)."""
    capabilities: MemoryTestCapabilities | None = None
    hardwareCorruptedBytes: int | None = Field(
        None, ge=-1, description="HardwareCorrupted of /proc/meminfo in bytes; -1 when the kernel does not report it")
    edac: MemtestEdac | None = None
    retiredPages: int | list[int] | None = Field(None, description="how many pages are retired (a list of their "
                                                                   "addresses is read as well)")
    retired: list[int] | None = Field(None, description="addresses of retired pages, at most 1,024")
    fault: bool | None = None
    faultReason: str | None = None
    kernelErrors: list[str] | None = Field(None, description="recent kernel memory-error lines, at most 20 of 200 "
                                                             "characters")
    lastResult: MemtestResult | None = Field(None, description="brief")
    simulated: bool | None = None
