"""Secret-file contents at rest: libsodium SecretBox (XSalsa20-Poly1305) through pynacl.

The key is FLEETHUB_SECRET_KEY (32 bytes, base64) or a 0600 file in the data dir, created once.
Plaintext exists only in memory, on its way from an upload to the device; it is never logged,
audited, returned or written anywhere but the device.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import nacl.exceptions
import nacl.secret
import nacl.utils


class SecretsKeyError(RuntimeError):
    """The secret-file key is missing, malformed, or does not open stored contents."""


def load_or_create_key(data_dir: Path) -> bytes:
    raw = os.environ.get("FLEETHUB_SECRET_KEY")
    if raw:
        key = base64.b64decode(raw)
    else:
        path = data_dir / "secret-files.key"
        if path.exists():
            key = path.read_bytes()
        else:
            key = nacl.utils.random(nacl.secret.SecretBox.KEY_SIZE)
            data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
    if len(key) != nacl.secret.SecretBox.KEY_SIZE:
        raise SecretsKeyError("the secret-file key must be 32 bytes")
    return key


class SecretBox:
    def __init__(self, key: bytes) -> None:
        self._box = nacl.secret.SecretBox(key)

    def seal(self, plaintext: bytes) -> bytes:
        return bytes(self._box.encrypt(plaintext))

    def open(self, ciphertext: bytes) -> bytes:
        try:
            return self._box.decrypt(ciphertext)
        except nacl.exceptions.CryptoError:
            raise SecretsKeyError("stored secret-file contents do not open with this key") from None

    def __repr__(self) -> str:
        return "SecretBox(<key hidden>)"
