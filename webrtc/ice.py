"""Which addresses ICE gathers on, what it is configured with, and how loudly its libraries log.

No trio here: the CLI's tunnel process (``fleethub tunnel``, cli_tunnel.py) runs aiortc on asyncio
alone, and the agent's peers (peer.py) use the same set-up from their asyncio thread.
"""

from __future__ import annotations

import logging
import os
from typing import Any

# ICE gathers host candidates on every interface but loopback. Tests, benchmarks and a hub and
# devices on one machine set this ("127.0.0.1") so the peers meet on loopback only.
ICE_ADDRESSES_ENV = "FLEETHUB_ICE_ADDRESSES"

# aioice logs every ICE check and state change at INFO (about 18 lines a session on each peer);
# aiortc its transports' states. Operators read the agent's and the CLI's logs for the one line
# that says a tunnel opened or closed, so below DEBUG these libraries only speak up for WARNING.
CHATTY = ("aioice", "aiortc")


def quiet_ice_logs(extra: tuple[str, ...] = ()) -> None:
    """Send the ICE libraries' INFO chatter (and ``extra`` loggers') to DEBUG: shown only when the
    process logs at DEBUG. A level someone set on those loggers explicitly is left alone."""
    if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        return
    for name in CHATTY + extra:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def restrict_host_addresses(addresses: list[str] | None = None) -> None:
    """Gather ICE host candidates only on ``addresses`` (default: $FLEETHUB_ICE_ADDRESSES, comma
    separated; unset leaves aioice's own choice). aioice has no option for it, so this replaces its
    module-level address lookup for the whole process: one process, one network."""
    if addresses is None:
        value = os.environ.get(ICE_ADDRESSES_ENV, "").strip()
        if not value:
            return
        addresses = [a.strip() for a in value.split(",") if a.strip()]
    import aioice.ice

    chosen = list(addresses)
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: [
        a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]


def ice_configuration(ice_servers: list[dict[str, Any]], relay_only: bool) -> Any:
    """aiortc's RTCConfiguration for the hub's ICE servers (``[{urls, username?, credential?}]``)."""
    from aiortc import RTCConfiguration, RTCIceServer
    from aiortc.rtcconfiguration import RTCIceTransportPolicy

    servers = [RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
               for s in ice_servers if s.get("urls")]
    return RTCConfiguration(iceServers=servers,
                            iceTransportPolicy=RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL)
