"""Tunnel sessions for command-line clients (spec: Endpoints, "Tunnel sessions"; docs: hub/tunnels/).

Every error under /v1/cli/tunnel/ has the body ``{"error_code", "message", ...}`` (hub/app.py picks
hub/errors.tunnel_body by path). Bodies and fields are snake_case (DESIGN.md section 12); successful
answers are wrapped in ``{"data": ...}`` like every other endpoint of the hub.

    GET    /v1/cli/tunnel/entitlements           Either; Org     {sessions_enabled, relay_allowed, limits, defaults}
    POST   /v1/cli/tunnel/token                  Either; Org     {token, token_type: "Bearer", expires_in, expires_at}
    GET    /v1/cli/tunnel/ice-servers            TunnelToken     {ice_servers, relay_allowed, expires_at}: to
                                                                  gather an offer with (a browser's relay)
    POST   /v1/cli/tunnel/session                TunnelToken     body {device_id, target, offer: {sdp, type},
                                                                  bandwidth_bps?, duration_seconds?}
           → {session_id, grant, answer: {sdp, type}, signalling_token, ice_servers: [{urls, username?,
              credential?}], expires_at, max_expires_at, relay_allowed, bandwidth_bps}
    DELETE /v1/cli/tunnel/session/{sid}          TunnelToken     → {session_id, closed: true, device_acknowledged}
    POST   /v1/cli/tunnel/session/{sid}/renew    TunnelToken     body {grant} → {session_id, grant, expires_at,
                                                                  signalling_token, ice_servers}
    WS     /v1/cli/tunnel/session/{sid}/signal   signalling token (Authorization: Bearer, or ?token=)
           client → hub {type: "ice_restart", offer: {sdp, type}}; hub → client {type: "answer", answer},
           {type: "error", error_code, message}, and {type: "closed", reason} when the session ends
           (DELETE, the device's final usage, expiry), after which the hub closes the socket.

``target`` is a name from the device's hello ``tunnelTargets.names`` or a port (decimal string) from
``tunnelTargets.ports``. ``bandwidth_bps`` (bytes per second, each direction) and ``duration_seconds``
(the session's total length, renewals included) default to the organisation's limits.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

import trio
from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, g, websocket
from quart_schema import document_response

from actors.errors import ActorError, AskError
from actors.tunnel import Close, IceRestart, Watch
from device_client.shared.clock import rfc3339
from hub.api.common import jsonable, org, parse_uuid, principal, services
from hub.api.validation import body, enveloped, responds, strict_loads
from hub.auth.routes import public
from hub.errors import BadRequest, NotFound
from hub.tunnels import opening
from hub.tunnels.auth import tunnel_token
from hub.tunnels.limits import Entitlement
from hub.tunnels.tokens import TUNNEL_TOKEN_LIFETIME, BadTunnelToken
from webrtc.sdp import fingerprint

log = logging.getLogger("fleethub.tunnels")
bp = Blueprint("tunnels", __name__, url_prefix="/v1/cli/tunnel")


class Offer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sdp: str = Field(min_length=1, max_length=64 * 1024)
    type: Literal["offer"]


class SessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device_id: str
    target: str = Field(min_length=1, max_length=64)
    offer: Offer
    bandwidth_bps: int | None = Field(None, gt=0)
    duration_seconds: int | None = Field(None, gt=0)


class RenewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grant: str = Field(min_length=1, max_length=16 * 1024)


class TunnelError(BaseModel):
    """The tunnel endpoints' error body."""
    error_code: str
    message: str


class EntitlementsView(BaseModel):
    model_config = ConfigDict(extra="allow")
    sessions_enabled: bool
    relay_allowed: bool
    limits: dict[str, Any]
    defaults: dict[str, Any]
    turn_configured: bool


class TunnelToken(BaseModel):
    token: str
    token_type: str
    expires_in: int
    expires_at: str
    scope: str


class SessionOpened(BaseModel):
    model_config = ConfigDict(extra="allow")
    session_id: str
    grant: str
    answer: dict[str, Any]
    signalling_token: str
    ice_servers: list[dict[str, Any]]
    expires_at: str


class SessionClosed(BaseModel):
    model_config = ConfigDict(extra="allow")
    session_id: str
    closed: bool


