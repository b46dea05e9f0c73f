"""POST /v1/oauth/token: the OAuth 2.0 client-credentials grant (RFC 6749 section 4.4).

Client authentication by HTTP Basic (section 2.3.1, the form every client library uses by default)
or by client_id/client_secret in the form body — not both. Errors are RFC 6749 section 5.2 bodies
``{"error", "error_description"}``, not our general error body: standard clients parse them.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from urllib.parse import unquote_plus

from pydantic import BaseModel
from quart import Blueprint, jsonify, request
from quart_schema import DataSource, document_request, document_response

from hub.api.common import services
from hub.auth.middleware import public
from hub.auth.oauth import TOKEN_LIFETIME
from hub.auth.pat import digest

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
    return unquote_plus(client_id), unquote_plus(secret)


@bp.post("/token")
@public
@document_request(TokenRequest, source=DataSource.FORM)
@document_response(TokenResponse, 200)
@document_response(OAuthErrorBody, 400)
@document_response(OAuthErrorBody, 401)
async def token():
    s = services()
    mimetype = request.mimetype
    if mimetype != "application/x-www-form-urlencoded":
        return _oauth_error("invalid_request", "the body must be application/x-www-form-urlencoded")
    form = await request.form
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
    account = await s.identity.find_client(client_id)
    if account is None or not hmac.compare_digest(account["secret_hash"], digest(client_secret)):
        return _oauth_error("invalid_client", "unknown client or wrong secret", 401,
                            basic_challenge=True)
    requested = form.get("scope")
    if requested not in (None, "", "api"):
        return _oauth_error("invalid_scope", "the only scope is 'api'")
    access_token = s.token_signer.issue(account["id"], account["org_id"], s.clock.now())
    response = jsonify({"access_token": access_token, "token_type": "Bearer", "expires_in": TOKEN_LIFETIME,
                        "scope": "api"})
    response.headers.update(_NO_STORE)
    return response
