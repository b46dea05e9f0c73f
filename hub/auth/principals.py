"""Who is calling: the principal every authenticated request carries, and its role in the org."""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    kind: str                          # "user" (PAT or dashboard session) or "service" (OAuth client)
    id: str                            # the credential's public id: PAT id, "session", service account id
    user_id: uuid.UUID | None = None   # the person behind a PAT or session
    service_id: uuid.UUID | None = None
    is_staff: bool = False
    via: str = "pat"                   # pat | bearer (PAT secret as bearer) | session | oauth

    @property
    def credential_kind(self) -> str:
        return {"pat": "pat", "bearer": "pat", "session": "session", "oauth": "service_account"}[self.via]


@dataclass(frozen=True)
class OrgContext:
    org_id: uuid.UUID
    role: str                          # admin | member | service

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"
