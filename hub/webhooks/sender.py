"""One webhook request: where it may go, how long it may take, what is kept of the answer.

The receiver's address is checked as image registries' are (hub/images.py ``check_destination``):
every address the name resolves to must be public, and a connection is made to the address that was
checked (hub/webhooks/wire.py), so a DNS answer that changes in between (rebinding) cannot move it into
the hub's network. ``FLEETHUB_WEBHOOKS_ALLOW_PRIVATE=1`` lifts the check (tests, a closed network).
Redirects are not followed (a 3xx is a failure: the endpoint's URL is what the admin registered),
each request has ``TIMEOUT`` seconds in all, and at most ``wire.EXCERPT_BYTES`` of the answer are kept
(in the delivery log). Errors name what failed, never the URL (it may hold a token).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import h11
import httpx
import trio

from hub.images import RegistryError, check_destination
from hub.webhooks import wire

TIMEOUT = 10.0


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


def client(*, allow_private: bool) -> wire.Pool:
    """One endpoint's connections, kept alive between its deliveries (hub/webhooks/wire.py): the
    address checks on every new connection unless ``allow_private``."""
    return wire.Pool(allow_private=allow_private)


def target_of(url: str) -> wire.Target:
    parsed = check_url(url)
    path = parsed.raw_path or b"/"
    return wire.Target(scheme=parsed.scheme, host=parsed.host, port=parsed.port or (443 if parsed.scheme == "https" else 80),
                       authority=parsed.netloc.decode(), path=path)


async def post(url: str, body: bytes, headers: dict[str, str], *, allow_private: bool,
               timeout: float = TIMEOUT, using: wire.Pool | None = None) -> Outcome:
    """One delivery; ``using``: an endpoint's pool (``client``), else one made for this request."""
    started = time.perf_counter()

    def done(status: int | None, excerpt: str = "", error: str | None = None) -> Outcome:
        return Outcome(status, (time.perf_counter() - started) * 1000, excerpt, error)

    pool = using or client(allow_private=allow_private)
    try:
        target = target_of(url)
        with trio.fail_after(timeout):
            status, kept = await pool.post(target, body, headers)
        excerpt = kept.decode("utf-8", "replace")
        if 300 <= status < 400:
            return done(status, excerpt, "redirects are not followed")
        return done(status, excerpt, None if 200 <= status < 300 else f"the receiver answered {status}")
    except Refused as exc:
        return done(None, error=str(exc))
    except RegistryError as exc:
        return done(None, error="the receiver's host cannot be resolved" if exc.unreachable else
                    "the receiver's host has a private, loopback or link-local address")
    except trio.TooSlowError:
        return done(None, error=f"no answer within {timeout:g}s")
    except (h11.ProtocolError, trio.BrokenResourceError, wire.StaleConnection, OSError) as exc:
        return done(None, error=f"the request failed ({type(exc).__name__})")
    finally:
        if using is None:
            with trio.CancelScope(shield=True):
                await pool.aclose()
