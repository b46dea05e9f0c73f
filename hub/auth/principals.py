"""Who is calling: the principal every authenticated request carries, and its role in the org."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field


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
        return _CREDENTIAL_KINDS[self.via]


_CREDENTIAL_KINDS = {"pat": "pat", "bearer": "pat", "session": "session", "oauth": "service_account"}


@dataclass(frozen=True)
class OrgContext:
    org_id: uuid.UUID
    role: str                          # admin | member | service

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


@dataclass(frozen=True)
class Credential:
    """How a request authenticated, kept so a long-lived request (an SSE stream) can check again
    later that it still holds: PAT and session secrets only as their SHA-256 (as stored), a
    service-account token as itself (short-lived; it is re-verified). Never logged (repr hides it)."""
    kind: str                                   # pat | bearer | jwt | session
    token_id: str | None = None
    digest: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, kind: str, token_id: str | None, secret: str) -> "Credential":
        if kind == "jwt":
            return cls(kind, token=secret)
        return cls(kind, token_id, hashlib.sha256(secret.encode()).digest())
