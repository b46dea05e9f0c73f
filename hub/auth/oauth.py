"""Service-account bearer tokens: JWTs signed with the hub's Ed25519 key (EdDSA, pyjwt).

Claims: iss "fleethub", aud "fleethub-api", sub (service account id), org, scope, iat, exp (one hour).
Verification checks the signature, expiry and audience; anything else about the token is a 401.
The signing key comes from FLEETHUB_JWT_KEY (PEM) or a 0600 file in the data dir, created once.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ISSUER = "fleethub"
AUDIENCE = "fleethub-api"
TOKEN_LIFETIME = 3600


class InvalidToken(Exception):
    """The bearer token is not one this hub issued, or it expired."""


def load_or_create_key(data_dir: Path) -> Ed25519PrivateKey:
    pem = os.environ.get("FLEETHUB_JWT_KEY")
    if pem:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    else:
        path = data_dir / "jwt-ed25519.pem"
        if path.exists():
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        else:
            key = Ed25519PrivateKey.generate()
            data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("the JWT signing key must be an Ed25519 private key")
    return key


@dataclass(frozen=True)
class TokenClaims:
    service_id: uuid.UUID
    org_id: uuid.UUID
    scope: str
    expires_at: dt.datetime


class TokenSigner:
    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public_key: Ed25519PublicKey = key.public_key()

    def issue(self, service_id: uuid.UUID, org_id: uuid.UUID, now: dt.datetime, *, scope: str = "api",
              lifetime: int = TOKEN_LIFETIME, audience: str = AUDIENCE) -> str:
        claims = {"iss": ISSUER, "aud": audience, "sub": str(service_id), "org": str(org_id), "scope": scope,
                  "iat": int(now.timestamp()), "exp": int(now.timestamp()) + lifetime,
                  "jti": secrets.token_hex(8)}
        return jwt.encode(claims, self._key, algorithm="EdDSA")

    def verify(self, token: str, now: dt.datetime, *, audience: str = AUDIENCE) -> TokenClaims:
        try:
            # Time claims are checked against our Clock, not the OS clock, so tests can move time
            # (pyjwt would compare iat and nbf with the OS clock).
            claims = jwt.decode(token, self.public_key, algorithms=["EdDSA"], audience=audience, issuer=ISSUER,
                                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                                         "require": ["exp", "sub", "org", "aud"]})
            expires_at = dt.datetime.fromtimestamp(int(claims["exp"]), dt.timezone.utc)
            if expires_at <= now:
                raise InvalidToken("the access token expired")
            return TokenClaims(uuid.UUID(claims["sub"]), uuid.UUID(claims["org"]), str(claims.get("scope", "")),
                               expires_at)
        except (jwt.PyJWTError, ValueError, KeyError, TypeError):
            raise InvalidToken("the access token is invalid") from None


def looks_like_jwt(value: str) -> bool:
    return value.count(".") == 2 and value.startswith("eyJ")