def tunnel_errors(*statuses: int):
    """Document the error responses a view can give, in the tunnel endpoints' shape."""
    def decorator(func):
        for status in statuses:
            func = document_response(TunnelError, status)(func)
        return func
    return decorator


@bp.get("/entitlements")
@responds(enveloped(EntitlementsView))
@tunnel_errors(400, 401, 503)
async def entitlements():
    s = services()
    opening.require_enabled(s)
    ent = Entitlement.of(await s.tunnels.store.entitlement(org().org_id))
    view = ent.view()
    view["turn_configured"] = bool(s.settings.turn_urls and s.settings.turn_secret)
    return {"data": view}


@bp.post("/token")
@responds(enveloped(TunnelToken))
@tunnel_errors(400, 401, 403, 503)
async def tunnel_token_issue():
    s = services()
    opening.require_enabled(s)
    p = principal()
    if p.kind == "service":
        kind, subject = "service", p.service_id
    else:
        kind, subject = "user", p.user_id
    token, expires_at = s.tunnels.tokens.issue(kind, subject, org().org_id, p.id, s.clock.now())
    g.audit_details = {"operation": "tunnel.token"}
    return {"data": {"token": token, "token_type": "Bearer", "expires_in": TUNNEL_TOKEN_LIFETIME,
                     "expires_at": rfc3339(expires_at), "scope": "tunnel"}}


class IceServersView(BaseModel):
    ice_servers: list[dict[str, Any]]
    relay_allowed: bool
    expires_at: str


@bp.get("/ice-servers")
@tunnel_token
@responds(enveloped(IceServersView))
@tunnel_errors(401, 403, 503)
async def ice_servers():
    """The ICE servers to gather an offer with before opening a session (TURN credentials when the
    organisation may relay): what a browser peer needs, whose host addresses are hidden."""
    s = services()
    return {"data": jsonable(await opening.offer_ice_servers(s, principal(), org().org_id))}


@bp.post("/session")
@tunnel_token
@body(SessionRequest)
@responds(enveloped(SessionOpened))
@tunnel_errors(400, 401, 403, 404, 409, 429, 500, 502, 503, 504)
async def open_session(data: SessionRequest):
    s = services()
    opening.require_enabled(s)
    device_id = parse_uuid(data.device_id, "device_id")
    try:
        client_fingerprint = fingerprint(data.offer.sdp)
    except ValueError:
        raise BadRequest("offer.sdp carries no DTLS fingerprint", code="invalid_offer") from None
    g.audit_details = {"operation": "tunnel.open", "deviceId": str(device_id), "target": data.target}
    result = await opening.open_session(s, principal(), org().org_id, device_id, data.target,
                                        data.offer.model_dump(), client_fingerprint, data.bandwidth_bps,
                                        data.duration_seconds)
    g.audit_details = {**g.audit_details, "sessionId": result["session_id"],
                       "expiresAt": rfc3339(result["expires_at"]), "relay": result["relay_allowed"]}
    return {"data": jsonable(result)}


@bp.delete("/session/<sid>")
@tunnel_token
@responds(enveloped(SessionClosed))
@tunnel_errors(401, 404, 503)
async def close_session(sid: str):
    s = services()
    opening.require_enabled(s)
    session_id = _sid(sid)
    row = await opening.own_session(s, principal(), org().org_id, session_id)
    g.audit_details = {"operation": "tunnel.close", "sessionId": str(session_id), "deviceId": str(row["device_id"])}
    actor = await s.tunnels.actor(session_id)
    try:
        reply = await actor.ask(Close("closed by the client"), timeout=s.settings.command_timeout + 10)
    except ActorError:
        raise NotFound("tunnel session not found", code="not_found") from None
    return {"data": {"session_id": str(session_id), "closed": True,
                     "device_acknowledged": reply["device_acknowledged"]}}


@bp.post("/session/<sid>/renew")
@tunnel_token
@body(RenewRequest)
@responds(enveloped(SessionOpened))
@tunnel_errors(400, 401, 403, 404, 429, 500, 503)
async def renew_session(sid: str, data: RenewRequest):
    s = services()
    session_id = _sid(sid)
    g.audit_details = {"operation": "tunnel.renew", "sessionId": str(session_id)}
    result = await opening.renew_session(s, principal(), org().org_id, session_id, data.grant)
    g.audit_details = {**g.audit_details, "expiresAt": rfc3339(result["expires_at"])}
    return {"data": jsonable(result)}


