"""The kit's verdict: one line per rule (PASS, FAIL or NOT RUN, the rule, the evidence), or JSON."""

from __future__ import annotations

import json
from typing import TextIO

from .rules import RULES
from .scenarios import Verdict


def passed(verdicts: dict[str, Verdict]) -> bool:
    return all(v.passed for v in verdicts.values())


def as_json(verdicts: dict[str, Verdict]) -> dict:
    return {"passed": passed(verdicts),
            "rules": [{"id": r.id, "section": r.section, "rule": r.text, "status": verdicts[r.id].status,
                       "evidence": verdicts[r.id].evidence, "checks": len(verdicts[r.id].checks)} for r in RULES]}


def write(verdicts: dict[str, Verdict], out: TextIO, *, fmt: str = "text") -> None:
    if fmt == "json":
        out.write(json.dumps(as_json(verdicts), indent=2) + "\n")
        return
    for r in RULES:
        v = verdicts[r.id]
        out.write(f"{v.status:<7} {r.id:<3} {r.text}\n        evidence: {v.evidence}\n")
    counts = {s: sum(v.status == s for v in verdicts.values()) for s in ("PASS", "FAIL", "NOT RUN")}
    out.write(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['NOT RUN']} not run: "
              f"{'QUALIFIED' if passed(verdicts) else 'NOT QUALIFIED'}\n")
