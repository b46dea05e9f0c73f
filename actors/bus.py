"""The command bus: subjects, request/reply with a timeout (DESIGN.md section 2).

Subjects are dot-separated tokens as in NATS: ``cmd.<device_id>.reboot``. A subscription pattern may
end in ``>`` (the rest of the subject) or use ``*`` (one token). The device link subscribes
``cmd.<device_id>.>`` for as long as its socket lives; the newest subscription of a pattern wins, which
is how the newest connection of a device takes over its commands.

This is the in-process implementation. Callers only rely on ``request`` raising ``NoResponders``
(nobody holds the subject: the device is offline), ``RequestTimeout`` (nobody answered in time) or
``Unavailable`` (the bus itself cannot carry the request now; only the NATS-backed bus raises it), so a
NATS-backed bus (actors/natsbus.py) can replace it when the hub runs as several processes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

Handler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class BusError(Exception):
    pass


class NoResponders(BusError):
    """No subscriber holds this subject."""


class RequestTimeout(BusError):
    """The subscriber did not answer in time."""


class Unavailable(BusError):
    """The bus cannot carry a request now (its server is unreachable or stalled): whether anybody
    holds the subject is not known, so this is not ``NoResponders`` (the device may well be online)."""


class Subscription:
    __slots__ = ("bus", "pattern", "handler")

    def __init__(self, bus: "Bus", pattern: str, handler: Handler) -> None:
        self.bus, self.pattern, self.handler = bus, pattern, handler

    def close(self) -> None:
        """Unsubscribe, unless a newer subscription already replaced this one."""
        if self.bus._subs.get(self.pattern) is self:
            del self.bus._subs[self.pattern]

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Bus:
    connected = True  # one process: nothing to be cut off from (NatsBus says whether NATS is reachable)

    def __init__(self) -> None:
        self._subs: dict[str, Subscription] = {}

    def subscribe(self, pattern: str, handler: Handler) -> Subscription:
        sub = Subscription(self, pattern, handler)
        self._subs[pattern] = sub
        return sub

    def has_responder(self, subject: str) -> bool:
        return self._match(subject) is not None

    def may_reach(self, subject: str) -> bool:
        """Whether a request on ``subject`` could be answered: in one process only by a subscriber here
        (NatsBus: by any node, which only asking tells)."""
        return self.has_responder(subject)

    def _match(self, subject: str) -> Subscription | None:
        return match(self._subs, subject)

    async def request(self, subject: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        sub = self._match(subject)
        if sub is None:
            raise NoResponders(subject)
        return await request_in_process(sub.handler, subject, payload, timeout)

    def statistics(self) -> dict[str, int]:
        return {"subscriptions": len(self._subs)}


def match(subs: dict[str, Any], subject: str) -> Any:
    """The subscription (of ``subs``, pattern -> subscription) that takes ``subject``, or None."""
    # Exact subject first, then every "prefix.>" from the longest prefix down: O(tokens) lookups.
    sub = subs.get(subject)
    if sub is not None:
        return sub
    tokens = subject.split(".")
    for n in range(len(tokens) - 1, 0, -1):
        sub = subs.get(".".join(tokens[:n]) + ".>")
        if sub is not None:
            return sub
    sub = subs.get(">")
    if sub is not None:
        return sub
    for pattern, sub in subs.items():
        if "*" in pattern and _matches(pattern, tokens):
            return sub
    return None


async def request_in_process(handler: Handler, subject: str, payload: dict[str, Any],
                             timeout: float) -> dict[str, Any]:
    """A request answered by a handler of this process: its errors are raised as they are."""
    with trio.move_on_after(timeout):
        return await handler(subject, payload)
    raise RequestTimeout(subject)


def _matches(pattern: str, tokens: list[str]) -> bool:
    parts = pattern.split(".")
    for i, part in enumerate(parts):
        if part == ">":
            return len(tokens) > i
        if i >= len(tokens) or (part != "*" and part != tokens[i]):
            return False
    return len(parts) == len(tokens)
