"""Registry credentials of an organisation: registry (host[:port]), username and the sealed password.

The password is ciphertext here (the caller seals and opens it with the hub's SecretBox); what the
API lists comes from ``list``, which never reads the ciphertext. Every call is scoped by organisation.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Collection


from storage.db import Database

_META = "id, registry, username, created_at, updated_at"


class RegistryCredentials:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def put(self, org_id: uuid.UUID, registry: str, username: str, ciphertext: bytes,
                  now: dt.datetime) -> tuple[dict, bool]:
        """Store the registry's credential, replacing the one it had; (its metadata, created?)."""
        row = await self.db.fetchrow(
            f"""INSERT INTO registry_credentials (id, org_id, registry, username, ciphertext, created_at, updated_at)
                VALUES ($1, $2, $3, $4, $5, $6, $6)
                ON CONFLICT (org_id, registry) DO UPDATE SET username = EXCLUDED.username,
                    ciphertext = EXCLUDED.ciphertext, updated_at = EXCLUDED.updated_at
                RETURNING {_META}, (xmax = 0) AS created""",
            uuid.uuid4(), org_id, registry, username, ciphertext, now)
        out = dict(row)
        return out, out.pop("created")

    async def list(self, org_id: uuid.UUID) -> list[dict]:
        rows = await self.db.fetch(f"SELECT {_META} FROM registry_credentials WHERE org_id = $1 ORDER BY registry",
                                   org_id)
        return [dict(r) for r in rows]

    async def delete(self, org_id: uuid.UUID, credential_id: uuid.UUID) -> dict | None:
        row = await self.db.fetchrow(
            f"DELETE FROM registry_credentials WHERE org_id = $1 AND id = $2 RETURNING {_META}", org_id, credential_id)
        return dict(row) if row else None

    async def sealed_for(self, org_id: uuid.UUID, registries: Collection[str]) -> dict[str, tuple[str, bytes]]:
        """registry -> (username, ciphertext) for those of ``registries`` the organisation has."""
        if not registries:
            return {}
        rows = await self.db.fetch(
            "SELECT registry, username, ciphertext FROM registry_credentials WHERE org_id = $1 "
            "AND registry = ANY($2::text[])", org_id, list(registries))
        return {r["registry"]: (r["username"], bytes(r["ciphertext"])) for r in rows}

    async def running_versions(self, org_id: uuid.UUID) -> list[tuple[uuid.UUID, dict]]:
        """(version id, spec) of each container version some device of the organisation runs."""
        rows = await self.db.fetch(
            """SELECT v.id, v.spec FROM configuration_versions v
               WHERE v.org_id = $1 AND v.spec ? 'containers'
                 AND v.id IN (SELECT applied_version_id FROM devices WHERE org_id = $1 AND applied_version_id IS NOT NULL)""",
            org_id)
        return [(r["id"], json.loads(r["spec"]) if isinstance(r["spec"], str) else r["spec"]) for r in rows]


