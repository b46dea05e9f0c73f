"""Open streams end when their access does.

A request's access is checked once, when it starts; an SSE stream lives on for hours. So a stream
keeps what it was opened with (the credential, as hub/auth/principals.Credential, the organisation
and the relation it needed on its object) and checks it again:

- at once when any authentication tag it depends on is forgotten — a PAT deleted, a session ended,
  a member removed or their role changed, a relation granted or revoked, a service account deleted
  (``AuthCache.watch``: local invalidations and other processes' NOTIFY alike), or the whole cache
  cleared after PostgreSQL reconnects;
- every ``RECHECK_EVERY`` seconds anyway, which catches expiry and changes the cache does not tag
  (a device moved to a fleet the caller cannot see);
- ``RETRY_AFTER`` seconds after a check that could not reach storage: an outage neither ends a
  stream nor lets it go unchecked once storage is back.

A check that fails gives the reason (never a secret) for the stream's final event.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import trio
from quart import g

from hub.auth.authz import Obj, still_holds
from hub.auth.cache import Watch
from hub.auth.principals import Credential, OrgContext, Principal
from hub.auth.schemes import pat_principal, service_principal, session_principal
from hub.errors import Unauthenticated

log = logging.getLogger("fleethub.streams")

RECHECK_EVERY = 60.0
RETRY_AFTER = 1.0


@dataclass
class StreamAccess:
    services: Any
    credential: Credential
    principal: Principal
    org_id: uuid.UUID
    relation: str
    objs: tuple[Obj, ...]  # it needs ``relation`` on each (a rollout: on every one of its fleets)
    recheck_at: float = field(default_factory=lambda: trio.current_time() + RECHECK_EVERY)

    @classmethod
    def of_request(cls, services, relation: str, *objs: Obj) -> "StreamAccess":
        """The current request's caller, once it has been authorised for ``relation`` on ``objs``."""
        return cls(services, g.credential, g.principal, g.org.org_id, relation, objs)

    def tags(self) -> frozenset[str]:
        p, org = self.principal, self.org_id
        tags = {f"org:{org}", f"relations:{org}"}
        for subject in (p.user_id, p.service_id):
            if subject is not None:
                tags |= {f"user:{subject}", f"subject:{subject}", f"service:{subject}"}
        if self.credential.kind in ("pat", "bearer"):
            tags.add(f"pat:{p.id}")
        if self.credential.kind == "session" and self.credential.digest is not None:
            tags.add(f"session:{self.credential.digest.hex()}")
        tags |= {object_tag(obj) for obj in self.objs if obj.type == "device"}
        return frozenset(tags)

    def watch(self) -> Watch:
        return self.services.access.auth_cache.watch(self.tags())

    async def check(self) -> str | None:
        """None while the caller still holds the access; else why not. Sets ``recheck_at``."""
        s, cred = self.services, self.credential
        self.recheck_at = trio.current_time() + RECHECK_EVERY
        try:
            if cred.kind == "jwt":
                principal, role, *_ = await service_principal(s, cred.token, self.org_id)
            elif cred.kind == "session":
                principal, role, *_ = await session_principal(s, cred.digest, self.org_id)
            else:
                principal, role, *_ = await pat_principal(s, cred.token_id, cred.digest, self.org_id, cred.kind)
            if role is None:
                return "you are no longer a member of this organisation"
            for obj in self.objs:
                obj = await self._current(obj)
                if obj is None:
                    return "it no longer exists"
                if not await still_holds(s, OrgContext(self.org_id, role), principal, self.relation, obj):
                    return f"you no longer hold {self.relation} on this {obj.type}"
        except Unauthenticated as exc:
            return f"the credential is no longer valid: {exc.message}"
        except Exception as exc:  # noqa: BLE001 — storage unreachable: keep streaming, check again soon
            log.info("stream access check deferred: %s", type(exc).__name__)
            self.recheck_at = trio.current_time() + RETRY_AFTER
        return None

    async def _current(self, obj: Obj) -> Obj | None:
        """The object as it is now: a device is held through the fleet it is in today, not the one it
        was in when the stream opened (a move to a fleet the caller cannot see ends the stream)."""
        if obj.type != "device":
            return obj
        row = await self.services.stores.devices.get(self.org_id, obj.id)
        return None if row is None else Obj("device", row["id"], row["fleet_id"])


def object_tag(obj: Obj) -> str:
    """The auth-cache tag a change of ``obj``'s place (a device moved, deleted) is announced under."""
    return f"{obj.type}:{obj.id}"
