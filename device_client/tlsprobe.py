"""Why a link to a wss:// hub never opened, when TLS is the reason.

trio-websocket (0.12) loses a failed TLS handshake: its reader task ends quietly and the connect waits
out its timeout, so a hub certificate the device does not trust reads as ``ConnectionTimeout``, ten
seconds later, at every attempt. After such a timeout the agent (and ``fleethub agent --check``)
makes one TLS handshake of its own to the hub, with the same trust, to name the real reason.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlsplit

import trio

TRUST_HINT = "a hub with a private CA: SSL_CERT_FILE=<bundle holding it> in the agent's environment"


async def tls_refusal(url: str, ssl_context: Any, timeout: float) -> str | None:
    """What the TLS handshake with ``url``'s host says is wrong, or None (not TLS, unreachable, or
    the handshake succeeds: then TLS was not the reason)."""
    parts = urlsplit(url)
    if parts.scheme not in ("wss", "https") or not parts.hostname:
        return None
    context = ssl_context if ssl_context is not None else ssl.create_default_context()
    with trio.move_on_after(timeout):
        try:
            stream = await trio.open_ssl_over_tcp_stream(parts.hostname, parts.port or 443, ssl_context=context)
            try:
                await stream.do_handshake()
            finally:
                await trio.aclose_forcefully(stream)
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__
            if isinstance(cause, ssl.SSLCertVerificationError):
                return f"the hub's TLS certificate is not trusted: {cause.verify_message} ({TRUST_HINT})"
            if isinstance(cause, ssl.SSLError):
                return f"the TLS handshake with the hub failed: {cause.reason or cause}"
        except OSError:
            return None
    return None
