"""The TLS context an outbound HTTPS client checks servers with: made once per process, off the event loop.

httpx makes a new ``ssl.SSLContext`` for every ``AsyncClient`` and ``AsyncHTTPTransport`` it is not
handed one, loading certifi's CA bundle into it: about 60 ms of CPU on the slow bench host (25-30 on a
fast one), with the GIL held, on the thread that makes the client. The hub made one per assistant
chat, per object fetched from an upstream registry and per image digest resolved, and the agent one
per page-map upload, each on its event loop: every device link and request of that process waited
(docs/operations.md, "A stalled event loop"). ``ssl.create_default_context()``, the system's trust
store, costs the same: the hub's webhooks made one per endpoint, and trio-websocket one per ``wss://``
connect of the agent's link when it is given none (a simulator's devices reconnecting, each).

Every user is an HTTP/1.1 client or a WebSocket: httpcore sets the same ALPN list on a shared context at
each connect, so a client that offered HTTP/2 would need a context of its own.

Each context here is made in a worker thread the first time it is asked for and then shared (an
``SSLContext`` is made to be shared by any number of connections). Trust is what it was: ``httpx_default``
is what httpx would build (certifi's bundle, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when set, read at
each call: a changed variable gets a context of its own); ``system_default`` is the system's store.
"""

from __future__ import annotations

import os
import ssl
import threading
from typing import Callable

import trio

_made: dict[tuple[str, str | None, str | None], ssl.SSLContext] = {}
_making = threading.Lock()  # one build per key, whichever thread asks first


def _env() -> tuple[str | None, str | None]:
    return os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")


def _build_httpx() -> ssl.SSLContext:
    import httpx  # the agent loads httpx only when it uploads a page map

    return httpx.create_ssl_context(verify=True, trust_env=True)


async def _context(kind: str, build: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    key = (kind, *_env())
    made = _made.get(key)
    if made is not None:
        return made

    def make() -> ssl.SSLContext:
        with _making:
            if key not in _made:
                _made[key] = build()
            return _made[key]

    return await trio.to_thread.run_sync(make)


async def httpx_default() -> ssl.SSLContext:
    """What ``httpx.AsyncClient()`` would check servers against: pass it as ``verify=``."""
    return await _context("httpx", _build_httpx)


async def system_default() -> ssl.SSLContext:
    """``ssl.create_default_context()``: the system's trust store, host names checked."""
    return await _context("system", ssl.create_default_context)
