"""How the agent's image pulls reach a registry: directly, or through the hub's registry proxy.

The hub serves the pull side of the distribution API at ``/v2/`` (hub/registry/) to devices of fleets
with the proxy on. What "registry fallback" means here (docs/billing.md): the proxy is where a device
falls back to when it cannot pull from the registry itself. ``mode``:

- ``fallback`` (the default): the registry first; when that pull fails, the same digest again through
  the hub. A fleet without the proxy refuses it, and the error says both reasons.
- ``always``: through the hub only (the engine is told the hub is the registry's location, so it never
  asks the registry itself; when the hub fails, the pull fails): for devices that cannot reach
  registries at all, or sites where the operator wants one download per fleet rather than one per device.
- ``off``: the registry only.

The fleet's setting (config.apply's ``registryProxy``: ``off`` when the fleet's proxy is off, else the
fleet's ``registry_proxy_mode``) decides with the agent's flag (``effective``): the fleet's ``off`` and
``always`` win; under the fleet's ``fallback`` the agent's flag decides (``always`` for a device that
knows it reaches no registry). Without a word from the hub (an older hub, a boot before any apply), the
flag alone.

The pull goes through podman's own mirror support: a registries.conf naming the proxy as the mirror
of the image's registry, or with ``always`` as its location (CONTAINERS_REGISTRIES_CONF, for that pull only) and an auth file with the
device token, both in the agent's data dir (0700; the auth file 0600). The image keeps its own name,
so creating its container finds it. The token is in the auth file only, never in an argument list or
a log line.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .engine.base import Engine, EngineError, Mirror
from .state import write_json_atomic
from .shared.imageref import is_loopback, parse, proxy_component

log = logging.getLogger("fleethub.agent.containers")

MODES = ("off", "fallback", "always")
AUTH_FILE = "proxy-auth.json"  # the device token for the hub's proxy (configs.py owns registry-auth.json)


class PullRoute:
    def __init__(self, mode: str, hub_url: Callable[[], str], token: str, data_dir: Path) -> None:
        if mode not in MODES:
            raise ValueError(f"the registry proxy mode is one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.hub_url = hub_url
        self._token = token
        self.data_dir = Path(data_dir)

    def effective(self, fleet: str | None) -> str:
        """The mode of a pull, from the fleet's (None: the hub said nothing) and the agent's flag."""
        return fleet if fleet in ("off", "always") else self.mode

    def mirror(self, image: str, *, exclusive: bool = False) -> Mirror | None:
        """The hub as the mirror of ``image``'s registry; None when there is no way to say it (an
        IPv6 registry, a hub on plain HTTP away from loopback, which podman would refuse)."""
        registry = parse(image).registry
        component = proxy_component(registry)
        hub = urlsplit(self.hub_url())
        if component is None or not hub.netloc:
            return None
        insecure = hub.scheme == "http"
        if insecure and not is_loopback(hub.netloc):
            return None
        return Mirror(registry=registry, location=f"{hub.netloc}/{component}",
                      authfile=self._authfile(hub.netloc), insecure=insecure, exclusive=exclusive)

    def _authfile(self, host: str) -> Path:
        path = self.data_dir / AUTH_FILE
        secret = base64.b64encode(f"fleethub-device:{self._token}".encode()).decode()
        write_json_atomic(path, {"auths": {host: {"auth": secret}}}, mode=0o600)
        return path

    async def pull(self, engine: Engine, image: str, fleet: str | None = None, **how: Any) -> tuple[int, str]:
        """The image's size and how it came: "registry" or "proxy". ``fleet``: the fleet's mode as the
        hub last said it. ``how``: the engine's pull options (registry logins, progress), the same
        whichever way the image comes."""
        mode = self.effective(fleet)
        mirror = self.mirror(image, exclusive=mode == "always") if mode != "off" else None
        if mirror is None:
            if mode == "always":
                raise EngineError(f"pull {image}: pulls go through the hub's registry proxy only (mode always), "
                                  "and the hub cannot stand for this registry (an IPv6 registry, or a hub on "
                                  "plain HTTP away from loopback)")
            return await engine.pull(image, **how), "registry"
        if mode == "always":
            try:
                return await engine.pull(image, mirror, **how), "proxy"
            except EngineError as exc:
                raise EngineError(f"through the hub's registry proxy only (the registry itself was not "
                                  f"asked): {exc}") from None
        try:
            return await engine.pull(image, **how), "registry"
        except EngineError as direct:
            log.info("%s; pulling it through the hub's registry proxy", direct)
            try:
                return await engine.pull(image, mirror, **how), "proxy"
            except EngineError as proxied:
                raise EngineError(f"{direct}; through the hub's registry proxy: {proxied}") from None
