"""Service-account bearer tokens: JWTs signed with the hub's Ed25519 key (EdDSA, pyjwt).

Claims: iss "fleethub", aud "fleethub-api", sub (service account id), org, scope, iat, exp (one hour).
Verification checks the signature, expiry, not-before and audience; anything else about the token is a
401. The scope (``api``) and that the account still belongs to ``org`` are checked by the middleware.
The keys are the hub's signing key ring (hub/auth/signing_keys.py): the header's ``kid`` picks the
key, so tokens issued before a key rotation stay good until they expire.
"""

from __future__ import annotations

import datetime as dt
import secrets
import uuid
from dataclasses import dataclass

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hub.auth.signing_keys import SigningKeys, load_or_create_key

__all__ = ["AUDIENCE", "ISSUER", "InvalidToken", "TokenClaims", "TokenSigner", "load_or_create_key",
           "looks_like_jwt"]  # load_or_create_key: where tools and tests have always found it

ISSUER = "fleethub"
AUDIENCE = "fleethub-api"
TOKEN_LIFETIME = 3600


class InvalidToken(Exception):
    """The bearer token is not one this hub issued, or it expired."""


@dataclass(frozen=True)
class TokenClaims:
    service_id: uuid.UUID
    org_id: uuid.UUID
    scope: str
    expires_at: dt.datetime


class TokenSigner:
    def __init__(self, keys: SigningKeys | Ed25519PrivateKey) -> None:
        self.keys = SigningKeys.of(keys)

    def issue(self, service_id: uuid.UUID, org_id: uuid.UUID, now: dt.datetime, *, scope: str = "api",
              lifetime: int = TOKEN_LIFETIME, audience: str = AUDIENCE) -> str:
        claims = {"iss": ISSUER, "aud": audience, "sub": str(service_id), "org": str(org_id), "scope": scope,
                  "iat": int(now.timestamp()), "exp": int(now.timestamp()) + lifetime,
                  "jti": secrets.token_hex(8)}
        return self.keys.sign_jwt(claims)

    def verify(self, token: str, now: dt.datetime, *, audience: str = AUDIENCE) -> TokenClaims:
        try:
            # Time claims are checked against our Clock, not the OS clock, so tests can move time
            # (pyjwt would compare iat and nbf with the OS clock).
            claims = jwt.decode(token, self.keys.jwt_key(token), algorithms=["EdDSA"], audience=audience,
                                issuer=ISSUER, options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                                         "require": ["exp", "sub", "org", "aud"]})
            expires_at = dt.datetime.fromtimestamp(int(claims["exp"]), dt.timezone.utc)
            if expires_at <= now:
                raise InvalidToken("the access token expired")
            if "nbf" in claims and float(claims["nbf"]) > now.timestamp():
                raise InvalidToken("the access token is not valid yet")
            return TokenClaims(uuid.UUID(claims["sub"]), uuid.UUID(claims["org"]), str(claims.get("scope", "")),
                               expires_at)
        except (jwt.PyJWTError, ValueError, KeyError, TypeError):
            raise InvalidToken("the access token is invalid") from None


def looks_like_jwt(value: str) -> bool:
    return value.count(".") == 2 and value.startswith("eyJ")
