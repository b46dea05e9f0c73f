"""Secret-file contents at rest: libsodium SecretBox (XSalsa20-Poly1305) through pynacl.

The key is FLEETHUB_SECRET_KEY (32 bytes, base64) or a 0600 file in the data dir, created once.
Plaintext exists only in memory, on its way from an upload to the device; it is never logged,
audited, returned or written anywhere but the device.

Key rotation (``fleethub admin rotate-secret-key``, ``rotate``): a new key is written to
``secret-files.key.next`` first, every stored content is re-encrypted under it in one transaction,
then the new key becomes ``secret-files.key`` and the old one ``secret-files.key.previous``. A box
opens with any key of the ring (current, next, previous), so a crash at any step leaves every
content readable, and a running hub that meets a content it cannot open re-reads the ring from disk
once before it gives up — it follows a rotation done beside it without a restart.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import nacl.exceptions
import nacl.secret
import nacl.utils

from storage.private import create_private, read_private, write_private

KEY_FILE = "secret-files.key"
NEXT_FILE = "secret-files.key.next"
PREVIOUS_FILE = "secret-files.key.previous"


class SecretsKeyError(RuntimeError):
    """The secret-file key is missing, malformed, or does not open stored contents."""


def _check(key: bytes) -> bytes:
    if len(key) != nacl.secret.SecretBox.KEY_SIZE:
        raise SecretsKeyError("the secret-file key must be 32 bytes")
    return key


def _write_private(path: Path, data: bytes) -> None:
    write_private(path, data)  # one writer for every key file (storage/private.py)


def load_or_create_key(data_dir: Path) -> bytes:
    raw = os.environ.get("FLEETHUB_SECRET_KEY")
    if raw:
        return _check(base64.b64decode(raw))
    path = data_dir / KEY_FILE
    if path.exists():
        return _check(read_private(path))
    key = nacl.utils.random(nacl.secret.SecretBox.KEY_SIZE)
    data_dir.mkdir(parents=True, exist_ok=True)
    if not create_private(path, key):  # another process of this hub created it meanwhile
        return _check(read_private(path))
    return key


def load_ring(data_dir: Path) -> list[bytes]:
    """The current key first, then a rotation's next key and the previous key if present."""
    ring = [load_or_create_key(data_dir)]
    if not os.environ.get("FLEETHUB_SECRET_KEY"):
        for name in (NEXT_FILE, PREVIOUS_FILE):
            path = data_dir / name
            if path.exists():
                ring.append(_check(read_private(path)))
    return ring


class SecretBox:
    def __init__(self, keys: bytes | list[bytes], *, reload: Callable[[], list[bytes]] | None = None) -> None:
        self._set([keys] if isinstance(keys, bytes) else keys)
        self._reload = reload

    @classmethod
    def from_data_dir(cls, data_dir: Path) -> "SecretBox":
        return cls(load_ring(data_dir), reload=lambda: load_ring(data_dir))

    def _set(self, keys: list[bytes]) -> None:
        self._boxes = [nacl.secret.SecretBox(_check(k)) for k in keys]

    def reload(self) -> None:
        if self._reload is not None:
            self._set(self._reload())

    def seal(self, plaintext: bytes) -> bytes:
        return bytes(self._boxes[0].encrypt(plaintext))

    def open(self, ciphertext: bytes) -> bytes:
        for attempt in range(2):
            for box in self._boxes:
                try:
                    return box.decrypt(ciphertext)
                except nacl.exceptions.CryptoError:
                    continue
            if attempt == 0 and self._reload is not None:
                self._set(self._reload())  # rotated beside us: read the ring again, once
            else:
                break
        raise SecretsKeyError("stored secret-file contents do not open with this key")

    def __repr__(self) -> str:
        return "SecretBox(<key hidden>)"


async def rotate(data_dir: Path, reencrypt_all: Callable[[Callable[[bytes], bytes]], Awaitable[int]]) -> int:
    """Re-encrypt every stored content under a new key; returns how many were re-encrypted.

    ``reencrypt_all(convert)`` must apply ``convert`` to every stored ciphertext in one transaction."""
    if os.environ.get("FLEETHUB_SECRET_KEY"):
        raise SecretsKeyError("the key comes from FLEETHUB_SECRET_KEY; rotate it where it is kept, "
                              "not in the data dir")
    old = SecretBox(load_ring(data_dir))
    new_key = nacl.utils.random(nacl.secret.SecretBox.KEY_SIZE)
    _write_private(data_dir / NEXT_FILE, new_key)  # durable before any content depends on it
    new = SecretBox(new_key)
    count = await reencrypt_all(lambda ciphertext: new.seal(old.open(ciphertext)))
    current = (data_dir / KEY_FILE).read_bytes()
    _write_private(data_dir / PREVIOUS_FILE, current)
    _write_private(data_dir / KEY_FILE, new_key)
    (data_dir / NEXT_FILE).unlink()
    return count
