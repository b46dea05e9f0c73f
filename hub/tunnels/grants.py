"""Tunnel grants, signed with the hub's signing key ring (hub/auth/signing_keys.py, also the JWTs').

Format (device_client/shared/protocol.py, "Tunnels"): a JWT signed with EdDSA whose header ``kid`` names the
signing key (``hub-`` + the first 16 hex digits of SHA-256 of its 32 raw bytes); webrtc/grant.py holds the
claims, the one translation between them and the payload dict kept here, and the device's and CLI's
checks. Devices verify with the keys of
``welcome.hubKeys`` (current and previous keys); after a rotation the hub pushes the new set with the
``link.keys`` command (``push_hub_keys``), so connected devices accept grants of the new key at once
and grants signed before the rotation still verify.

The hub reads grants back only on renewal; ``verify`` checks the signature and the payload's shape,
not the validity window: whether a grant may still be renewed is the session's business.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from device_client.shared.clock import rfc3339
from hub.auth.signing_keys import SigningKeys
from hub.errors import BadRequest, FleethubError
from webrtc.grant import GRANT_VERSION, GrantError, sign_grant, verify_grant

if TYPE_CHECKING:
    from hub.services import Services

log = logging.getLogger("fleethub.tunnels")


class GrantRejected(FleethubError):
    """The hub could not sign the grant (an internal fault)."""
    status = 500
    code = "grant_rejected"


class InvalidGrant(BadRequest):
    """The grant is not one this hub signed for this session."""
    code = "invalid_grant"


def payload_time(instant: dt.datetime) -> str:
    return rfc3339(instant)


def payload(*, kid: str, sid: str, org_id: str, device_id: str, principal: str, target: str,
            not_before: dt.datetime, expires_at: dt.datetime, relay: bool, bandwidth_bps: int,
            client_fingerprint: str, device_key: str) -> dict[str, Any]:
    return {"v": GRANT_VERSION, "kid": kid, "sid": sid, "orgId": org_id, "deviceId": device_id,
            "principal": principal, "target": target, "notBefore": rfc3339(not_before),
            "expiresAt": rfc3339(expires_at), "relay": relay, "bandwidthBps": bandwidth_bps,
            "clientFingerprint": client_fingerprint, "deviceKey": device_key}


class GrantSigner:
    def __init__(self, keys: SigningKeys | Ed25519PrivateKey) -> None:
        self.keys = SigningKeys.of(keys)

    @property
    def kid(self) -> str:
        """The current key's id: what a new grant's payload names."""
        return self.keys.kid

    @property
    def hub_keys(self) -> dict[str, str]:
        """What the device link sends in welcome.hubKeys and link.keys: current and previous keys."""
        return self.keys.hub_keys

    def sign(self, body: dict[str, Any]) -> str:
        """Sign with the current key; the payload must name it (``kid``), or devices could not verify."""
        if body.get("kid") != self.keys.kid:
            raise GrantRejected("the grant does not name the hub's current signing key")
        try:
            return sign_grant(body, self.keys.current)
        except Exception as exc:  # a key that cannot sign is our fault, never the caller's
            raise GrantRejected(f"the hub could not sign the tunnel grant ({type(exc).__name__})") from None

    def verify(self, token: Any) -> dict[str, Any]:
        """The payload of a grant this hub signed with a key of its ring; InvalidGrant otherwise."""
        try:
            return verify_grant(token, self.keys.public_of)
        except GrantError as exc:
            raise InvalidGrant(f"the grant is not one of this hub's: {exc.reason}") from None


# Devices told at once after a key rotation: 10,000 links must not mean 10,000 commands (and tasks) in
# flight; a few workers go through the links instead.
PUSH_CONCURRENCY = 32


async def push_hub_keys(services: "Services", *, timeout: float = 10.0, concurrency: int | None = None) -> int:
    """After a key rotation: tell every device connected here the keys that sign grants now
    (``link.keys``), so it accepts new grants without reconnecting, at most ``concurrency`` devices at
    a time. Returns how many acknowledged."""
    payload = {"hubKeys": services.tunnels.grants.hub_keys}
    acknowledged = 0

    async def tell(device_id: Any) -> None:
        nonlocal acknowledged
        try:
            await services.bus.request(f"cmd.{device_id}.link.keys", payload, timeout=timeout)
            acknowledged += 1
        except Exception as exc:  # noqa: BLE001 — it learns them from its next welcome instead
            log.info("device %s did not take the new hub keys: %s", device_id, type(exc).__name__)

    devices = iter(list(services.links))

    async def worker() -> None:
        for device_id in devices:  # one shared iterator: each worker takes the next device
            await tell(device_id)

    async with trio.open_nursery() as nursery:
        for _ in range(min(concurrency or PUSH_CONCURRENCY, len(services.links))):
            nursery.start_soon(worker)
    return acknowledged
