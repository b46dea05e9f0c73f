"""The hub's commands about the link itself, not about the device's parts.

    link.drain  {reconnectAfter (s), url?}  the hub is stopping: leave the link once the replies being
                                            worked on are sent, come back within reconnectAfter seconds,
                                            to url when the hub names another one
    link.keys   {hubKeys}                   the hub rotated its signing key: these keys replace
                                            welcome.hubKeys, so grants it signs now verify without a
                                            new link
    link.notice {code, message}             the hub refused something the device sent (a malformed
                                            result): logged, so the device's own log says what and why
"""

from __future__ import annotations

import base64
import logging
from typing import TYPE_CHECKING, Any

from .commands import CommandError

if TYPE_CHECKING:
    from .context import DeviceContext

log = logging.getLogger("fleethub.agent")

MAX_RECONNECT_AFTER = 600.0


def _is_ed25519_key(encoded: str) -> bool:
    try:
        return len(base64.b64decode(encoded, validate=True)) == 32
    except ValueError:  # binascii.Error is a ValueError
        return False


class LinkControl:
    def __init__(self, device: DeviceContext) -> None:
        self.device = device
        self.notices = 0  # link.notice commands: the hub refused something this device sent
        device.register("link.drain", self.drain)
        device.register("link.keys", self.keys)
        device.register("link.notice", self.notice)

    async def drain(self, payload: dict[str, Any]) -> dict[str, Any]:
        after = payload.get("reconnectAfter", 5.0)
        url = payload.get("url")
        if isinstance(after, bool) or not isinstance(after, (int, float)) or not 0 <= after <= MAX_RECONNECT_AFTER:
            raise CommandError("invalid_payload", f"reconnectAfter must be 0 to {MAX_RECONNECT_AFTER:.0f} seconds")
        try:
            self.device.request_reconnect(float(after), None if url is None else str(url))
        except ValueError as exc:
            raise CommandError("invalid_payload", str(exc)) from None
        return {"draining": True, "reconnectAfter": float(after)}

    async def keys(self, payload: dict[str, Any]) -> dict[str, Any]:
        hub_keys = payload.get("hubKeys")
        if not isinstance(hub_keys, dict) or not hub_keys or not all(
                isinstance(k, str) and isinstance(v, str) and _is_ed25519_key(v) for k, v in hub_keys.items()):
            raise CommandError("invalid_payload", "hubKeys must map key ids to base64 Ed25519 public keys")
        self.device.set_hub_keys(hub_keys)
        return {"kids": list(hub_keys)}

    async def notice(self, payload: dict[str, Any]) -> dict[str, Any]:
        log.warning("%s: the hub says %s: %s", self.device.who(), str(payload.get("code"))[:64],
                    str(payload.get("message"))[:500])
        self.notices += 1
        return {}
