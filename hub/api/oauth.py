"""POST /v1/oauth/token: the OAuth 2.0 client-credentials grant (RFC 6749 section 4.4).

Client authentication by HTTP Basic (section 2.3.1, the form every client library uses by default)
or by client_id/client_secret in the form body — not both. Errors are RFC 6749 section 5.2 bodies
``{"error", "error_description"}``, not our general error body: standard clients parse them.

Throttled before any secret is compared (hub/auth/ratelimit.BurstLimiter, counted before the check):
``PER_ADDRESS`` requests a minute from one client address, whatever they carry, and ``PER_CLIENT``
attempts a minute for one client id. Every answer carries the X-RateLimit-* headers of the tighter
of the two; over either, 429 with Retry-After and the RFC 6749 body ``{"error": "slow_down", …}``
(the token-endpoint code registered for "too fast", RFC 8628 section 3.5).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from urllib.parse import unquote_plus

from pydantic import BaseModel
from quart import Blueprint, g, jsonify, request
from quart_schema import DataSource, document_request, document_response

from hub.api.common import services
from hub.api.validation import form_problem
from hub.auth.middleware import client_addr
from hub.auth.routes import public
from hub.auth.oauth import TOKEN_LIFETIME
from hub.auth.pat import digest
from storage.text import refusal

bp = Blueprint("oauth", __name__, url_prefix="/v1/oauth")


class TokenRequest(BaseModel):
    grant_type: str
    client_id: str | None = None
    client_secret: str | None = None
    scope: str | None = None


class TokenResponse(BaseModel):
    access_token: str
    token_type: str
    expires_in: int
    scope: str


class OAuthErrorBody(BaseModel):
    error: str
    error_description: str


_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
# A service account needs one token an hour; these leave room for retries and fleets of workers
# behind one address, and stop online guessing of client secrets.
PER_ADDRESS = 60
PER_CLIENT = 10          # per (client id, address): an attacker slows down only their own address
PER_CLIENT_CEILING = 100  # per client id from all addresses: guessing from many addresses stays bounded


async def _throttle(key: tuple) -> object | None:
    """Count this attempt for ``key``; the 429 answer when over its limit. Keeps the tighter decision
    in ``g.ratelimit``: the app puts its X-RateLimit-* headers on every answer. A cluster node counts
    it on every node (hub/cluster/limits.py)."""
    s = services()
    limit = {"addr": PER_ADDRESS, "client": PER_CLIENT_CEILING}.get(key[0], PER_CLIENT)
    decision = await s.topology.limits.hit_burst(s.access.token_limiter, key, limit, s.clock.now())
    current = getattr(g, "ratelimit", None)
    if current is None or not decision.allowed or decision.remaining < current.remaining:
        g.ratelimit = decision
    if decision.allowed:
        return None
    response = _oauth_error("slow_down", "too many token requests; retry after the time in Retry-After", 429)
    response.headers["Retry-After"] = str(decision.retry_after)
    return response


def _oauth_error(error: str, description: str, status: int = 400, *, basic_challenge: bool = False):
    response = jsonify({"error": error, "error_description": description})
    response.status_code = status
    response.headers.update(_NO_STORE)
    if basic_challenge:
        response.headers["WWW-Authenticate"] = 'Basic realm="fleethub", charset="UTF-8"'
    return response


def _basic_credentials() -> tuple[str, str] | None | bool:
    """(id, secret) from HTTP Basic; None when absent; False when present but malformed."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return False
    client_id, sep, secret = decoded.partition(":")
    if not sep:
        return False
    client_id, secret = unquote_plus(client_id), unquote_plus(secret)
    if refusal(client_id) or refusal(secret):  # NUL or a lone surrogate: no client has it, storage refuses it
        return False
    return client_id, secret


@bp.post("/token")
@public
@document_request(TokenRequest, source=DataSource.FORM)
@document_response(TokenResponse, 200)
@document_response(OAuthErrorBody, 400)
@document_response(OAuthErrorBody, 401)
@document_response(OAuthErrorBody, 429)
async def token():
    s = services()
    refused = await _throttle(("addr", client_addr()))
    if refused is not None:
        return refused
    mimetype = request.mimetype
    if mimetype != "application/x-www-form-urlencoded":
        return _oauth_error("invalid_request", "the body must be application/x-www-form-urlencoded")
    form = await request.form
    problem = form_problem(form)  # NUL in client_id was a 500 from storage
    if problem is not None:
        return _oauth_error("invalid_request", problem)
    if any(len(form.getlist(k)) > 1 for k in form):
        return _oauth_error("invalid_request", "a parameter was sent more than once")
    grant_type = form.get("grant_type")
    if not grant_type:
        return _oauth_error("invalid_request", "grant_type is required")
    if grant_type != "client_credentials":
        return _oauth_error("unsupported_grant_type", "only client_credentials is supported")
    basic = _basic_credentials()
    if basic is False:
        return _oauth_error("invalid_client", "malformed HTTP Basic credentials", 401, basic_challenge=True)
    form_id, form_secret = form.get("client_id"), form.get("client_secret")
    if basic is not None and form_secret:
        return _oauth_error("invalid_request", "use one client authentication method, not two")
    if basic is not None:
        client_id, client_secret = basic
        if form_id is not None and form_id != client_id:
            return _oauth_error("invalid_request", "client_id does not match the HTTP Basic credentials")
    else:
        client_id, client_secret = form_id, form_secret
    if not client_id or not client_secret:
        return _oauth_error("invalid_client", "client authentication is required", 401, basic_challenge=True)
    # Real ids are short; a long one is no new key. Ten wrong secrets from one address must not lock
    # the account out of its own workers elsewhere: counted per (id, address), under a higher ceiling
    # per id.
    for key in (("client-addr", client_id[:200], client_addr()), ("client", client_id[:200])):
        refused = await _throttle(key)
        if refused is not None:
            return refused
    account = await s.stores.identity.find_client(client_id)
    if account is None or not hmac.compare_digest(account["secret_hash"], digest(client_secret)):
        return _oauth_error("invalid_client", "unknown client or wrong secret", 401,
                            basic_challenge=True)
    requested = form.get("scope")
    if requested not in (None, "", "api"):
        return _oauth_error("invalid_scope", "the only scope is 'api'")
    access_token = s.access.token_signer.issue(account["id"], account["org_id"], s.clock.now())
    response = jsonify({"access_token": access_token, "token_type": "Bearer", "expires_in": TOKEN_LIFETIME,
                        "scope": "api"})
    response.headers.update(_NO_STORE)
    return response
