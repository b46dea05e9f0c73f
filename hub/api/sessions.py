"""Dashboard sign-in: POST /v1/auth/login, POST /v1/auth/logout, GET /v1/auth/session."""

from __future__ import annotations

import functools
import secrets

import trio
from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, g, jsonify, request

from hub.api.common import errors, jsonable, principal, services
from hub.api.validation import body, enveloped, responds
from hub.auth.middleware import client_addr, cross_origin
from hub.auth.routes import no_org, public
from hub.auth.schemes import SESSION_COOKIE
from hub.auth.passwords import hash_password, verify_password
from hub.auth.pat import digest
from hub.auth.sessions import SESSION_LIFETIME
from hub.errors import BadRequest, Forbidden, RateLimited, Unauthenticated

bp = Blueprint("sessions", __name__, url_prefix="/v1/auth")


class Login(BaseModel):
    model_config = ConfigDict(extra="forbid")
    email: str = Field(..., min_length=3, max_length=320)
    password: str = Field(..., min_length=1, max_length=1024)


class SessionOut(BaseModel):
    userId: str
    email: str | None = None
    csrfToken: str
    expiresAt: str | None = None


class SessionEnvelope(BaseModel):
    data: SessionOut


@bp.post("/login")
@public
@body(Login)
@responds(SessionEnvelope)
@errors(400, 401, 403, 429)
async def login(data: Login):
    """JSON only, and only from the hub's own pages: an HTML form on another site can post text/plain
    with a JSON body, and would otherwise sign a victim's browser into the attacker's account."""
    if request.mimetype != "application/json":
        raise BadRequest("the body must be JSON (Content-Type: application/json)", code="json_required")
    if cross_origin(request):
        raise Forbidden("sign-in is accepted from the hub's own pages only", code="cross_origin")
    s = services()
    now = s.clock.now()
    addr = client_addr()
    # Counted before the password check: parallel guesses each take a slot, so at most the limit of
    # them ever reach it (in one process with no await before the count; in a cluster under a
    # PostgreSQL lock per account and address).
    attempt = await s.topology.limits.reserve_login(data.email, addr, now)  # a cluster's: on every node
    if not attempt.allowed:
        raise RateLimited("too many failed sign-in attempts; try again later", retry_after=attempt.wait)
    user = await s.stores.orgs.get_user_by_email(data.email)
    # Hash even for an unknown account so timing does not tell which accounts exist.
    stored = user["password_hash"] if user else None
    # the dummy hash too in the worker thread: the first one made is an argon2id hash (about 0.1 s),
    # and on the loop it would hold every link and request of the hub meanwhile
    ok = await trio.to_thread.run_sync(lambda: verify_password(stored or _dummy_hash(), data.password))
    if not (user and stored and ok):
        raise Unauthenticated("wrong email or password", code="invalid_credentials")  # stays counted
    await s.topology.limits.login_succeeded(attempt)
    session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    expires = now + SESSION_LIFETIME
    await s.stores.identity.create_session(digest(session_id), user["id"], csrf, now, expires, addr)
    response = jsonify({"data": jsonable({"userId": user["id"], "email": user["email"], "csrfToken": csrf,
                                          "expiresAt": expires})})
    response.set_cookie(SESSION_COOKIE, session_id, max_age=int(SESSION_LIFETIME.total_seconds()), path="/",
                        httponly=True, samesite="Strict", secure=request.scheme == "https")
    return response


class SignedOut(BaseModel):
    signedOut: bool


@bp.post("/logout")
@no_org
@responds(enveloped(SignedOut))
@errors(401, 403)
async def logout():
    s = services()
    if principal().via != "session":
        raise BadRequest("logout ends a dashboard session; API tokens are deleted instead", code="not_a_session")
    h = g.session_hash
    await s.stores.identity.delete_session(h)
    await s.invalidate(f"session:{h.hex()}")
    response = jsonify({"data": {"signedOut": True}})
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="Strict")
    return response


@bp.get("/session")
@no_org
@responds(SessionEnvelope)
@errors(401)
async def current_session():
    if principal().via != "session":
        raise BadRequest("no dashboard session on this request", code="not_a_session")
    return {"data": {"userId": str(principal().user_id), "csrfToken": g.csrf_token}}


@functools.cache
def _dummy_hash() -> str:
    return hash_password(secrets.token_urlsafe(16))
