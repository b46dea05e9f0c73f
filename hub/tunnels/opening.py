"""Opening and renewing a session: the spec's checks, in the spec's order, then the grant.

    1. the caller's tunnel_access relation on the device   403 missing_relation
    2. the organisation's entitlement                       403 tunnel_not_entitled
    3. the account state (billing lock)                     403 account_locked (402 is not among
                                                            the spec's statuses for these endpoints)
    4. the device's tunnel identity                         404 no_device_identity: no such device in
                                                            the organisation, or its hello carried no
                                                            tunnelPublicKey
    5. the target, before the device is asked               404 target_not_configured: not among the
                                                            hello's tunnelTargets (names, or ports)
    6. the limits                                           429 too_many_sessions / device_busy /
                                                            limit_exceeded
    then the grant is signed (500 grant_rejected on a fault) and handed to the device.

A device that is offline when asked is 504 device_unreachable, like one that does not answer: both
look the same from where the CLI stands, and the identity and target were already known from its
last hello. A device not in the caller's organisation is 404 no_device_identity without the relation
check (there is nothing to hold a relation on), so the answer never tells whether it exists elsewhere.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from actors.runtime import ActorError
from actors.tunnel import Open, Renew, device_failure
from hub.auth.authz import Obj, authorize
from hub.billing.state import org_billing
from hub.errors import Forbidden, NotFound, Unavailable
from hub.tunnels import grants, turn
from hub.tunnels.auth import TunnelPrincipal
from hub.tunnels.limits import Entitlement, LimitHit, slot_refused


@dataclass(frozen=True)
class Checked:
    device: dict[str, Any]
    device_key: str
    entitlement: Entitlement


def require_enabled(s) -> None:
    if not s.settings.tunnels_enabled:
        raise Unavailable("tunnelling is not configured on this deployment", code="tunnels_unavailable")


def target_allowed(targets: Any, target: str) -> bool:
    """``tunnelTargets`` of the hello: {names: [str], ports: [int], ssh: bool}. ``ssh`` is a target
    of every agent that advertises tunnel targets: when its ssh is off the device itself refuses
    with 409 ssh_disabled (the spec's code for that), so the hub passes it on. ``shell`` (the browser
    terminal's PTY target) likewise: a device with it off refuses 409 shell_disabled."""
    if not isinstance(targets, dict):
        return False
    if target in ("ssh", "shell") or target in (targets.get("names") or []):
        return True
    return target.isdigit() and int(target) in (targets.get("ports") or [])


async def _facts(s, row: dict) -> dict:
    """The device's hello facts: live from its actor when it is up (presence rows are written
    behind), else the stored ones."""
    actor = s.registry.lookup(("device", row["id"]))
    live = getattr(actor, "facts", None) if actor is not None else None
    return live or row.get("facts") or {}


async def entitled(s, org_id: uuid.UUID) -> Entitlement:
    """The organisation's tunnel entitlement, when it may open sessions now (entitled, not billing-locked)."""
    ent = Entitlement.of(await s.tunnels.store.entitlement(org_id))
    if not ent.enabled:
        raise Forbidden("the organisation is not entitled to tunnel sessions", code="tunnel_not_entitled")
    if (await org_billing(s, org_id)).locked:
        raise Forbidden("the account is billing-locked; tunnel sessions are refused until it is settled",
                        code="account_locked")
    return ent


async def check(s, org_id: uuid.UUID, device_id: uuid.UUID, target: str) -> Checked:
    row = await s.stores.devices.get(org_id, device_id)
    if row is not None:
        await authorize(s, "tunnel_access", Obj("device", row["id"], row.get("fleet_id")))
    ent = await entitled(s, org_id)
    facts = await _facts(s, row) if row is not None else {}
    key = facts.get("tunnelPublicKey") or (row or {}).get("tunnel_public_key")
    if row is None or not key:
        raise NotFound("no such device, or it has no tunnel identity", code="no_device_identity")
    if not target_allowed(facts.get("tunnelTargets"), target):
        raise NotFound(f"the device has no tunnel target {target!r}", code="target_not_configured")
    return Checked(row, key, ent)


def _ms(instant: dt.datetime) -> dt.datetime:
    """Grants carry milliseconds (RFC 3339 as the hub writes it): stored instants match them exactly."""
    return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


def _window(s, now: dt.datetime, max_expires_at: dt.datetime) -> dt.datetime:
    return min(now + dt.timedelta(seconds=s.settings.tunnel_grant_seconds), max_expires_at)


def _ice(s, principal: str, relay: bool, expires_at: dt.datetime) -> list[dict]:
    st = s.settings
    return turn.ice_servers(stun_urls=st.stun_urls, turn_urls=st.turn_urls, turn_secret=st.turn_secret,
                            relay=relay, principal=principal, expires_at=expires_at)


async def open_session(s, principal: TunnelPrincipal, org_id: uuid.UUID, device_id: uuid.UUID, target: str,
                       offer: dict, client_fingerprint: str, bandwidth_bps: int | None,
                       duration_seconds: int | None) -> dict[str, Any]:
    require_enabled(s)
    c = await check(s, org_id, device_id, target)
    bandwidth, duration = c.entitlement.granted(bandwidth_bps, duration_seconds)
    now = _ms(s.clock.now())
    sid = uuid.uuid4()
    max_expires_at = now + dt.timedelta(seconds=duration)
    expires_at = _window(s, now, max_expires_at)
    relay = c.entitlement.relay_allowed
    body = grants.payload(kid=s.tunnels.grants.kid, sid=str(sid), org_id=str(org_id), device_id=str(device_id),
                          principal=principal.name, target=target, not_before=now, expires_at=expires_at,
                          relay=relay, bandwidth_bps=bandwidth, client_fingerprint=client_fingerprint,
                          device_key=c.device_key)
    kind, _, subject = principal.name.partition(":")
    refused = await s.tunnels.store.open_session(
        {"id": sid, "org_id": org_id, "device_id": device_id, "principal_kind": kind,
         "principal_id": uuid.UUID(subject), "target": target, "relay_allowed": relay, "opened_at": now,
         "expires_at": expires_at, "grant_payload": body, "max_expires_at": max_expires_at},
        max_sessions=c.entitlement.max_sessions, max_per_device=c.entitlement.max_sessions_per_device)
    if refused is not None:
        raise slot_refused(refused, c.entitlement)
    try:
        grant = s.tunnels.grants.sign(body)
    except grants.GrantRejected:
        await s.tunnels.store.finish(sid, "failed", "grant_rejected", now)
        raise
    ice_servers = _ice(s, principal.name, relay, expires_at)
    actor = await s.tunnels.actor(sid)
    try:
        reply = await actor.ask(Open({"grant": grant, "offer": offer, "iceServers": ice_servers}),
                                timeout=s.settings.command_timeout + 10)
    except ActorError as exc:  # the session's actor itself failed to answer: the device was not reached
        raise device_failure(exc) from None
    return {"session_id": str(sid), "grant": grant, "answer": reply.get("answer"),
            "signalling_token": s.tunnels.tokens.issue_signal(sid, org_id, now, expires_at),
            "ice_servers": ice_servers, "expires_at": expires_at, "max_expires_at": max_expires_at,
            "relay_allowed": relay, "bandwidth_bps": bandwidth}


async def offer_ice_servers(s, principal: TunnelPrincipal, org_id: uuid.UUID) -> dict[str, Any]:
    """The ICE servers a client gathers its offer with, before it opens a session. A browser needs
    them then: it hides its host addresses behind mDNS names the device cannot resolve, so its offer
    must carry a relay candidate of its own (docs/console.md, Terminal). The same entitlement and
    billing checks as an open; TURN credentials only when the organisation may relay, valid for one
    grant window."""
    require_enabled(s)
    ent = await entitled(s, org_id)
    now = _ms(s.clock.now())
    expires_at = now + dt.timedelta(seconds=s.settings.tunnel_grant_seconds)
    relay = ent.relay_allowed
    return {"ice_servers": _ice(s, principal.name, relay, expires_at), "relay_allowed": relay,
            "expires_at": expires_at}


async def own_session(s, principal: TunnelPrincipal, org_id: uuid.UUID, sid: uuid.UUID) -> dict:
    """The caller's own session that has not ended; anyone else's is a 404 like a missing one."""
    row = await s.tunnels.store.get_in_org(org_id, sid)
    if row is None or f"{row['principal_kind']}:{row['principal_id']}" != principal.name \
            or row["state"] not in ("opening", "open"):
        raise NotFound("tunnel session not found", code="not_found")
    return row


async def renew_session(s, principal: TunnelPrincipal, org_id: uuid.UUID, sid: uuid.UUID,
                        token: Any) -> dict[str, Any]:
    require_enabled(s)
    row = await own_session(s, principal, org_id, sid)
    presented = s.tunnels.grants.verify(token)
    stored = row["grant_payload"] or {}
    window = ("notBefore", "expiresAt")
    if {k: v for k, v in presented.items() if k not in window} != {k: v for k, v in stored.items() if k not in window}:
        raise grants.InvalidGrant("the grant is not this session's grant")
    c = await check(s, org_id, row["device_id"], row["target"])
    if c.device_key != stored.get("deviceKey"):
        raise NotFound("the device's tunnel identity changed since the session opened", code="no_device_identity")
    now = _ms(s.clock.now())
    expires_at = _window(s, now, row["max_expires_at"])
    if expires_at <= row["expires_at"]:
        raise LimitHit("the session reached its maximum length", code="limit_exceeded",
                       details={"limit": "max_session_seconds", "max": c.entitlement.max_session_seconds})
    # Signed by the current key, which may be newer than the one the session opened with.
    body = {**stored, "kid": s.tunnels.grants.kid, "notBefore": grants.payload_time(now),
            "expiresAt": grants.payload_time(expires_at)}
    grant = s.tunnels.grants.sign(body)
    actor = await s.tunnels.actor(sid)
    await actor.ask(Renew(expires_at, body), timeout=10)
    return {"session_id": str(sid), "grant": grant, "expires_at": expires_at,
            "signalling_token": s.tunnels.tokens.issue_signal(sid, org_id, now, expires_at),
            "ice_servers": _ice(s, principal.name, bool(stored.get("relay")), expires_at)}
