"""Tunnel grants: the hub's signed permission for one tunnel session (device_client/protocol.py, "Tunnels").

A grant is ``base64url(payload JSON) + "." + base64url(Ed25519 signature over the first part's ASCII
bytes)``, unpadded. The device trusts a grant only when its ``kid`` names a key the hub sent in
``welcome.hubKeys``, the signature checks out under that key, and ``now`` lies in [notBefore,
expiresAt). Who the grant is for (deviceId, deviceKey, the offer's DTLS fingerprint) is checked by
``check_for_device``, so the same parse serves the CLI, which only reads its own grant.

Pure: no IO, no clock; time is the ``now`` argument.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, Mapping

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

GRANT_VERSION = 1
# A device clock a little ahead of the hub's must not refuse a grant minted a moment ago.
NOT_BEFORE_SKEW = dt.timedelta(seconds=30)
_FIELDS = ("kid", "sid", "orgId", "deviceId", "principal", "target", "notBefore", "expiresAt",
           "relay", "bandwidthBps", "clientFingerprint", "deviceKey")


class GrantError(ValueError):
    """The grant is not one this party may act on; ``code`` is the reply error code."""

    def __init__(self, reason: str, code: str = "invalid_grant") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True)
class Grant:
    token: str  # the grant as it travels, to hand back to the hub on renewal
    kid: str
    sid: str
    org_id: str
    device_id: str
    principal: str
    target: str
    not_before: dt.datetime
    expires_at: dt.datetime
    relay: bool
    bandwidth_bps: int | None  # bytes per second, each direction; None or 0: unlimited
    client_fingerprint: str
    device_key: str
    payload: Mapping[str, Any]


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    if not isinstance(text, str) or not text:
        raise GrantError("grant is not two base64url parts")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise GrantError("grant is not two base64url parts") from None


def parse_time(value: Any, name: str) -> dt.datetime:
    if not isinstance(value, str):
        raise GrantError(f"grant {name} is not an RFC 3339 time")
    try:
        instant = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise GrantError(f"grant {name} is not an RFC 3339 time") from None
    if instant.tzinfo is None:
        raise GrantError(f"grant {name} has no time zone")
    return instant


def sign_grant(payload: Mapping[str, Any], signing_key: SigningKey) -> str:
    """Sign ``payload`` (which names its own ``kid``). The hub signs with its key; tests sign their own."""
    head = b64url(json.dumps(dict(payload), separators=(",", ":"), sort_keys=True).encode()).encode("ascii")
    return head.decode("ascii") + "." + b64url(signing_key.sign(head).signature)


def parse_grant(token: str, hub_keys: Mapping[str, str], *, now: dt.datetime) -> Grant:
    """Check the signature against ``hub_keys`` ({kid: base64 Ed25519 public key}) and the validity
    window at ``now``; raise GrantError (code invalid_grant) for anything wrong."""
    if not isinstance(token, str) or token.count(".") != 1:
        raise GrantError("grant is not two base64url parts")
    head, sig = token.split(".")
    raw = _unb64url(head)
    signature = _unb64url(sig)
    try:
        payload = json.loads(raw)
    except ValueError:
        raise GrantError("grant payload is not JSON") from None
    if not isinstance(payload, dict):
        raise GrantError("grant payload is not an object")
    kid = payload.get("kid")
    encoded_key = hub_keys.get(kid) if isinstance(kid, str) else None
    if encoded_key is None:
        raise GrantError(f"grant signed with an unknown key {kid!r}")
    try:
        VerifyKey(base64.b64decode(encoded_key)).verify(head.encode("ascii"), signature)
    except (BadSignatureError, ValueError, binascii.Error):
        raise GrantError("grant signature does not verify") from None
    if payload.get("v") != GRANT_VERSION:
        raise GrantError(f"grant version {payload.get('v')!r} is not {GRANT_VERSION}")
    missing = [name for name in _FIELDS if name not in payload]
    if missing:
        raise GrantError(f"grant lacks {', '.join(missing)}")
    not_before = parse_time(payload["notBefore"], "notBefore")
    expires_at = parse_time(payload["expiresAt"], "expiresAt")
    if now + NOT_BEFORE_SKEW < not_before:
        raise GrantError("grant is not valid yet")
    if now >= expires_at:
        raise GrantError("grant has expired")
    bandwidth = payload["bandwidthBps"]
    if bandwidth is not None and (not isinstance(bandwidth, int) or isinstance(bandwidth, bool) or bandwidth < 0):
        raise GrantError("grant bandwidthBps is not a non-negative integer")
    for name in ("sid", "orgId", "deviceId", "principal", "target", "clientFingerprint", "deviceKey"):
        if not isinstance(payload[name], str):
            raise GrantError(f"grant {name} is not a string")
    return Grant(token=token, kid=kid, sid=payload["sid"], org_id=payload["orgId"],
                 device_id=payload["deviceId"], principal=payload["principal"], target=payload["target"],
                 not_before=not_before, expires_at=expires_at, relay=bool(payload["relay"]),
                 bandwidth_bps=bandwidth or None, client_fingerprint=payload["clientFingerprint"],
                 device_key=payload["deviceKey"], payload=payload)


def check_for_device(grant: Grant, *, device_id: str | None, device_key: str | None,
                     offer_fingerprints: list[str] | None = None) -> None:
    """The device's own checks: the grant names this device and its tunnel key, and (for an
    offer) the offer's DTLS certificate is the one the hub saw in the CLI's offer."""
    from .sdp import normalise_fingerprint

    if device_id is None or grant.device_id != device_id:
        raise GrantError("grant is for another device")
    if device_key is not None and grant.device_key != device_key:
        raise GrantError("grant is for another tunnel identity")
    if offer_fingerprints is not None:
        wanted = normalise_fingerprint(grant.client_fingerprint)
        if wanted not in offer_fingerprints:
            raise GrantError("the offer's DTLS fingerprint is not the grant's clientFingerprint")


def same_session(current: Grant, renewed: Grant) -> None:
    """A renewal is the same grant with a new validity window: same session, parties and keys."""
    for name in ("sid", "orgId", "deviceId", "principal", "target", "relay", "clientFingerprint", "deviceKey"):
        if current.payload.get(name) != renewed.payload.get(name):
            raise GrantError(f"renewed grant changes {name}")
    if renewed.expires_at <= current.expires_at:
        raise GrantError("renewed grant does not extend the session")
