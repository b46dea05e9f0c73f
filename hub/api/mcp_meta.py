"""The OAuth metadata an MCP client reads after a 401 from /v1/mcp (the MCP authorization spec).

``/.well-known/oauth-protected-resource`` (RFC 9728) names /v1/mcp as the resource and the hub as its
authorization server; ``/.well-known/oauth-authorization-server`` (RFC 8414) points at the hub's
existing token endpoint, POST /v1/oauth/token, which grants service accounts client-credentials
tokens with scope ``api``. A PAT in its bearer form needs no grant: it is sent as it is.
"""

from __future__ import annotations

from pydantic import BaseModel
from quart import Blueprint, request

from hub.api.validation import responds
from hub.auth.routes import public
from hub.mcp.endpoint import METADATA_PATH, PATH

bp = Blueprint("mcp_meta", __name__)


class ProtectedResource(BaseModel):
    resource: str
    authorization_servers: list[str]
    scopes_supported: list[str]
    bearer_methods_supported: list[str]
    resource_name: str
    resource_documentation: str


class AuthorizationServer(BaseModel):
    issuer: str
    token_endpoint: str
    grant_types_supported: list[str]
    token_endpoint_auth_methods_supported: list[str]
    scopes_supported: list[str]
    response_types_supported: list[str]


def _base() -> str:
    return f"{request.scheme}://{request.host}"


@bp.get(METADATA_PATH)
@public
@responds(ProtectedResource)
async def protected_resource():
    """The MCP server's protected-resource metadata (RFC 9728): /v1/mcp and its authorization server."""
    base = _base()
    return {"resource": base + PATH, "authorization_servers": [base], "scopes_supported": ["api"],
            "bearer_methods_supported": ["header"], "resource_name": "fleethub MCP server",
            "resource_documentation": base + "/v1/docs"}


@bp.get("/.well-known/oauth-authorization-server")
@public
@responds(AuthorizationServer)
async def authorization_server():
    """The hub as an OAuth authorization server (RFC 8414): its token endpoint, client credentials only."""
    base = _base()
    return {"issuer": base, "token_endpoint": base + "/v1/oauth/token", "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "scopes_supported": ["api"], "response_types_supported": []}
