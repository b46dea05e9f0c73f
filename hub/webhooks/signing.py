"""Standard Webhooks signatures (https://www.standardwebhooks.com): a ``whsec_`` secret of 32 random
bytes in base64, and ``webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">``.
Receivers verify with any Standard Webhooks library (the tests use the ``standardwebhooks`` package);
docs/events.md shows three lines of Python and of Node."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix(PREFIX))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(secret, msg_id, timestamp, body),
            "content-type": "application/json", "user-agent": "fleethub-webhooks/1"}
