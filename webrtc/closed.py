"""A send that met a closed peer connection, and the asyncio exception handler that files those at DEBUG.

No trio here: used on every asyncio loop that runs aiortc, the agent's thread (loop.py) and the CLI's
main loop (cli_tunnel.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("fleethub.webrtc")


def closed_send(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a send that met a closed peer connection: aiortc's DTLS transport raises
    ConnectionError once it is no longer connected and OpenSSL's error ("protocol is shutdown") when
    the TLS state is shut down under it. Both happen when a session ends while SCTP still had a SACK,
    a retransmission or a flush scheduled; nothing is lost that anyone still wanted."""
    if isinstance(exc, ConnectionError):
        return True
    try:
        from OpenSSL import SSL
    except ImportError:  # pragma: no cover — aiortc depends on pyOpenSSL
        return False
    return isinstance(exc, SSL.Error)


def exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """aiortc starts many tasks nobody awaits (ensure_future of SCTP sends, flushes, timers); when a
    session ends, those still queued fail with a closed-send error and asyncio would log each as
    "Task exception was never retrieved" with a traceback. Those go to DEBUG; anything else is
    reported as asyncio would."""
    if closed_send(context.get("exception")):
        log.debug("after a peer connection closed: %s", context.get("exception"))
        return
    loop.default_exception_handler(context)
