"""Fleet update windows: the ``fleets.update_window`` column (NULL = no window), one crossing per call.

Stored as the API's JSON (``UpdateWindow.to_json()``); callers parse it with ``UpdateWindow.parse``.
Every call is scoped by organisation: another organisation's fleet reads as missing.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any

from storage.db import Database


@dataclass(frozen=True)
class FleetWindow:
    fleet_id: uuid.UUID
    window: dict[str, Any] | None  #: the stored JSON; None when the fleet has no window


def _decode(value: str | None) -> dict[str, Any] | None:
    return json.loads(value) if value is not None else None


class UpdateWindows:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, org_id: uuid.UUID, fleet_id: uuid.UUID) -> FleetWindow | None:
        """None when the organisation has no such fleet."""
        row = await self.db.fetchrow("SELECT id, update_window FROM fleets WHERE org_id = $1 AND id = $2",
                                     org_id, fleet_id)
        return FleetWindow(row["id"], _decode(row["update_window"])) if row else None

    async def get_many(self, org_id: uuid.UUID, fleet_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, Any] | None]:
        """The windows of several fleets (a rollout over fleets); missing fleets are left out."""
        rows = await self.db.fetch("SELECT id, update_window FROM fleets WHERE org_id = $1 AND id = ANY($2::uuid[])",
                                   org_id, list(fleet_ids))
        return {r["id"]: _decode(r["update_window"]) for r in rows}

    async def set(self, org_id: uuid.UUID, fleet_id: uuid.UUID, window: dict[str, Any] | None,
                  now: dt.datetime) -> bool:
        """Store (or with None remove) the fleet's window; False when the organisation has no such fleet."""
        status = await self.db.execute(
            "UPDATE fleets SET update_window = $3::jsonb, updated_at = $4 WHERE org_id = $1 AND id = $2",
            org_id, fleet_id, json.dumps(window) if window is not None else None, now)
        return status.endswith(" 1")