def _sid(raw: str):
    try:
        return parse_uuid(raw, "session id")
    except BadRequest:
        raise NotFound("tunnel session not found", code="not_found") from None


# -- the signalling WebSocket ------------------------------------------------------------------------
def _signal_token() -> str | None:
    scheme, _, value = websocket.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return websocket.args.get("token") or None


@bp.websocket("/session/<sid>/signal")
@public
async def signal(sid: str):
    s = services()
    if not s.settings.tunnels_enabled:
        return {"error_code": "tunnels_unavailable", "message": "tunnelling is not configured"}, 503
    token = _signal_token()
    try:
        session_id = parse_uuid(sid, "session id")
        if token is None:
            raise BadTunnelToken("a signalling token is required")
        org_id = s.tunnels.tokens.verify_signal(token, session_id, s.clock.now())
    except (BadTunnelToken, BadRequest) as exc:
        return {"error_code": "unauthenticated", "message": str(exc)}, 401
    row = await s.tunnels.store.get_in_org(org_id, session_id)
    if row is None:
        return {"error_code": "not_found", "message": "tunnel session not found"}, 404
    try:
        actor = await s.tunnels.actor(session_id)
        closed = await actor.ask(Watch(), timeout=10)
    except AskError:  # no such session (its actor's NotFound), or its actor could not answer
        return {"error_code": "not_found", "message": "tunnel session not found"}, 404
    await websocket.accept()
    ws = websocket._get_current_object()
    send_lock = trio.Lock()

    async def send(message: dict[str, Any]) -> None:
        async with send_lock:
            await ws.send(json.dumps(message))

    async def notices(cancel: trio.CancelScope) -> None:
        async for notice in closed:
            await send(notice)
        cancel.cancel()  # the session ended: so does its signalling

    restarting = trio.Lock()  # one ICE restart at a time
    close: tuple[int, str] = (1000, "session closed")

    async def restart(message: dict[str, Any]) -> None:
        async with restarting:
            await _signal_message(s, session_id, message, send)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(notices, nursery.cancel_scope)
        while True:
            # A client that sends what is not a message, or a second restart while one is running,
            # is broken: its socket closes with the reason (the session itself is not affected).
            try:
                message = strict_loads(await ws.receive())  # deep nesting is malformed too, not a crash
            except ValueError:
                message = None
            problem = _malformed(message)
            if problem is not None:
                close = (SIGNAL_BAD_MESSAGE, problem)
                break
            if restarting.locked():
                close = (SIGNAL_OUT_OF_ORDER, "an ICE restart is already in progress")
                break
            nursery.start_soon(restart, message)
        nursery.cancel_scope.cancel()
    await ws.close(*close)


SIGNAL_BAD_MESSAGE = 4400  # close code: not JSON, or not {"type": "ice_restart", "offer": {sdp, type}}
SIGNAL_OUT_OF_ORDER = 4409  # close code: an ICE restart while another is running


def _malformed(message: Any) -> str | None:
    if not isinstance(message, dict):
        return "malformed message: not a JSON object"
    if message.get("type") != "ice_restart" or not isinstance(message.get("offer"), dict):
        return 'malformed message: expected {"type": "ice_restart", "offer": {"sdp", "type"}}'
    offer = message["offer"]
    if not isinstance(offer.get("sdp"), str) or offer.get("type") != "offer":
        return "malformed message: the offer needs sdp and type offer"
    return None


async def _signal_message(s, session_id, message: dict[str, Any], send) -> None:
    offer = message["offer"]
    try:
        actor = await s.tunnels.actor(session_id)
        reply = await actor.ask(IceRestart({"sdp": offer["sdp"], "type": "offer"}),
                                timeout=s.settings.command_timeout + 10)
    except AskError as exc:  # the session's refusal (actors/errors.py) or the hub's
        await send({"type": "error", "error_code": exc.code, "message": exc.message})
        return
    await send({"type": "answer", "answer": reply.get("answer")})
