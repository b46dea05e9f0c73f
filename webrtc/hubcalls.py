"""The ``fleethub tunnel`` CLI's HTTP requests to the hub: the standard library's client, off the loop.

The CLI is an OpenSSH ProxyCommand: it starts at every ``ssh``, and every millisecond of its start is
the user's. httpx cost that start about 140 ms on the slow bench host (its import, with trio's for
its async side) plus about 60 ms to load certifi's CA bundle for every client, even one that only
talks to ``http://``. This process makes four or five requests in its life (a name lookup, the
tunnel token, the session, renewals, the delete), one at a time, so ``http.client`` in a thread does
the same work for none of that import.

- **One connection, kept alive** while the requests come one after another (the lookup, the token
  and the session are three requests in about 50 ms: over a remote https hub, one TCP and TLS
  handshake instead of three). A request on a kept connection that the hub closed in between (its
  keep-alive timeout) is sent once more on a fresh one, and a connection idle longer than
  ``KEEP_IDLE`` is not reused at all.
- **Trust as httpx had it**: certifi's bundle, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when set; the
  context is made once, at the first ``https://`` connection (a renewal minutes later reuses it: the
  bundle's load holds the GIL the tunnel's bytes need), never for an ``http://`` hub.
- **Proxies as httpx had them** (``trust_env``): ``https_proxy`` / ``http_proxy`` / ``all_proxy`` and
  ``no_proxy`` from the environment (urllib's reading of them); an https hub through a proxy is a
  CONNECT tunnel, an http hub the absolute URL.
- **No redirects followed** (httpx's default): a 3xx is an answer like any other.
- Each request runs in a daemon thread and the caller awaits it on asyncio (threads.py): a cancelled
  caller (ssh's SIGHUP) does not wait for it, and the process can exit while it is still out.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from .threads import in_daemon_thread

KEEP_IDLE = 2.0  # seconds a kept connection may sit idle and still be reused (hypercorn closes at 5)


class HubUnreachable(Exception):
    """No answer: the hub could not be reached, the connection broke, or ``timed_out``."""

    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


@dataclass(frozen=True)
class Response:
    method: str
    path: str  # the request's path, without its query
    status: int
    body: bytes

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not."""
        return json.loads(self.body)


def tls_context() -> ssl.SSLContext:
    """What httpx checks servers against by default (trust_env): SSL_CERT_FILE, else SSL_CERT_DIR,
    else certifi's bundle."""
    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class HubHTTP:
    """Requests to one hub (``base_url``: ``http://`` or ``https://``, maybe with a path prefix)."""

    def __init__(self, base_url: str, *, timeout: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._conn: Any = None
        self._via_plain_proxy = False
        self._tls: ssl.SSLContext | None = None
        self._idle_since = 0.0
        self._lock = threading.Lock()  # one request at a time on the one connection

    async def request(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                      params: dict[str, str] | None = None, json_body: Any = None) -> Response:
        """One request; an answer of any status is a Response, no answer is HubUnreachable."""
        return await in_daemon_thread(partial(self._send, method, path, headers or {}, params, json_body),
                                      name="fleethub-hub-request")

    def close(self) -> None:
        with self._lock:
            self._drop()

    # ---- in the request's thread ----

    def _send(self, method: str, path: str, headers: dict[str, str], params: dict[str, str] | None,
              json_body: Any) -> Response:
        target = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        body = None
        headers = {"Accept": "application/json", "User-Agent": "fleethub-tunnel", **headers}
        if json_body is not None:
            body = json.dumps(json_body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        with self._lock:
            reused = self._conn is not None and time.monotonic() - self._idle_since <= KEEP_IDLE
            if not reused:
                self._drop()
            for attempt in (1, 2):
                try:
                    if self._conn is None:
                        self._conn = self._connect()
                    return self._exchange(method, path, target, headers, body)
                except ConnectionError as exc:  # reset, broken pipe, refused, closed without an answer
                    self._drop()
                    if not (reused and attempt == 1):
                        raise HubUnreachable(_reason(exc)) from None
                    # the hub closed the kept connection (its keep-alive timeout: http.client's
                    # RemoteDisconnected, a reset or a broken pipe) before this request: once more, new
                    reused = False
                except (TimeoutError, socket.timeout):
                    self._drop()
                    raise HubUnreachable(f"no answer within {self.timeout:.0f}s", timed_out=True) from None
                except (OSError, ValueError) as exc:  # refused, no route, name unknown, TLS, bad reply
                    self._drop()
                    raise HubUnreachable(_reason(exc)) from None
                except Exception as exc:  # http.client.HTTPException: a reply that is not HTTP
                    self._drop()
                    raise HubUnreachable(_reason(exc)) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(self, method: str, path: str, target: str, headers: dict[str, str],
                  body: bytes | None) -> Response:
        conn = self._conn
        host = f"[{self._host}]" if ":" in self._host else self._host  # an IPv6 literal keeps its brackets
        url = target if not self._via_plain_proxy else f"http://{host}:{self._port}{target}"
        conn.request(method, url, body=body, headers=headers)
        reply = conn.getresponse()
        data = reply.read()
        if reply.will_close:
            self._drop()
        else:
            self._idle_since = time.monotonic()
        return Response(method, path, reply.status, data)

    def _connect(self) -> Any:
        import http.client

        proxy = self._proxy()
        self._via_plain_proxy = proxy is not None and not self._https
        if self._https:
            if self._tls is None:  # once per hub: a renewal's new connection does not load the CAs again
                self._tls = tls_context()
            context = self._tls
            if proxy is None:
                return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=context)
            conn = http.client.HTTPSConnection(proxy[0], proxy[1], timeout=self.timeout, context=context)
            conn.set_tunnel(self._host, self._port, headers=proxy[2])
            return conn
        if proxy is None:
            return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        return _PlainProxyConnection(proxy[0], proxy[1], proxy[2], timeout=self.timeout)

    def _proxy(self) -> tuple[str, int, dict[str, str]] | None:
        """(host, port, headers for the proxy) from the environment, or None for a direct connection."""
        from urllib.request import getproxies, proxy_bypass

        proxies = getproxies()
        url = proxies.get("https" if self._https else "http") or proxies.get("all")
        if not url or proxy_bypass(f"{self._host}:{self._port}") or proxy_bypass(self._host):
            return None
        parts = urlsplit(url if "://" in url else f"http://{url}")
        headers = {}
        if parts.username is not None:
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            headers["Proxy-Authorization"] = "Basic " + base64.b64encode(user.encode()).decode()
        return parts.hostname or "", parts.port or 80, headers

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class _PlainProxyConnection:
    """An ``http://`` request through an HTTP proxy: the absolute URL, with the proxy's headers."""

    def __init__(self, host: str, port: int, proxy_headers: dict[str, str], *, timeout: float) -> None:
        import http.client

        self._conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self._headers = proxy_headers

    def request(self, method: str, url: str, *, body: bytes | None, headers: dict[str, str]) -> None:
        self._conn.request(method, url, body=body, headers={**headers, **self._headers})

    def getresponse(self) -> Any:
        return self._conn.getresponse()

    def close(self) -> None:
        self._conn.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the hub's certificate is not trusted: {exc.verify_message or exc}"
    if isinstance(exc, socket.gaierror):
        return f"its name does not resolve ({exc.strerror})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def quoted(segment: str) -> str:
    """A path segment (a session id) as it goes in a URL."""
    return quote(segment, safe="")
