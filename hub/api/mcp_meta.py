"""The OAuth metadata an MCP client reads after a 401 from /v1/mcp (the MCP authorization spec).

``/.well-known/oauth-protected-resource`` (RFC 9728) names /v1/mcp as the resource and the hub as its
authorization server; ``/.well-known/oauth-authorization-server`` (RFC 8414) points at the hub's
existing token endpoint, POST /v1/oauth/token, which grants service accounts client-credentials
tokens with scope ``api``. A PAT in its bearer form needs no grant: it is sent as it is.
"""

from __future__ import annotations

from quart import Blueprint, request

from hub.auth.middleware import public
from hub.mcp.endpoint import METADATA_PATH, PATH

bp = Blueprint("mcp_meta", __name__)


def _base() -> str:
    return f"{request.scheme}://{request.host}"


@bp.get(METADATA_PATH)
@public
async def protected_resource():
    base = _base()
    return {"resource": base + PATH, "authorization_servers": [base], "scopes_supported": ["api"],
            "bearer_methods_supported": ["header"], "resource_name": "fleethub MCP server",
            "resource_documentation": base + "/v1/docs"}


@bp.get("/.well-known/oauth-authorization-server")
@public
async def authorization_server():
    base = _base()
    return {"issuer": base, "token_endpoint": base + "/v1/oauth/token", "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "scopes_supported": ["api"], "response_types_supported": []}
