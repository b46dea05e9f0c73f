"""What memory-test results mean for a device: the MemoryFault condition and the diagnosis issues.

Pure: no trio, storage or quart. The DeviceActor's memory-test half applies ``memory_fault`` to what
storage merged (storage/memtests.py); GET /v1/devices/{id}/diagnosis lists ``diagnosis``.
"""

from __future__ import annotations

from typing import Any

from actors.machines.memtest_plan import PAGE_SIZE

FAULT_PAGES = 32            # more than this many retired pages is a MemoryFault
FAULT_BYTES = 1024 * 1024   # more than this much distinct bad memory is a MemoryFault
FAULT_VERDICTS = frozenset({"data_line", "address_line"})


def bad_pages(result: dict[str, Any]) -> set[int]:
    """Distinct page addresses a result found bad: its retired pages, pages with confirmed errors,
    and the kernel sweep's bad ranges (page by page, capped: past the cap the fault is certain)."""
    page = int(result.get("pageSize") or PAGE_SIZE)
    out = {int(a) // page * page for a in result.get("retired") or [] if isinstance(a, int)}
    for entry in result.get("pages") or []:
        if not isinstance(entry, dict):
            continue
        addr = entry.get("physAddr")
        if addr is None:
            addr = entry.get("page")  # the mapping's address where physical ones were not readable
        confirmed = entry.get("confirmed", entry.get("confirmedErrors", 0))
        if isinstance(addr, int) and confirmed:
            out.add(addr // page * page)
    for r in (result.get("kernel") or {}).get("badRanges") or []:
        if not isinstance(r, dict) or not isinstance(r.get("start"), int):
            continue
        end = r.get("end")
        if not isinstance(end, int):
            end = r["start"] + int(r.get("length") or page)
        for addr in range(r["start"] // page * page, end, page):
            out.add(addr)
            if len(out) > 4 * FAULT_BYTES // page:
                return out
    return out


def memory_fault(*, retired: int, bad_bytes: int, verdict: str | None,
                 since: str | None = None) -> dict[str, Any] | None:
    """The MemoryFault condition (spec: States → MemoryFault condition), or None when none holds."""
    reasons = []
    if retired > FAULT_PAGES:
        reasons.append(f"{retired} pages retired (more than {FAULT_PAGES})")
    if bad_bytes > FAULT_BYTES:
        reasons.append(f"{bad_bytes} bytes of distinct memory bad (more than 1 MiB)")
    if verdict in FAULT_VERDICTS:
        reasons.append(f"verdict {verdict}")
    if not reasons:
        return None
    return {"type": "MemoryFault", "badge": "Memory fault", "severity": "critical", "status": True,
            "reason": "; ".join(reasons), "retiredPages": retired, "badBytes": bad_bytes, "verdict": verdict,
            "since": since}


def diagnosis(conditions: list[dict[str, Any]], newest_result: dict[str, Any] | None,
              refused: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The device's issues: a MemoryFault is critical; a newest memory test that was interrupted
    is a warning (it says where it stopped; it is never retried as a test boot by itself); frames the
    link refused as too big are a warning (``refused``: count, lastAt, lastFrame, lastBytes); a newest
    result whose page map was summarised is an info saying how much of it the result lists."""
    issues = []
    for c in conditions:
        if c.get("type") == "MemoryFault":
            issues.append({"severity": "critical", "code": "MemoryFault", "title": "Memory fault",
                           "message": f"memory fault: {c.get('reason')}", "since": c.get("since"),
                           "details": {k: c.get(k) for k in ("retiredPages", "badBytes", "verdict")}})
    if newest_result is not None and newest_result.get("outcome") == "interrupted":
        where = newest_result.get("interrupted") or {}
        issues.append({"severity": "warning", "code": "MemoryTestInterrupted", "title": "Memory test interrupted",
                       "message": (f"memory test {newest_result.get('runId')} was interrupted in phase "
                                   f"{where.get('phase')}, pass {where.get('pass')}, pattern {where.get('pattern')}"),
                       "since": newest_result.get("finishedAt") or newest_result.get("startedAt"),
                       "details": {"runId": newest_result.get("runId"), **where}})
    if refused and refused.get("count"):
        issues.append({"severity": "warning", "code": "LinkFramesRefused", "title": "Frames refused as too big",
                       "message": (f"the hub refused {refused['count']} frame(s) from this device as over the "
                                   f"link's limit, the last a {refused.get('lastFrame')} frame of "
                                   f"{refused.get('lastBytes')} bytes; the device trims or drops such a frame "
                                   "and reconnects"),
                       "since": refused.get("lastAt"), "details": dict(refused)})
    summary = (newest_result or {}).get("pageSummary")
    if newest_result is not None and isinstance(summary, dict) and (summary.get("omittedPages")
                                                                    or newest_result.get("trimmed")):
        trimmed = newest_result.get("trimmed")
        issues.append({"severity": "info", "code": "MemoryTestPageMapSummarised",
                       "title": "Memory test page map summarised",
                       "message": (f"memory test {newest_result.get('runId')} found errors on "
                                   f"{summary.get('pagesWithErrors')} pages; its result lists the "
                                   f"{summary.get('listedPages')} with the most errors and sums up the other "
                                   f"{summary.get('omittedPages')} pages ({summary.get('omittedErrors')} errors)"
                                   + (f"; the device trimmed it after a refusal: {trimmed.get('reason')}"
                                      if isinstance(trimmed, dict) else "")),
                       "since": newest_result.get("finishedAt"),
                       "details": {"runId": newest_result.get("runId"), **summary,
                                   **({"trimmed": trimmed} if isinstance(trimmed, dict) else {})}})
    return issues
