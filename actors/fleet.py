"""FleetActor: the owner of a fleet's live state. Today a shell that rollouts will fill.

It rebuilds the fleet from storage and answers with it; a PATCH tells it to reload. Rollouts add
their machine here (one rollout of a fleet at a time, batches, the update window).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.runtime import Actor
from hub.errors import NotFound

if TYPE_CHECKING:
    from hub.services import Services


@dataclass(frozen=True)
class Snapshot:
    """Ask: the fleet as this actor holds it."""


@dataclass(frozen=True)
class Reload:
    """Tell: the fleet row changed in storage (PATCH); read it again."""


class FleetActor(Actor):
    def __init__(self, org_id: uuid.UUID, fleet_id: uuid.UUID, services: "Services") -> None:
        super().__init__(("fleet", fleet_id))
        self.org_id, self.fleet_id, self.services = org_id, fleet_id, services
        self.fleet: dict[str, Any] | None = None

    async def on_start(self) -> None:
        self.fleet = await self.services.fleets.get(self.org_id, self.fleet_id)
        if self.fleet is None:
            raise NotFound("fleet not found")

    async def receive(self, msg: Any) -> Any:
        if isinstance(msg, Reload):
            await self.on_start()
            return None
        if isinstance(msg, Snapshot):
            return dict(self.fleet)
        return await super().receive(msg)
