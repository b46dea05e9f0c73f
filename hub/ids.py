"""Identifiers that need to be unique, not secret: request ids and audit row ids.

``uuid.uuid4()`` reads the OS random source on every call, which showed up at 5% of the hub's time
under load (bench/http_ratio.py with py-spy). These come from a PRNG seeded once from the OS; never
use them for anything an attacker must not guess (tokens, secrets and session ids use ``secrets``).
"""

from __future__ import annotations

import random
import secrets
import uuid

_random = random.Random(secrets.randbits(128))
# RFC 4122 version 4: the version nibble 0100 and the variant bits 10, as uuid.UUID(version=4) sets them
_KEEP = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_SET = (4 << 76) | (0x8000 << 48)
_new = object.__new__
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown


def fast_uuid4() -> uuid.UUID:
    # UUID(int=..., version=4) checks its arguments and the range on every call; two are made per
    # request (its id and its audit row's), so the bits are set here and the object built directly,
    # as uuid.UUID.__init__ stores them (tests/machines/test_ids.py holds the two equal).
    u = _new(uuid.UUID)
    _set(u, "int", (_random.getrandbits(128) & _KEEP) | _SET)
    _set(u, "is_safe", _UNKNOWN)
    return u
