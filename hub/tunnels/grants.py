"""Tunnel grants, signed with the hub's Ed25519 key (the one hub/auth/oauth.py loads for JWTs).

Format (device_client/protocol.py, "Tunnels"; webrtc/grant.py reads it on the device and the CLI):
``base64url(payload JSON) + "." + base64url(Ed25519 signature over those base64url bytes)``,
unpadded, the JSON with sorted keys and no spaces. The key id ``kid`` is derived from the public key
(``hub-`` + the first 16 hex digits of SHA-256 of its 32 raw bytes), so a rotated key gets a new
kid and devices holding the old one refuse the new grants instead of misreading them.

The hub reads grants back only on renewal; ``verify`` checks the signature and the payload's shape,
not the validity window: whether a grant may still be renewed is the session's business.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from device_client.clock import rfc3339
from hub.errors import BadRequest, FleethubError

GRANT_VERSION = 1


class GrantRejected(FleethubError):
    """The hub could not sign the grant (an internal fault)."""
    status = 500
    code = "grant_rejected"


class InvalidGrant(BadRequest):
    """The grant is not one this hub signed for this session."""
    code = "invalid_grant"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise InvalidGrant("the grant is not two base64url parts") from None


def payload_time(instant: dt.datetime) -> str:
    return rfc3339(instant)


def payload(*, kid: str, sid: str, org_id: str, device_id: str, principal: str, target: str,
            not_before: dt.datetime, expires_at: dt.datetime, relay: bool, bandwidth_bps: int,
            client_fingerprint: str, device_key: str) -> dict[str, Any]:
    return {"v": GRANT_VERSION, "kid": kid, "sid": sid, "orgId": org_id, "deviceId": device_id,
            "principal": principal, "target": target, "notBefore": rfc3339(not_before),
            "expiresAt": rfc3339(expires_at), "relay": relay, "bandwidthBps": bandwidth_bps,
            "clientFingerprint": client_fingerprint, "deviceKey": device_key}


class GrantSigner:
    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.kid = "hub-" + hashlib.sha256(raw).hexdigest()[:16]
        self.public_b64 = base64.b64encode(raw).decode("ascii")

    @property
    def hub_keys(self) -> dict[str, str]:
        """What the device link sends in welcome.hubKeys."""
        return {self.kid: self.public_b64}

    def sign(self, body: dict[str, Any]) -> str:
        try:
            head = b64url(json.dumps(body, separators=(",", ":"), sort_keys=True).encode()).encode("ascii")
            return head.decode("ascii") + "." + b64url(self._key.sign(head))
        except Exception as exc:  # a key that cannot sign is our fault, never the caller's
            raise GrantRejected(f"the hub could not sign the tunnel grant ({type(exc).__name__})") from None

    def verify(self, token: Any) -> dict[str, Any]:
        """The payload of a grant this hub signed (with its current key); InvalidGrant otherwise."""
        if not isinstance(token, str) or token.count(".") != 1:
            raise InvalidGrant("the grant is not two base64url parts")
        head, sig = token.split(".")
        try:
            self._key.public_key().verify(_unb64url(sig), head.encode("ascii"))
        except (InvalidSignature, UnicodeEncodeError):
            raise InvalidGrant("the grant's signature does not verify") from None
        try:
            body = json.loads(_unb64url(head))
        except ValueError:
            raise InvalidGrant("the grant's payload is not JSON") from None
        if not isinstance(body, dict) or body.get("v") != GRANT_VERSION or body.get("kid") != self.kid:
            raise InvalidGrant("the grant is not a version 1 grant of this hub's key")
        return body
