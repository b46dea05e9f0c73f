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

__all__ = ["AUDIENCE", "ISSUER", "InvalidToken", "TokenClaims", "TokenSigner", "decode_claims",
           "load_or_create_key", "looks_like_jwt"]  # load_or_create_key: where tools and tests have always found it

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
        claims = decode_claims(self.keys, token, audience, ["exp", "sub", "org", "aud"], "access token")
        expires_at = dt.datetime.fromtimestamp(claims["exp"], dt.timezone.utc)
        if expires_at <= now:
            raise InvalidToken("the access token expired")
        if "nbf" in claims and claims["nbf"] > now.timestamp():
            raise InvalidToken("the access token is not valid yet")
        try:
            return TokenClaims(uuid.UUID(claims["sub"]), uuid.UUID(claims["org"]), str(claims.get("scope", "")),
                               expires_at)
        except Exception:  # a subject that is not a uuid string, of any type: the caller's input
            raise InvalidToken("the access token is invalid") from None


# The last second a datetime can hold (9999-12-31T23:59:59Z); an exp of 1e30 was a 500.
MAX_TIMESTAMP = 253_402_300_799


def _timestamp(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_TIMESTAMP:
        raise ValueError("a time claim is not a timestamp")
    return int(value)


def decode_claims(keys: SigningKeys, token: str, audience: str, require: list[str], what: str) -> dict:
    """The verified claims of a JWT this hub signed, with ``exp``, ``iat`` and ``nbf`` as int
    timestamps a datetime can hold; InvalidToken for anything else. A token is the caller's input:
    whatever is wrong with it (a header nested 1,000 deep, an exp of 1e30, a claim of the wrong
    type) is a 401, never a 500 — hence the catch-all."""
    try:
        # Time claims are checked by the callers against our Clock, not the OS clock, so tests can
        # move time (pyjwt would compare exp, iat and nbf with the OS clock).
        claims = jwt.decode(token, keys.jwt_key(token), algorithms=["EdDSA"], audience=audience, issuer=ISSUER,
                            options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                                     "require": require})
        for name in ("exp", "iat", "nbf"):
            if name in claims:
                claims[name] = _timestamp(claims[name])
        return claims
    except Exception:
        raise InvalidToken(f"the {what} is invalid") from None


def looks_like_jwt(value: str) -> bool:
    return value.count(".") == 2 and value.startswith("eyJ")
