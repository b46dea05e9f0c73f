"""A connection that came through trusted reverse proxies: the client's address and scheme they report.

Behind a proxy every connection's peer is the proxy, so without this the per-address limits (sign-in
attempts, OAuth token requests, unauthenticated rate limits) would count every user as one, the audit
log would name the proxy, and the session cookie would lose ``Secure`` where the proxy terminated TLS.

``X-Forwarded-For`` is a list each proxy appends its peer to, and anything before the proxies' own
entries is whatever the client wrote: only the entry ``hops`` from the end was written by a proxy we
trust (hops = how many proxies stand in front of the hub). A request with fewer entries than that did
not pass through them all (a health check from the proxy, a direct connection): its peer stands.
"""

from __future__ import annotations

from typing import Any

_SECURE = {"http": "https", "websocket": "wss"}
_PLAIN = {"http": "http", "websocket": "ws"}


def _trusted_value(headers: list[tuple[bytes, bytes]], name: bytes, hops: int) -> str | None:
    values = [part.strip() for key, value in headers if key.lower() == name
              for part in value.decode("latin-1").split(",")]
    return values[-hops] if len(values) >= hops and values[-hops] else None


def apply_forwarded(scope: dict[str, Any], hops: int) -> None:
    """Set ``scope``'s client and scheme from what the ``hops`` proxies in front reported (in place: the
    scope is this connection's own)."""
    if hops <= 0 or scope["type"] not in _SECURE:
        return
    headers = scope.get("headers") or []
    client = _trusted_value(headers, b"x-forwarded-for", hops)
    if client is not None:
        scope["client"] = (client, 0)
    proto = _trusted_value(headers, b"x-forwarded-proto", hops)
    if proto is not None:
        proto = proto.lower()
        if proto in ("https", "wss"):
            scope["scheme"] = _SECURE[scope["type"]]
        elif proto in ("http", "ws"):
            scope["scheme"] = _PLAIN[scope["type"]]
