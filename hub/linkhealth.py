"""What this hub process saw going wrong on device links, per device, for the diagnosis
(hub/api/diagnosis.py): takeovers of a device's link (two holders of one token,
actors/machines/takeover.py) and protocol errors (a malformed result, device_client/shared/verbs.py).
Bounded: past ``DEVICES`` devices the oldest entry goes."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from actors.machines.takeover import Takeovers

DEVICES = 10_000


@dataclass
class ProtocolErrors:
    count: int = 0
    last_at: dt.datetime | None = None
    last: str = ""  # "reply to config.apply: configId: Field required"


class LinkHealth:
    def __init__(self) -> None:
        self.takeovers: OrderedDict[uuid.UUID, Takeovers] = OrderedDict()
        self.protocol_errors: OrderedDict[uuid.UUID, ProtocolErrors] = OrderedDict()
        self.errors_total = 0

    @staticmethod
    def _entry(table: OrderedDict, device_id: uuid.UUID, factory):
        entry = table.get(device_id)
        if entry is None:
            entry = table[device_id] = factory()
            while len(table) > DEVICES:
                table.popitem(last=False)
        table.move_to_end(device_id)
        return entry

    def takeover(self, device_id: uuid.UUID, now: dt.datetime, address: str | None) -> float:
        """A new link of ``device_id`` replaces a live one: the seconds to hold it back."""
        return self._entry(self.takeovers, device_id, Takeovers).record(now, address)

    def protocol_error(self, device_id: uuid.UUID, what: str, now: dt.datetime) -> None:
        entry = self._entry(self.protocol_errors, device_id, ProtocolErrors)
        entry.count += 1
        entry.last_at, entry.last = now, what[:300]
        self.errors_total += 1

    def issues(self, device_id: uuid.UUID, now: dt.datetime) -> list[dict]:
        """Diagnosis issues (the shape of hub/api/diagnosis.Issue)."""
        out: list[dict] = []
        taken = self.takeovers.get(device_id)
        if taken is not None and taken.in_use_twice(now):
            summary = taken.summary(now)
            out.append({"severity": "warning", "code": "IdentityInUseTwice",
                        "title": "Two connections use this device's identity",
                        "message": f"{summary['takeoversLastMinute']} takeovers of the device's link in the last "
                                   "minute: two devices (or two agents) hold this device's token and each new "
                                   "connection closes the other (4001). Give each device its own token.",
                        "since": summary["lastAt"], "details": summary})
        errors = self.protocol_errors.get(device_id)
        if errors is not None:
            out.append({"severity": "warning", "code": "DeviceProtocolError",
                        "title": "The device sent results the hub could not use",
                        "message": f"{errors.count} malformed result(s); the last: {errors.last}. What the "
                                   "command moved was marked failed (docs/device-protocol.md, Strict results).",
                        "since": errors.last_at, "details": {"count": errors.count, "last": errors.last}})
        return out
