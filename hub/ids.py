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


def fast_uuid4() -> uuid.UUID:
    return uuid.UUID(int=_random.getrandbits(128), version=4)
