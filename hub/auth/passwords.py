"""Passwords are stored as argon2id hashes (libsodium through pynacl), never in clear."""

from __future__ import annotations

import nacl.exceptions
import nacl.pwhash


def hash_password(password: str) -> str:
    return nacl.pwhash.argon2id.str(password.encode(), opslimit=nacl.pwhash.argon2id.OPSLIMIT_INTERACTIVE,
                                    memlimit=nacl.pwhash.argon2id.MEMLIMIT_INTERACTIVE).decode()


def verify_password(stored: str | None, password: str) -> bool:
    if not stored:
        return False
    try:
        return nacl.pwhash.verify(stored.encode(), password.encode())
    except nacl.exceptions.InvalidkeyError:
        return False
