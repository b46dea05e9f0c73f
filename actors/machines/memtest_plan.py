"""The spec's memory-test start request: field types and ranges, the mode a combination means, and
every default of that mode applied (``plan_for``) — or ``PlanInvalid`` naming the field.

Pure: no trio, storage or quart. The machine (actors/machines/memtest.py) takes the plan this makes.
"""

from __future__ import annotations

from typing import Any

PAGE_SIZE = 4096  # the devices' page: the smallest maxBytes, and the unit bad memory is counted in

_INTS = {"passes": (1, 20), "kernelPasses": (1, 17), "timeBudgetSeconds": (60, 43200),
         "maxBytes": (PAGE_SIZE, 2**50)}
_BOOLS = ("quick", "bitFade", "holdOnFailure")
_ENUMS = {"impact": ("running", "stopped"), "placement": ("online", "offline")}
FIELDS = frozenset({*_INTS, *_BOOLS, *_ENUMS})


class PlanInvalid(ValueError):
    """The start request breaks a rule of the spec's table; ``field`` names the culprit."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def _typed(request: dict[str, Any]) -> dict[str, Any]:
    """The request's fields with their types and ranges checked; null counts as omitted."""
    out: dict[str, Any] = {}
    for name, value in request.items():
        if name not in FIELDS:
            raise PlanInvalid(name, "unknown field")
        if value is None:
            continue
        if name in _ENUMS:
            if value not in _ENUMS[name]:
                raise PlanInvalid(name, f"must be {' or '.join(_ENUMS[name])}")
        elif name in _BOOLS:
            if not isinstance(value, bool):
                raise PlanInvalid(name, "must be a boolean")
        else:
            low, high = _INTS[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise PlanInvalid(name, "must be an integer")
            if not low <= value <= high:
                raise PlanInvalid(name, f"must be between {low} and {high}")
        out[name] = value
    return out


def plan_for(request: dict[str, Any]) -> dict[str, Any]:
    """The full plan the device receives: mode, and every field with its mode default applied."""
    f = _typed(request)
    impact = f.get("impact", "running")
    placement = f.get("placement", "online")
    quick = f.get("quick", False)
    if placement == "offline" and impact == "running":
        raise PlanInvalid("placement", "offline (a test boot) requires impact stopped")
    stopped = impact == "stopped"
    if quick and stopped:
        raise PlanInvalid("quick", "the Quick preset is for Live (impact running) only")
    mode = ("test_boot" if placement == "offline" else "full_online") if stopped else (
        "live_quick" if quick else "live")
    if mode != "test_boot":
        for name in ("kernelPasses", "holdOnFailure"):
            if f.get(name):
                raise PlanInvalid(name, "applies to a test boot (placement offline) only")
    if mode == "live_quick":
        if f.get("passes", 1) != 1:
            raise PlanInvalid("passes", "the Quick preset runs one pass")
        if f.get("bitFade"):
            raise PlanInvalid("bitFade", "the Quick preset has no idle-decay check")
    plan = {"mode": mode, "impact": impact, "placement": placement, "quick": quick,
            "passes": f.get("passes", 2 if stopped else 1),
            "kernelPasses": f.get("kernelPasses", 4),
            "bitFade": f.get("bitFade", stopped),
            "holdOnFailure": f.get("holdOnFailure", False),
            "timeBudgetSeconds": f.get("timeBudgetSeconds", 7200)}
    if "maxBytes" in f:
        plan["maxBytes"] = f["maxBytes"]
    return plan
