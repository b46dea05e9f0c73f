"""What keeps every memory-test frame bounded, whatever the memory size, error count or history.

A result lists at most ``RESULT_ERRORS`` errors (spec: Limits; ``errorCount`` is the full count),
``RESULT_PAGES`` pages (the most errors first; ``pageSummary`` gives the totals of the pages left
out) and ``KERNEL_RANGES`` bad ranges of the kernel sweep (``kernel.badPages`` counts them all), and
a message of at most ``MESSAGE_MAX`` characters: ``bound`` enforces that on any result, also one
stored by an older agent. Frames that carry several results (the memtest.status reply's history,
health's lastResult) carry them ``brief``: without errors, pages and bad ranges (the hub has the full
results: every result is sent as memtest.result until acknowledged). Retired-page lists in a hello
or health report are at most ``RETIRED_LISTED`` (a count says how many there are).

``trim`` is what the link's frame guard (device_client/linkframes.py) asks for when a hub refused a
result anyway: first 16 of each list, then none, then nothing (dropped).
"""

from __future__ import annotations

from typing import Any

RESULT_ERRORS = 256
RESULT_PAGES = 256
KERNEL_RANGES = 256
MESSAGE_MAX = 500
RETIRED_LISTED = 1024
KERNEL_LINES = 20
KERNEL_LINE_MAX = 200
TRIM_STAGES = (16, 0)


def page_summary(pages: list[dict[str, Any]], listed: list[dict[str, Any]], error_count: int,
                 pages_with_errors: int | None = None) -> dict[str, Any]:
    """How much of the page map a result lists, and the totals of what it leaves out."""
    total = len(pages) if pages_with_errors is None else pages_with_errors
    shown = sum(int(p.get("errors") or 0) for p in listed)
    return {"pagesWithErrors": total, "listedPages": len(listed), "omittedPages": total - len(listed),
            "omittedErrors": max(0, error_count - shown), "order": "most errors first"}


def _cap_pages(result: dict[str, Any], cap: int) -> dict[str, Any]:
    pages = [p for p in result.get("pages") or [] if isinstance(p, dict)]
    summary = result.get("pageSummary")
    if len(pages) <= cap and isinstance(summary, dict):
        return result
    listed = sorted(pages, key=lambda p: (-int(p.get("errors") or 0), int(p.get("page") or 0)))[:cap]
    known = summary.get("pagesWithErrors") if isinstance(summary, dict) else None
    return {**result, "pages": listed,
            "pageSummary": page_summary(pages, listed, int(result.get("errorCount") or 0),
                                        known if isinstance(known, int) else None)}


def _cap_kernel(result: dict[str, Any], cap: int) -> dict[str, Any]:
    kernel = result.get("kernel")
    if not isinstance(kernel, dict) or len(kernel.get("badRanges") or []) <= cap:
        return result
    ranges = kernel["badRanges"]
    return {**result, "kernel": {**kernel, "badRanges": ranges[:cap],
                                 "badPages": kernel.get("badPages", len(ranges))}}


def bound(result: dict[str, Any]) -> dict[str, Any]:
    """The result within the caps above (a no-op for one this agent made)."""
    out = _cap_kernel(_cap_pages(result, RESULT_PAGES), KERNEL_RANGES)
    if len(out.get("errors") or []) > RESULT_ERRORS:
        out = {**out, "errors": out["errors"][:RESULT_ERRORS]}
    if isinstance(out.get("message"), str) and len(out["message"]) > MESSAGE_MAX:
        out = {**out, "message": out["message"][:MESSAGE_MAX]}
    if isinstance(out.get("retired"), list) and len(out["retired"]) > RETIRED_LISTED:
        out = {**out, "retired": out["retired"][:RETIRED_LISTED]}
    return out


def brief(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The result without its lists (errors, pages, bad ranges); ``brief`` true says so."""
    if not isinstance(result, dict):
        return result
    out = {**bound(result), "errors": [], "pages": [], "brief": True}
    if isinstance(out.get("kernel"), dict):
        out["kernel"] = {**out["kernel"], "badRanges": []}
    return out


def trim(result: dict[str, Any], reason: str) -> dict[str, Any] | None:
    """A smaller result after a refusal (``trimmed`` says what went and why); None: drop it."""
    done = (result.get("trimmed") or {}).get("stage", -1)
    if done + 1 >= len(TRIM_STAGES):
        return None
    stage = done + 1
    keep = TRIM_STAGES[stage]
    out = _cap_kernel(_cap_pages(bound(result), keep), keep)
    errors = out.get("errors") or []
    out = {**out, "errors": errors[:keep],
           "trimmed": {"stage": stage, "reason": reason[:200],
                       "errorsListed": min(len(errors), keep), "pagesListed": len(out.get("pages") or [])}}
    return out


def retired_listed(retired: list[int]) -> list[int]:
    """At most RETIRED_LISTED of the retired pages (the lowest addresses; the count is sent beside)."""
    return retired[:RETIRED_LISTED]
