"""ICE servers for a session: STUN URLs, and TURN with short-lived credentials when the organisation
may use the relay and the deployment has a TURN server.

TURN REST shared-secret credentials, as coturn's ``--use-auth-secret --static-auth-secret=S``
checks them: username ``"<unix expiry>:<principal>"``, password ``base64(HMAC-SHA1(S, username))``.
The secret never leaves the hub; a credential is good until its expiry (the session's grant window,
renewals hand out fresh ones).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
from typing import Any


def credential(secret: str, principal: str, expires_at: dt.datetime) -> tuple[str, str]:
    username = f"{int(expires_at.timestamp())}:{principal}"
    password = base64.b64encode(hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()).decode()
    return username, password


def ice_servers(*, stun_urls: tuple[str, ...], turn_urls: tuple[str, ...], turn_secret: str | None,
                relay: bool, principal: str, expires_at: dt.datetime) -> list[dict[str, Any]]:
    """RTCIceServer-shaped dicts: {urls, username?, credential?}."""
    servers: list[dict[str, Any]] = [{"urls": list(stun_urls)}] if stun_urls else []
    if relay and turn_urls and turn_secret:
        username, password = credential(turn_secret, principal, expires_at)
        servers.append({"urls": list(turn_urls), "username": username, "credential": password})
    return servers
