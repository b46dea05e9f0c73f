"""The two JWTs of tunnelling, EdDSA with the hub's key (DESIGN.md section 8).

- Tunnel token (``POST /v1/cli/tunnel/token``): 15 minutes, scope ``tunnel``, audience
  ``fleethub-tunnel``, subject ``user:<id>`` or ``service:<id>``, claim ``org``. Sent as
  ``Authorization: Bearer`` to the session endpoints and accepted nowhere else: the API's bearer
  check wants audience ``fleethub-api``, so elsewhere it is a 401.
- Signalling token: scope ``tunnel.signal``, audience ``fleethub-tunnel-signal``, subject the
  session id; good for the session's current grant window (a renewal hands out a new one). It opens
  ``GET /v1/cli/tunnel/session/{sid}/signal`` for that session only.

Both are signed by the hub's signing key ring (hub/auth/signing_keys.py) and carry its ``kid``, so
they outlive a key rotation until they expire.
"""

from __future__ import annotations

import datetime as dt
import secrets
import uuid
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hub.auth.oauth import ISSUER, InvalidToken, decode_claims
from hub.auth.signing_keys import SigningKeys

TUNNEL_AUDIENCE = "fleethub-tunnel"
SIGNAL_AUDIENCE = "fleethub-tunnel-signal"
TUNNEL_TOKEN_LIFETIME = 15 * 60


class BadTunnelToken(Exception):
    """Not a token of this kind that this hub issued, or expired."""


@dataclass(frozen=True)
class TunnelClaims:
    kind: str              # user | service
    subject_id: uuid.UUID  # the user or the service account
    org_id: uuid.UUID
    credential: str        # the public id of the credential the token was made with (audit)
    expires_at: dt.datetime

    @property
    def principal(self) -> str:
        return f"{self.kind}:{self.subject_id}"


class TunnelTokens:
    def __init__(self, keys: SigningKeys | Ed25519PrivateKey) -> None:
        self.keys = SigningKeys.of(keys)

    def _encode(self, claims: dict, now: dt.datetime, lifetime: float) -> tuple[str, dt.datetime]:
        expires_at = now + dt.timedelta(seconds=lifetime)
        body = {"iss": ISSUER, "iat": int(now.timestamp()), "exp": int(expires_at.timestamp()),
                "jti": secrets.token_hex(8), **claims}
        return self.keys.sign_jwt(body), dt.datetime.fromtimestamp(body["exp"], dt.timezone.utc)

    def _decode(self, token: str, audience: str, now: dt.datetime) -> dict:
        # hub/auth/oauth.py decode_claims: any fault of the token is InvalidToken, exp a sane int
        try:
            claims = decode_claims(self.keys, token, audience, ["exp", "sub", "org", "aud", "scope"], "tunnel token")
        except InvalidToken as exc:
            raise BadTunnelToken(str(exc)) from None
        if claims["exp"] <= now.timestamp():
            raise BadTunnelToken("the tunnel token expired")
        return claims

    def issue(self, kind: str, subject_id: uuid.UUID, org_id: uuid.UUID, credential: str,
              now: dt.datetime) -> tuple[str, dt.datetime]:
        return self._encode({"aud": TUNNEL_AUDIENCE, "sub": f"{kind}:{subject_id}", "org": str(org_id),
                             "scope": "tunnel", "cred": credential}, now, TUNNEL_TOKEN_LIFETIME)

    def verify(self, token: str, now: dt.datetime) -> TunnelClaims:
        claims = self._decode(token, TUNNEL_AUDIENCE, now)
        try:
            kind, _, sid = str(claims["sub"]).partition(":")
            if claims["scope"] != "tunnel" or kind not in ("user", "service"):
                raise ValueError
            return TunnelClaims(kind, uuid.UUID(sid), uuid.UUID(claims["org"]), str(claims.get("cred", "")),
                                dt.datetime.fromtimestamp(claims["exp"], dt.timezone.utc))
        except Exception:  # a claim of the wrong type or shape: the caller's input, a 401
            raise BadTunnelToken("the tunnel token is invalid") from None

    def issue_signal(self, sid: uuid.UUID, org_id: uuid.UUID, now: dt.datetime,
                     expires_at: dt.datetime) -> str:
        lifetime = max(1.0, (expires_at - now).total_seconds())
        return self._encode({"aud": SIGNAL_AUDIENCE, "sub": str(sid), "org": str(org_id),
                             "scope": "tunnel.signal"}, now, lifetime)[0]

    def verify_signal(self, token: str, sid: uuid.UUID, now: dt.datetime) -> uuid.UUID:
        """The organisation of the session ``sid`` this token opens; BadTunnelToken otherwise."""
        claims = self._decode(token, SIGNAL_AUDIENCE, now)
        if claims["scope"] != "tunnel.signal" or claims["sub"] != str(sid):
            raise BadTunnelToken("the signalling token is for another session")
        try:
            return uuid.UUID(claims["org"])
        except Exception:  # not a uuid string, of any type
            raise BadTunnelToken("the signalling token is invalid") from None
