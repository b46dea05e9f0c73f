"""Limits that hold across the cluster, not per node (issue 17 item 5; docs/cluster.md "Limits").

One hub process counts its limits in memory. N nodes counting apart would let through up to N times
each limit, so a cluster node counts them in the shared PostgreSQL (storage/limits.py), each kind as
tightly as its traffic allows:

- **API rate limits** (per organisation, principal or address, hourly windows) are hit by every
  request, so a request must not wait on a crossing. Each node counts in memory as before and, every
  ``SYNC_SECONDS``, writes its own counts and reads the others' sum (hub/auth/ratelimit.RateLimiter's
  ``changes``/``learn``). Tolerance: a key can pass its limit by what the nodes admit for it between
  two rounds, at most one round's worth of requests per node.
- **Sign-in and token throttles** guard credentials, and their requests are few and already costly
  (a password or secret hash), so they are exact: each attempt is reserved in PostgreSQL under a
  transaction lock per key, counted on every node in one sliding window.
- **The event-stream cap** per organisation is exact too: a stream opens (one crossing, at open only)
  if fewer than the cap are recorded on all nodes. A closed stream's row goes within a round; a dead
  node's rows go with its liveness row (storage/nodes.py); a node restarting under its id drops its own.

A request refused is answered 429 with Retry-After (and counted by status in /metrics) as in one
process; a sync round that cannot reach the database is counted (``fleethub_cluster_limit_sync_failures``).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import trio

from hub.auth.ratelimit import BurstLimiter, Decision, key_text
from hub.auth.sessions import LoginThrottle, Reservation
from hub.cluster.events import ClusterEventHub
from hub.errors import RateLimited
from hub.events import Subscriber
from storage.db import DatabaseUnavailable
from storage.limits import ClusterLimits

if TYPE_CHECKING:
    from hub.cluster.topology import ClusterNode

log = logging.getLogger("fleethub.cluster")

SYNC_SECONDS = 1.0  # how often a node trades its rate-limit counts and clears closed streams
PRUNE_EVERY = 60.0  # seconds between sweeps of credential attempts that left every window


class SharedLimits:
    """A node's view of the cluster-wide limits: the credential throttles and the stream rows."""

    def __init__(self, store: ClusterLimits, node: str, login: LoginThrottle) -> None:
        self.store, self.node, self.login = store, node, login
        self.closed_streams: list[uuid.UUID] = []  # closed here, row not yet deleted
        self.sync_failures = 0

    # -- credential throttles ------------------------------------------------------------------
    async def reserve_login(self, account: str, address: str, now: dt.datetime) -> Reservation:
        """hub/auth/sessions.LoginThrottle.reserve, counted on every node (its limits and window)."""
        t = self.login
        got = await self.store.reserve_attempts(
            {f"login-account:{account.lower()}": t.max_failures, f"login-address:{address}": t.max_failures_per_address},
            t.window, now, self.node)
        return Reservation(account, address, now, got.wait)

    async def login_succeeded(self, attempt: Reservation) -> None:
        """The account starts afresh on every node; the address gets this one attempt back."""
        await self.store.forget_attempts(f"login-account:{attempt.account.lower()}")
        await self.store.give_back_attempt(f"login-address:{attempt.address}", attempt.at, self.node)

    async def hit_burst(self, limiter: BurstLimiter, key: tuple, limit: int, now: dt.datetime) -> Decision:
        """hub/auth/ratelimit.BurstLimiter.hit on every node, as one sliding window per key (``limiter``'s
        window; its counts stay unused)."""
        window = limiter.window
        got = await self.store.reserve_attempts({f"burst:{key_text(key)}": limit}, dt.timedelta(seconds=window),
                                                now, self.node)
        (text, used), = got.used.items()
        oldest = got.oldest.get(text, now)
        reset = int((oldest + dt.timedelta(seconds=window)).timestamp() + 0.999)
        if got.wait > 0:
            return Decision(False, limit, 0, reset, max(1, int(got.wait + 0.999)))
        return Decision(True, limit, max(0, limit - used), reset, 0)

    # -- streams -------------------------------------------------------------------------------
    async def open_stream(self, owner: Hashable, cap: int, now: dt.datetime) -> uuid.UUID:
        stream = uuid.uuid4()
        held = await self.store.open_stream(key_text(owner), stream, self.node, cap, now)
        if held is None:
            raise RateLimited(f"at most {cap} event streams may be open at once (on all nodes)",
                              code="too_many_streams", retry_after=5)
        return stream

    async def flush_closed_streams(self) -> None:
        if self.closed_streams:
            closing, self.closed_streams = self.closed_streams, []
            try:
                await self.store.close_streams(closing)
            except BaseException:
                self.closed_streams = closing + self.closed_streams  # tried again next round
                raise


class LimitedClusterEventHub(ClusterEventHub):
    """ClusterEventHub whose per-owner stream cap counts the streams of every node."""

    def __init__(self, bus: Any, node: str, shared: SharedLimits, clock: Any, **kw: Any) -> None:
        super().__init__(bus, node, **kw)
        self.shared, self.clock = shared, clock

    async def open(self, topic: Hashable, owner: Hashable = None) -> Subscriber:
        sub = self.subscribe(topic, owner)  # this node's own count first: a refusal here costs no crossing
        if owner is None:
            return sub
        try:
            sub.stream_id = await self.shared.open_stream(owner, self.max_per_owner, self.clock.now())
        except BaseException:
            sub.close()
            raise
        return sub

    def _release(self, sub: Subscriber) -> None:
        super()._release(sub)
        stream_id = getattr(sub, "stream_id", None)
        if stream_id is not None:
            sub.stream_id = None
            self.shared.closed_streams.append(stream_id)


async def keep(c: ClusterNode, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Every round: trade rate-limit counts with the other nodes and delete closed streams' rows; now
    and then, sweep credential attempts older than every window. An unreachable database only delays
    a round (the limits then hold per node, as in one process, until it is back)."""
    s, shared = c.s, c.limits
    await shared.store.drop_node_streams(s.node_id)  # rows this id left behind when it was killed
    task_status.started()
    pruned_at = trio.current_time()
    while True:
        try:
            window, mine = s.access.rate_limiter.changes(s.clock.now())
            try:
                others = await shared.store.sync_counts(s.node_id, window, mine)
            except BaseException:
                s.access.rate_limiter.not_sent()
                raise
            s.access.rate_limiter.learn(window, others)
            await shared.flush_closed_streams()
            if trio.current_time() - pruned_at >= PRUNE_EVERY:
                pruned_at = trio.current_time()
                horizon = max(s.access.login_throttle.window, dt.timedelta(seconds=s.access.token_limiter.window))
                await shared.store.prune_attempts(s.clock.now() - horizon)
        except DatabaseUnavailable:
            shared.sync_failures += 1
            log.info("cluster limits: the database is unreachable; trying again next round")
        await trio.sleep(SYNC_SECONDS)
