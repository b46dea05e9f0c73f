"""Personal API tokens: public id ``pat_…``, a random 256-bit secret shown once, stored as SHA-256.

Both header forms of DESIGN.md section 8 are accepted: X-API-Token-ID + X-API-Secret-Key (the id must
match the secret's token), or ``Authorization: Bearer <secret>``. Device tokens use the same hashing.
"""

from __future__ import annotations

import hashlib
import secrets


def cli_safe_secret(nbytes: int = 32) -> str:
    """A URL-safe random secret that never starts with "-": one that did (1 in 64) would be taken
    for an option when passed as ``--pat-secret SECRET`` on a command line."""
    while True:
        secret = secrets.token_urlsafe(nbytes)
        if not secret.startswith("-"):
            return secret


def new_pat() -> tuple[str, str]:
    return "pat_" + secrets.token_urlsafe(12), cli_safe_secret()


def new_device_token() -> str:
    return "dev_" + secrets.token_urlsafe(32)


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()
