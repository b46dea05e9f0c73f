"""Who is calling: the principal every authenticated request carries, and its role in the org."""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    kind: str                    # "user" (PAT or session) or "service" (OAuth client)
    id: str                      # the credential's id: PAT id, service account id
    user_id: uuid.UUID | None    # the person behind a PAT or session
    is_staff: bool = False
    via: str = "pat"             # pat | bearer | session

    @property
    def audit_actor(self) -> dict:
        return {"actor_type": self.kind, "actor_id": self.id, "actor_user_id": self.user_id}


@dataclass(frozen=True)
class OrgContext:
    org_id: uuid.UUID
    role: str                    # admin | member

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"
