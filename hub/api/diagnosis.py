"""GET /v1/devices/{id}/diagnosis (DESIGN.md section 12): the device's issues, worst first.

A MemoryFault condition is a critical issue; a newest memory test that was interrupted, and frames
the link refused as too big (counted by this hub process, hub/frames.py), are warnings; a newest
result whose page map was summarised is an info saying how much of it the result lists. The device
keeps running either way: this tells an operator what to look at.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from quart import Blueprint

from actors.machines.memory_fault import diagnosis
from hub.api.common import errors, jsonable, org, services
from hub.api.devices import _load
from hub.api.validation import responds

bp = Blueprint("diagnosis", __name__, url_prefix="/v1/devices")


class Issue(BaseModel):
    severity: Literal["critical", "warning", "info"]
    code: str = Field(description="MemoryFault (critical), MemoryTestInterrupted, LinkFramesRefused, "
                                  "IdentityInUseTwice, DeviceProtocolError or ConfigurationNotApplied "
                                  "(warning), MemoryTestPageMapSummarised (info)")
    title: str
    message: str
    since: str | None
    details: dict


class Diagnosis(BaseModel):
    deviceId: str
    status: Literal["ok", "warning", "critical"] = Field(description="the worst severity among the issues")
    issues: list[Issue]
    checkedAt: str


class DiagnosisEnvelope(BaseModel):
    data: Diagnosis


@bp.get("/<device_id>/diagnosis")
@responds(DiagnosisEnvelope)
@errors(400, 401, 403, 404)
async def device_diagnosis(device_id: str):
    s = services()
    row = await _load(device_id, "viewer")
    newest = await s.stores.memtests.results(org().org_id, row["id"], 1)
    refused = s.metrics.refused_frames.get(row["id"])
    issues = diagnosis(row.get("conditions") or [], newest[0] if newest else None,
                       None if refused is None else {"count": refused.count, "lastAt": refused.last_at,
                                                     "lastFrame": refused.last_frame,
                                                     "lastBytes": refused.last_bytes})
    issues += _link_issues(s, row)
    severities = {i["severity"] for i in issues}
    status = "critical" if "critical" in severities else "warning" if "warning" in severities else "ok"
    return {"data": jsonable({"deviceId": str(row["id"]), "status": status, "issues": issues,
                              "checkedAt": s.clock.now()})}


def _link_issues(s, row: dict) -> list[dict]:
    """The device link's own issues (docs/device-protocol.md): two holders of its token, results it sent
    that the hub could not use (this process's counts, hub/linkhealth.py), and a configuration the
    device did not apply (stored: the reason survives restarts)."""
    issues = s.link_health.issues(row["id"], s.clock.now())
    if row.get("config_status") in ("failed", "rejected"):
        failed = row["config_status"] == "failed"
        issues.append({"severity": "warning", "code": "ConfigurationNotApplied",
                       "title": "The assigned configuration is not applied",
                       "message": (f"configuration version {row.get('config_version_id')} "
                                   f"{'failed' if failed else 'was rejected by the device'}: "
                                   f"{row.get('config_error') or 'no reason given'}"
                                   + ("; it is sent again at the device's next link" if failed else "")),
                       "since": row.get("updated_at"),
                       "details": {"status": row["config_status"], "versionId": row.get("config_version_id"),
                                   "error": row.get("config_error")}})
    return issues
