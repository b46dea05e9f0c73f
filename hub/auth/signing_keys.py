"""The hub's Ed25519 signing keys: the current key signs, the previous ones still verify.

One ring serves the three signers: service-account access tokens (hub/auth/oauth.py), tunnel and
signalling tokens (hub/tunnels/tokens.py) and tunnel grants (hub/tunnels/grants.py). Every key has a
key id derived from its public key, ``hub-`` + the first 16 hex digits of SHA-256 of its 32 raw
bytes. JWTs carry it in their header (``kid``), grants in their payload, and verification picks the
key by it, so whatever a key signed stays good until it expires, after a rotation too. A JWT without
``kid`` (issued before key ids existed) is checked against the current key.

Files in the data dir, each 0600: ``jwt-ed25519.pem`` (current), ``jwt-ed25519.previous.pem`` and
``jwt-ed25519.previous-2.pem`` (the two keys before it; older ones are dropped: nothing they signed
outlives two rotations unless rotations come faster than a token's lifetime of at most an hour).
``FLEETHUB_JWT_KEY`` (PEM) replaces the files with a ring of that one key; rotate it where it is kept.

Rotation (``fleethub admin rotate-signing-key``, ``rotate``) writes previous-2 := previous,
previous := current, current := new, each an atomic replace. A crash between two steps leaves a ring
that still holds every key that signed something (at worst one key twice, which the ring folds), and
running hubs re-read the files when PostgreSQL NOTIFY tells them (``SIGNING_KEYS_TAG``).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from storage.crypto import _write_private
from storage.private import create_private, read_private

log = logging.getLogger("fleethub.auth")
KEY_FILE = "jwt-ed25519.pem"
PREVIOUS_FILES = ("jwt-ed25519.previous.pem", "jwt-ed25519.previous-2.pem")
SIGNING_KEYS_TAG = "signing-keys"  # sent on the auth NOTIFY channel after a rotation
ENV_KEY = "FLEETHUB_JWT_KEY"


class SigningKeyError(RuntimeError):
    """The signing key is malformed, or cannot be rotated here."""


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def kid_of(public: Ed25519PublicKey) -> str:
    return "hub-" + hashlib.sha256(_raw(public)).hexdigest()[:16]


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load_pem(data: bytes) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(data, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError("the JWT signing key must be an Ed25519 private key")
    return key


def load_or_create_key(data_dir: Path) -> Ed25519PrivateKey:
    """The current key: FLEETHUB_JWT_KEY, else the key file, created once."""
    pem = os.environ.get(ENV_KEY)
    if pem:
        return _load_pem(pem.encode())
    path = data_dir / KEY_FILE
    if path.exists():
        return _load_pem(read_private(path))
    key = Ed25519PrivateKey.generate()
    data_dir.mkdir(parents=True, exist_ok=True)
    if not create_private(path, _pem(key)):  # another process of this hub (an admin command) won
        return _load_pem(read_private(path))
    return key


def load_ring(data_dir: Path) -> list[Ed25519PrivateKey]:
    """The current key first, then the previous keys that exist, newest first."""
    ring = [load_or_create_key(data_dir)]
    if not os.environ.get(ENV_KEY):
        for name in PREVIOUS_FILES:
            path = data_dir / name
            if path.exists():
                ring.append(_load_pem(read_private(path)))
    return ring


class SigningKeys:
    """The ring the signers share; ``reload`` swaps it in place so all three follow at once."""

    def __init__(self, keys: Ed25519PrivateKey | list[Ed25519PrivateKey], *,
                 reload: Callable[[], list[Ed25519PrivateKey]] | None = None) -> None:
        self._reload = reload
        self._set([keys] if isinstance(keys, Ed25519PrivateKey) else keys)

    @classmethod
    def from_data_dir(cls, data_dir: Path) -> SigningKeys:
        return cls(load_ring(data_dir), reload=lambda: load_ring(data_dir))

    @classmethod
    def of(cls, keys: SigningKeys | Ed25519PrivateKey) -> SigningKeys:
        """A ring as given, or a ring of one key (tools and tests that hold a bare key)."""
        return keys if isinstance(keys, SigningKeys) else cls(keys)

    def _set(self, keys: list[Ed25519PrivateKey]) -> None:
        if not keys:
            raise SigningKeyError("a signing key ring needs a current key")
        publics: dict[str, Ed25519PublicKey] = {}
        for key in keys:
            publics.setdefault(kid_of(key.public_key()), key.public_key())  # a key twice: a crashed rotation
        # Plain attributes, read at every signature: a swap by reload is seen by the next one.
        self.current: Any = keys[0]
        self.kid = kid_of(keys[0].public_key())
        self._publics = publics

    def reload(self) -> None:
        """Re-read the ring. It runs from a NOTIFY callback, where an exception would stop the hub: a
        ring that cannot be read is logged and the keys held so far stay in use."""
        if self._reload is None:
            return
        try:
            self._set(self._reload())
        except (OSError, ValueError, SigningKeyError) as exc:
            log.error("the signing keys could not be reloaded, still using %s: %s", self.kids, type(exc).__name__)

    @property
    def kids(self) -> list[str]:
        """Current first."""
        return list(self._publics)

    def public(self, kid: Any) -> Ed25519PublicKey | None:
        """The key with this id; ``None`` means the current key (tokens from before key ids)."""
        if kid is None:
            return self._publics[self.kid]
        return self._publics.get(kid) if isinstance(kid, str) else None

    def public_of(self, kid: Any) -> Ed25519PublicKey | None:
        """The key with this id, ``None`` for an unknown or missing id: for tokens that must name theirs."""
        return self._publics.get(kid) if isinstance(kid, str) else None

    def jwt_key(self, token: str) -> Ed25519PublicKey:
        """The key a JWT names in its header; jwt.InvalidTokenError if this hub has no such key."""
        key = self.public(jwt.get_unverified_header(token).get("kid"))
        if key is None:
            raise jwt.InvalidTokenError("signed with a key this hub does not hold")
        return key

    def sign_jwt(self, claims: dict[str, Any]) -> str:
        return jwt.encode(claims, self.current, algorithm="EdDSA", headers={"kid": self.kid})

    @property
    def hub_keys(self) -> dict[str, str]:
        """{kid: base64 raw public key}, current first: what devices verify tunnel grants with."""
        return {kid: base64.b64encode(_raw(public)).decode("ascii") for kid, public in self._publics.items()}

    def __repr__(self) -> str:
        return f"SigningKeys(kids={self.kids})"


def rotate(data_dir: Path) -> dict[str, Any]:
    """A new current key; the current one becomes the previous one. Returns the kids, current first."""
    if os.environ.get(ENV_KEY):
        raise SigningKeyError(f"the signing key comes from {ENV_KEY}; rotate it where it is kept, "
                              "not in the data dir")
    current_path = data_dir / KEY_FILE
    load_or_create_key(data_dir)  # a hub that never signed anything still gets a current key to retire
    previous, older = (data_dir / name for name in PREVIOUS_FILES)
    if previous.exists():
        _write_private(older, previous.read_bytes())
    _write_private(previous, current_path.read_bytes())
    _write_private(current_path, _pem(Ed25519PrivateKey.generate()))
    return {"rotated": True, "kids": SigningKeys(load_ring(data_dir)).kids}
