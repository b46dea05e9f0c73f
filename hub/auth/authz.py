"""Authorisation: one ``authorize(relation, obj)`` that every handler calls (DESIGN.md section 8).

Relation tuples (object, relation, subject) live in PostgreSQL. Who holds what:

- an organisation admin holds every relation on every object of the organisation;
- a member user holds what tuples grant them — on a device, a configuration, or a fleet (which
  carries over to the fleet's devices: "member users only their permitted fleets");
- a service account holds what its IAM policy grants — tuples on objects, or on the organisation
  itself, which means that relation on every object (an org-wide grant).

Relations imply weaker ones: editor ⊇ viewer, billing_admin ⊇ billing_viewer. A caller with valid
credentials but without the relation gets 403; another organisation's object never reaches here
(handlers load objects by org_id first, so it is a 404 like a missing one).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from quart import g

from hub.errors import Forbidden

RELATIONS = ("viewer", "editor", "billing_viewer", "billing_admin", "tunnel_access", "audit_viewer")
OBJECT_TYPES = ("organization", "fleet", "device", "configuration")
# Which relations each relation implies (itself included).
IMPLIES = {
    "viewer": {"viewer"},
    "editor": {"editor", "viewer"},
    "billing_viewer": {"billing_viewer"},
    "billing_admin": {"billing_admin", "billing_viewer"},
    "tunnel_access": {"tunnel_access"},
    "audit_viewer": {"audit_viewer"},
}


@dataclass(frozen=True)
class Obj:
    type: str                         # organization | fleet | device | configuration
    id: uuid.UUID
    fleet_id: uuid.UUID | None = None  # for a device: its fleet, through which members may hold it


def holds(tuples: frozenset, relation: str, obj: Obj, org_id: uuid.UUID) -> bool:
    """Pure: does this set of (object_type, object_id, relation) tuples grant ``relation`` on ``obj``?"""
    granting = [r for r, implied in IMPLIES.items() if relation in implied]
    for r in granting:
        if ("organization", org_id, r) in tuples or (obj.type, obj.id, r) in tuples:
            return True
        if obj.fleet_id is not None and ("fleet", obj.fleet_id, r) in tuples:
            return True
    return False


def visible(tuples: frozenset, relation: str, object_type: str, org_id: uuid.UUID) -> tuple[bool, set, set]:
    """For list endpoints: (everything?, object ids granted directly, fleet ids granted)."""
    granting = {r for r, implied in IMPLIES.items() if relation in implied}
    if any(("organization", org_id, r) in tuples for r in granting):
        return True, set(), set()
    ids = {oid for (t, oid, r) in tuples if t == object_type and r in granting}
    fleets = {oid for (t, oid, r) in tuples if t == "fleet" and r in granting}
    return False, ids, fleets


async def tuples_of(services, org_id: uuid.UUID, subject_type: str, subject_id: uuid.UUID) -> frozenset:
    async def load() -> frozenset:
        return frozenset(await services.stores.identity.relations_of(org_id, subject_type, subject_id))

    return await services.access.auth_cache.get_or_load(("relations", org_id, subject_type, subject_id), load,
                                                 lambda _: (f"relations:{org_id}", f"subject:{subject_id}"))


async def _caller_tuples(services, org=None, p=None) -> frozenset | None:
    """None for an org admin (holds everything); else the caller's tuples in this organisation.
    The request's caller unless ``org`` and ``p`` are given (an open stream re-checking)."""
    org = org or g.org
    if org.is_admin:
        return None
    p = p or g.principal
    subject_type, subject_id = ("service", p.service_id) if p.kind == "service" else ("user", p.user_id)
    return await tuples_of(services, org.org_id, subject_type, subject_id)


async def authorize(services, relation: str, obj: Obj) -> None:
    ctx = g._get_current_object()  # one read through Quart's proxy, not three (hub/auth/middleware.py)
    tuples = await _caller_tuples(services, ctx.org, ctx.principal)
    if tuples is None or holds(tuples, relation, obj, ctx.org.org_id):
        return
    raise Forbidden(f"you need the {relation} relation on this {obj.type}", code="missing_relation")


async def still_holds(services, org, principal, relation: str, obj: Obj) -> bool:
    """``authorize`` for a caller given explicitly, outside its request (hub/auth/streams.py)."""
    tuples = await _caller_tuples(services, org, principal)
    return tuples is None or holds(tuples, relation, obj, org.org_id)


async def require_org(services, relation: str) -> None:
    """A relation on the organisation itself (billing, audit, org-wide creation)."""
    await authorize(services, relation, Obj("organization", g.org.org_id))


async def require_deploy(services, config_id: uuid.UUID) -> None:
    """Delivering a configuration to devices (assigning it to a device, rolling it out, making it a
    fleet's) needs editor on it, not viewer: a device one controls receives its secret files and
    environment in the clear, so delivering is reading them. Every path a configuration takes to a
    device calls this (docs/security.md, "Delivering a configuration")."""
    await authorize(services, "editor", Obj("configuration", config_id))


async def require_admin() -> None:
    if not g.org.is_admin:
        raise Forbidden("this needs the organisation admin role", code="admin_required")


async def scope_for_list(services, relation: str, object_type: str) -> tuple[bool, set, set]:
    tuples = await _caller_tuples(services)
    if tuples is None:
        return True, set(), set()
    return visible(tuples, relation, object_type, g.org.org_id)
