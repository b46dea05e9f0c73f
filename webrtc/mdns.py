"""aioice's mDNS resolver, loaded when a peer first sends an mDNS candidate, not with aiortc.

aioice.ice imports aioice.mdns at module level, and that imports dnspython (dns.message, dns.zone and
what they import): about 70 of the 330 ms of CPU that ``from aiortc import RTCPeerConnection`` took here
(2026-11-29, ``python -X importtime``; wall time 140 ms of 650), paid by every ``fleethub tunnel``
start before its offer, and by an agent's first tunnel. Only a remote candidate named
``<uuid>.local`` needs it: browsers hide their host addresses behind such names
(draft-ietf-mmusic-mdns-ice-candidates), so an agent may meet one from the console's terminal;
``fleethub tunnel`` talks to agents, whose aioice gathers plain addresses, and never does.

``install()`` puts a stand-in ``aioice.mdns`` in ``sys.modules`` before aioice is imported. It holds
what aioice.ice reads at import and for every remote candidate (``is_mdns_hostname``, the
``MDnsProtocol`` name its annotations and ``cast`` evaluate), and ``create_mdns_protocol``, whose first
call loads the real module in its place and hands on: the first mDNS candidate costs the import once,
on the asyncio thread that resolves it. Any other name read from the stand-in loads the real module too,
so nothing of aioice's behaviour changes. It does nothing once aioice is imported (that process has the
real one). tests/webrtc/test_mdns.py checks that a session runs without dnspython and that the first
mDNS use loads it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
import threading
import types
from typing import Any

NAME = "aioice.mdns"
# the names aioice gives its mDNS candidates, as aioice 0.10-0.13's MDNS_HOSTNAME_RE (the draft's <uuid>.local)
HOSTNAME = re.compile(r"^[a-zA-Z0-9-]{1,63}\.local$")

_lock = threading.Lock()


def _load_real(stand_in: types.ModuleType) -> types.ModuleType:
    """aioice's own mDNS module, executed once under its name, replacing the stand-in everywhere it
    was reachable by name (sys.modules and the aioice package); aioice.ice keeps the stand-in, which
    hands on to it from then on."""
    with _lock:
        real = stand_in.__dict__.get("_real")
        if real is not None:
            return real
        import aioice

        spec = importlib.machinery.PathFinder.find_spec(NAME, aioice.__path__)
        if spec is None or spec.loader is None:
            raise ImportError(f"{NAME}: not found beside aioice (webrtc/mdns.py)")
        real = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(real)
        stand_in._real = real
        sys.modules[NAME] = real
        aioice.mdns = real  # type: ignore[attr-defined]
        return real


def _stand_in() -> types.ModuleType:
    module = types.ModuleType(NAME, "A stand-in for aioice.mdns that loads it on first use: see webrtc/mdns.py.")
    module.__fleethub_stand_in__ = True  # type: ignore[attr-defined]
    module._real = None  # type: ignore[attr-defined]

    def is_mdns_hostname(name: str) -> bool:
        return HOSTNAME.match(name) is not None

    class MDnsProtocol:
        """Only a name here, for aioice.ice's annotations and ``cast``: the protocol itself is the real
        module's, made by ``create_mdns_protocol``."""

    async def create_mdns_protocol() -> Any:
        return await _load_real(module).create_mdns_protocol()

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_load_real(module), name)

    module.is_mdns_hostname = is_mdns_hostname  # type: ignore[attr-defined]
    module.MDnsProtocol = MDnsProtocol  # type: ignore[attr-defined]
    module.create_mdns_protocol = create_mdns_protocol  # type: ignore[attr-defined]
    module.__getattr__ = __getattr__  # type: ignore[attr-defined]
    return module


def install() -> bool:
    """Put the stand-in in place before aioice is imported; whether it is (now or already) in place."""
    current = sys.modules.get(NAME)
    if current is not None:
        return bool(getattr(current, "__fleethub_stand_in__", False))
    if "aioice" in sys.modules:
        return False  # aioice is loaded already, with the real module
    sys.modules[NAME] = _stand_in()
    return True


def loaded() -> bool:
    """Whether this process has loaded aioice's real mDNS module (and dnspython with it)."""
    current = sys.modules.get(NAME)
    return current is not None and not getattr(current, "__fleethub_stand_in__", False)
