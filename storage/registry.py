"""What the hub's registry proxy (hub/registry/) asks of storage: who is pulling, and whether their
organisation's versions name the repository they pull from."""

from __future__ import annotations

import uuid

from storage.db import Database


class RegistryAccess:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def puller(self, token_hash: bytes) -> dict | None:
        """The device holding this token: its id, organisation, fleet and the fleet's proxy switch."""
        row = await self.db.fetchrow(
            "SELECT d.id, d.org_id, d.fleet_id, coalesce(f.registry_proxy, false) AS registry_proxy "
            "FROM devices d LEFT JOIN fleets f ON f.id = d.fleet_id WHERE d.token_hash = $1", token_hash)
        return dict(row) if row else None

    async def names_repository(self, org_id: uuid.UUID, name: str) -> bool:
        """Whether a version of the organisation pins an image of ``name`` (registry/repository, the
        registry in lower case): a device pulls only what its organisation shipped."""
        return bool(await self.db.fetchval(
            "SELECT EXISTS (SELECT 1 FROM configuration_versions v, "
            "jsonb_array_elements(CASE WHEN jsonb_typeof(v.spec->'containers') = 'array' "
            "THEN v.spec->'containers' ELSE '[]'::jsonb END) c "
            "WHERE v.org_id = $1 AND split_part(lower(c->>'image'), '@', 1) = $2)", org_id, name))
