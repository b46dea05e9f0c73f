"""One webhook request: where it may go, how long it may take, what is kept of the answer.

The receiver's address is checked as image registries' are (hub/images.py ``check_destination`` and
``PinnedTransport``): every address the name resolves to must be public, and the request connects to
the address that was checked, so a DNS answer that changes in between (rebinding) cannot move it into
the hub's network. ``FLEETHUB_WEBHOOKS_ALLOW_PRIVATE=1`` lifts the check (tests, a closed network).
Redirects are not followed (a 3xx is a failure: the endpoint's URL is what the admin registered),
each request has ``TIMEOUT`` seconds in all, and at most ``EXCERPT_BYTES`` of the answer are read
(kept in the delivery log). Errors name what failed, never the URL (it may hold a token).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
import trio

from hub.images import PinnedTransport, RegistryError, check_destination

TIMEOUT = 10.0
EXCERPT_BYTES = 1024


@dataclass(frozen=True)
class Outcome:
    status: int | None
    latency_ms: float
    excerpt: str
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class Refused(ValueError):
    """A URL no webhook may have (its message says why, without the URL)."""


def check_url(url: str) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise Refused("the url is not a valid URL") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise Refused("the url must be http:// or https:// with a host")
    if parsed.userinfo:
        raise Refused("the url may not hold a user or password: webhooks are authenticated by their signature")
    return parsed


async def check_address(url: str, allow_private: bool) -> None:
    """Refused when the receiver's host has a private, loopback or link-local address."""
    if allow_private:
        return
    try:
        await check_destination(check_url(url).netloc.decode(), ())
    except RegistryError as exc:
        raise Refused("the receiver's host cannot be resolved" if exc.unreachable else
                      "the receiver's host has a private, loopback or link-local address; the hub sends "
                      "webhooks there only when its operator sets FLEETHUB_WEBHOOKS_ALLOW_PRIVATE=1") from None


def client(*, allow_private: bool, timeout: float = TIMEOUT) -> httpx.AsyncClient:
    """A client for one endpoint's deliveries (its connection is kept alive between them): the
    address checks on every request unless ``allow_private``, no redirects, ``timeout``."""
    transport = httpx.AsyncHTTPTransport() if allow_private else PinnedTransport(())
    return httpx.AsyncClient(transport=transport, follow_redirects=False, timeout=httpx.Timeout(timeout))


async def post(url: str, body: bytes, headers: dict[str, str], *, allow_private: bool,
               timeout: float = TIMEOUT, using: httpx.AsyncClient | None = None) -> Outcome:
    """One delivery; ``using``: an endpoint's client (``client``), else one made for this request."""
    started = time.perf_counter()

    def done(status: int | None, excerpt: str = "", error: str | None = None) -> Outcome:
        return Outcome(status, (time.perf_counter() - started) * 1000, excerpt, error)

    try:
        check_url(url)
        with trio.fail_after(timeout):
            async with (client(allow_private=allow_private, timeout=timeout) if using is None
                        else _borrowed(using)) as http:
                async with http.stream("POST", url, content=body, headers=headers) as response:
                    kept = bytearray()
                    async for chunk in response.aiter_raw():
                        kept += chunk
                        if len(kept) >= EXCERPT_BYTES:
                            break
                    excerpt = bytes(kept[:EXCERPT_BYTES]).decode("utf-8", "replace")
                    if 300 <= response.status_code < 400:
                        return done(response.status_code, excerpt, "redirects are not followed")
                    return done(response.status_code, excerpt,
                                None if response.is_success else f"the receiver answered {response.status_code}")
    except Refused as exc:
        return done(None, error=str(exc))
    except RegistryError as exc:
        return done(None, error="the receiver's host cannot be resolved" if exc.unreachable else
                    "the receiver's host has a private, loopback or link-local address")
    except trio.TooSlowError:
        return done(None, error=f"no answer within {timeout:g}s")
    except httpx.TimeoutException:
        return done(None, error=f"no answer within {timeout:g}s")
    except httpx.HTTPError as exc:
        return done(None, error=f"the request failed ({type(exc).__name__})")
    except OSError as exc:
        return done(None, error=f"the request failed ({type(exc).__name__})")


class _borrowed:
    """An endpoint's client used for one request and left open for the next."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def __aenter__(self) -> httpx.AsyncClient:
        return self.http

    async def __aexit__(self, *exc: object) -> None:
        return None
