"""Modes and sizes: how much memory a plan tests, and when Live must back off.

The hub applies the spec's defaults (actors/machines/memtest_plan.py ``plan_for``); ``check`` re-checks the
plan it sends, so a bad command is refused with ``invalid`` rather than half run.

Sizes (before ``maxBytes`` and the device's memory budget cap them):

- Live: half of MemAvailable less a reserve of ``RESERVE`` (the workload keeps the rest).
- Live Quick: a quarter of MemAvailable, at most 512 MiB (spec: Limits).
- Full online and test boot: "nearly all free RAM": MemAvailable less the larger of the reserve and
  5% of MemTotal (after caches were dropped, where permitted).

Back-off (Live, Live Quick): memory is tight when MemAvailable is below ``TIGHT_AVAILABLE`` (10%) of
MemTotal, or when /proc/pressure/memory ``some avg10`` is ``TIGHT_PSI`` (10%) or more. Between steps
the run then halves the memory it tests (giving the rest back to the kernel) and waits
``BACKOFF_WAIT_S`` seconds; it never shrinks below ``MIN_BYTES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("live", "live_quick", "full_online", "test_boot")
QUICK_CAP = 512 << 20
RESERVE = 64 << 20
MIN_BYTES = 64 << 10
TIGHT_AVAILABLE = 0.10
TIGHT_PSI = 10.0
BACKOFF_WAIT_S = 1.0


class PlanError(ValueError):
    pass


@dataclass(frozen=True)
class MemInfo:
    total: int
    available: int
    psi_some_avg10: float | None = None

    @property
    def tight(self) -> bool:
        return self.available < TIGHT_AVAILABLE * self.total or (
            self.psi_some_avg10 is not None and self.psi_some_avg10 >= TIGHT_PSI)


def read_meminfo() -> MemInfo:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) * 1024
    psi = None
    try:
        for line in Path("/proc/pressure/memory").read_text().splitlines():
            if line.startswith("some"):
                psi = float(dict(kv.split("=") for kv in line.split()[1:])["avg10"])
    except (OSError, ValueError, KeyError):
        pass
    return MemInfo(fields["MemTotal"], fields.get("MemAvailable", fields.get("MemFree", 0)), psi)


def _int(plan: dict[str, Any], name: str, low: int, high: int) -> int:
    value = plan.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise PlanError(f"{name} must be an integer from {low} to {high}")
    return value


def check(plan: Any) -> dict[str, Any]:
    """The plan with its ranges checked; a field the hub left out takes the mode's default."""
    if not isinstance(plan, dict) or plan.get("mode") not in MODES:
        raise PlanError(f"plan.mode must be one of {', '.join(MODES)}")
    stopped = plan["mode"] in ("full_online", "test_boot")
    defaults = {"passes": 2 if stopped else 1, "kernelPasses": 4, "bitFade": stopped,
                "holdOnFailure": False, "timeBudgetSeconds": 7200, "quick": plan["mode"] == "live_quick",
                "impact": "stopped" if stopped else "running",
                "placement": "offline" if plan["mode"] == "test_boot" else "online"}
    plan = {**defaults, **{k: v for k, v in plan.items() if v is not None}}
    for name in ("bitFade", "holdOnFailure", "quick"):
        if not isinstance(plan[name], bool):
            raise PlanError(f"{name} must be a boolean")
    _int(plan, "passes", 1, 20)
    if plan["mode"] == "live_quick" and (plan["passes"] != 1 or plan["bitFade"]):
        raise PlanError("the Quick preset runs one pass without idle decay")
    _int(plan, "timeBudgetSeconds", 60, 43200)
    if plan["mode"] == "test_boot":
        _int(plan, "kernelPasses", 1, 17)
    if plan.get("maxBytes") is not None:
        _int(plan, "maxBytes", 4096, 2**50)
    return plan


def size_for(plan: dict[str, Any], info: MemInfo, budget: int | None) -> int:
    mode = plan["mode"]
    if mode == "live":
        size = info.available // 2 - RESERVE
    elif mode == "live_quick":
        size = min(info.available // 4, QUICK_CAP)
    else:
        size = info.available - max(RESERVE, info.total // 20)
    for cap in (plan.get("maxBytes"), budget):
        if cap is not None:
            size = min(size, int(cap))
    return max(MIN_BYTES, size)
