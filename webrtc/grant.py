"""Tunnel grants: the hub's signed permission for one tunnel session (device_client/shared/protocol.py, "Tunnels").

A grant is a JWT (RFC 7519, compact JWS) signed with Ed25519 (``alg: EdDSA``) by a key of the hub's
signing ring, whose id is the header's ``kid``. Its claims are the session's fields (``sid``, ``orgId``,
``deviceId``, ``principal``, ``target``, ``relay``, ``bandwidthBps``, ``clientFingerprint``,
``deviceKey``), ``v`` (the claim set's version), ``iss`` = ``fleethub``, ``aud`` = ``fleethub:tunnel-grant``
(so no other token of the same ring passes for a grant, nor a grant for another token) and the validity
window as NumericDate ``nbf`` and ``exp`` (seconds since the epoch, millisecond fractions). Any JWT library
with EdDSA verifies one; this module is what the device and the CLI use, and the hub signs with it.

In code a grant's fields travel as a *payload* dict: the claims with ``kid`` beside them and the window as
RFC 3339 ``notBefore`` / ``expiresAt`` (how the hub stores a session's grant). ``to_claims`` and
``from_claims`` are the one translation between the two.

The device trusts a grant only when its ``kid`` names a key the hub sent in ``welcome.hubKeys``, the
signature checks out under that key, and ``now`` lies in [notBefore, expiresAt). Who the grant is for
(deviceId, deviceKey, the offer's DTLS fingerprint) is checked by ``check_for_device``, so the same parse
serves the CLI, which only reads its own grant.

Pure: no IO, no clock; time is the ``now`` argument (pyjwt's own time checks are off for that reason).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Mapping

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from device_client.shared.timestamps import parse_rfc3339, rfc3339

GRANT_VERSION = 2  # 1 was the hand-rolled "payload.signature" format before grants were JWTs
ISSUER = "fleethub"
AUDIENCE = "fleethub:tunnel-grant"
# A device clock a little ahead of the hub's must not refuse a grant minted a moment ago.
NOT_BEFORE_SKEW = dt.timedelta(seconds=30)
_FIELDS = ("kid", "sid", "orgId", "deviceId", "principal", "target", "notBefore", "expiresAt",
           "relay", "bandwidthBps", "clientFingerprint", "deviceKey")
_WINDOW = {"notBefore": "nbf", "expiresAt": "exp"}
_REGISTERED = ("iss", "aud", "iat", "nbf", "exp")


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


def parse_time(value: Any, name: str) -> dt.datetime:
    if not isinstance(value, str):
        raise GrantError(f"grant {name} is not an RFC 3339 time")
    try:
        return parse_rfc3339(value)
    except ValueError:
        raise GrantError(f"grant {name} is not an RFC 3339 time with its zone") from None


def to_claims(payload: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(kid, JWT claims) of a payload: the window as NumericDate, ``kid`` for the header."""
    claims = {k: v for k, v in payload.items() if k != "kid" and k not in _WINDOW}
    for name, claim in _WINDOW.items():
        if name in payload:
            claims[claim] = round(parse_time(payload[name], name).timestamp(), 3)
    claims.update(iss=ISSUER, aud=AUDIENCE)
    return payload.get("kid"), claims


def from_claims(kid: Any, claims: Mapping[str, Any]) -> dict[str, Any]:
    """The payload of verified claims: what ``to_claims`` was given."""
    payload: dict[str, Any] = {k: v for k, v in claims.items() if k not in _REGISTERED}
    payload["kid"] = kid
    for name, claim in _WINDOW.items():
        value = claims.get(claim)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise GrantError(f"grant {claim} is not a NumericDate")
        try:
            payload[name] = rfc3339(dt.datetime.fromtimestamp(value, dt.timezone.utc))
        except (OverflowError, OSError, ValueError):
            raise GrantError(f"grant {claim} is out of range") from None
    return payload


def _private(key: Any) -> Ed25519PrivateKey:
    if isinstance(key, Ed25519PrivateKey):
        return key
    return Ed25519PrivateKey.from_private_bytes(bytes(key))  # a PyNaCl SigningKey: its 32-byte seed


def sign_grant(payload: Mapping[str, Any], signing_key: Any) -> str:
    """Sign ``payload`` (which names its own ``kid``) as a JWT. The hub signs with its ring's current
    key (hub/tunnels/grants.py); tests sign their own (an Ed25519 key, cryptography's or PyNaCl's)."""
    kid, claims = to_claims(payload)
    return jwt.encode(claims, _private(signing_key), algorithm="EdDSA", headers={"kid": kid, "typ": "JWT"})


def verify_grant(token: Any, key_for: Callable[[Any], Ed25519PublicKey | None]) -> dict[str, Any]:
    """The payload of a grant whose header ``kid`` names a key ``key_for`` knows and whose signature,
    issuer, audience and version check out; GrantError otherwise. The window is not checked here: the
    device checks it against its ``now`` (``parse_grant``), the hub's renewal does its own."""
    if not isinstance(token, str) or token.count(".") != 2:
        raise GrantError("grant is not a JWT (three base64url parts)")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise GrantError("grant is not a JWT (three base64url parts)") from None
    kid = header.get("kid")
    key = key_for(kid) if isinstance(kid, str) else None
    if key is None:
        raise GrantError(f"grant signed with an unknown key {kid!r}")
    try:
        claims = jwt.decode(token, key, algorithms=["EdDSA"], audience=AUDIENCE, issuer=ISSUER,
                            options={"verify_exp": False, "verify_nbf": False, "verify_iat": False,
                                     "require": ["iss", "aud", "nbf", "exp"]})
    except jwt.InvalidSignatureError:
        raise GrantError("grant signature does not verify") from None
    except jwt.MissingRequiredClaimError as exc:
        raise GrantError(f"grant lacks {exc.claim}") from None
    except (jwt.InvalidAudienceError, jwt.InvalidIssuerError):
        raise GrantError("the token is not a tunnel grant (issuer or audience)") from None
    except (jwt.PyJWTError, ValueError, RecursionError):
        raise GrantError("grant is not a JWT (three base64url parts)") from None
    if claims.get("v") != GRANT_VERSION:
        raise GrantError(f"grant version {claims.get('v')!r} is not {GRANT_VERSION}")
    return from_claims(kid, claims)


def read_unverified(token: Any) -> dict[str, Any]:
    """The payload of a grant without checking its signature: only for the CLI reading the grant the
    hub just handed it over TLS (its expiry), never to decide anything on the device."""
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except (jwt.PyJWTError, ValueError, TypeError, RecursionError):
        raise GrantError("grant is not a JWT (three base64url parts)") from None
    return from_claims(header.get("kid"), claims)


def _public_from(hub_keys: Mapping[str, str]) -> Callable[[Any], Ed25519PublicKey | None]:
    def key_for(kid: Any) -> Ed25519PublicKey | None:
        encoded = hub_keys.get(kid)
        if encoded is None:
            return None
        try:
            return Ed25519PublicKey.from_public_bytes(base64.b64decode(encoded))
        except (ValueError, binascii.Error):
            return None
    return key_for


def parse_grant(token: str, hub_keys: Mapping[str, str], *, now: dt.datetime) -> Grant:
    """Check the signature against ``hub_keys`` ({kid: base64 Ed25519 public key}) and the validity
    window at ``now``; raise GrantError (code invalid_grant) for anything wrong."""
    payload = verify_grant(token, _public_from(hub_keys))
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
    return Grant(token=token, kid=payload["kid"], sid=payload["sid"], org_id=payload["orgId"],
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
