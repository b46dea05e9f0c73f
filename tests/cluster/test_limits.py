"""Limits hold across the cluster (issue 17 item 5): two nodes in this process on one database and a
real nats-server. Without hub/cluster/limits.py each node counts alone and every test here lets
twice the limit through."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid

import trio

from hub.auth.passwords import hash_password
from storage.limits import ClusterLimits
from tests.cluster.test_two_nodes import two_nodes
from tests.hubtools import assert_error, wait_for


async def test_the_stream_cap_counts_the_streams_of_every_node(nats_server, db_url, tmp_path):
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            a, b, b_url = await two_nodes(nursery, db_url, tmp_path / "hub", nats_server.url)
            for s in (a.services, b):
                s.events.max_per_owner = 3
            device_id, _ = await a.provision("watched")
            path = f"/v1/devices/{device_id}/events"
            async with contextlib.AsyncExitStack() as stack:
                opened = []
                for base in (a.base_url, b_url, b_url):
                    r = await stack.enter_async_context(a.client.stream("GET", base + path, headers=a.headers))
                    assert r.status_code == 200
                    opened.append(r)
                # each node holds fewer than 3 itself: only the shared count refuses the fourth, on either node
                for base in (a.base_url, b_url):
                    r = await a.client.get(base + path, headers=a.headers)
                    assert_error(r, 429, "too_many_streams")
                    assert r.headers["Retry-After"] == "5"
                assert await a.services.db.fetchval("SELECT count(*) FROM cluster_streams") == 3
            # the client closed all three; each node notices at its next write, then its row goes
            a.services.events.publish(("device", uuid.UUID(device_id)), {"kind": "probe"})
            b.events.publish(("device", uuid.UUID(device_id)), {"kind": "probe"})
            await wait_for(lambda: a.services.db.fetchval("SELECT count(*) = 0 FROM cluster_streams"), timeout=10)
            async with a.client.stream("GET", b_url + path, headers=a.headers) as r:
                assert r.status_code == 200
            nursery.cancel_scope.cancel()


async def test_the_api_rate_limit_counts_requests_on_every_node(nats_server, db_url, tmp_path):
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            a, b, b_url = await two_nodes(nursery, db_url, tmp_path / "hub", nats_server.url)
            await a.services.db.execute("UPDATE organizations SET tier = 'enterprise', rate_limit = 10 WHERE id = $1",
                                        uuid.UUID(a.org_id))
            for s in (a.services, b):
                await s.invalidate(f"org:{a.org_id}")
            key = ("org", uuid.UUID(a.org_id))

            def left(s) -> int:  # what a node's limiter leaves of the hour's 10, counting what it learnt
                return s.access.rate_limiter.peek(key, 10, s.clock.now()).remaining

            # 6 on node A, then (once A wrote its count and B read it: a sync round of each, ~1 s apiece,
            # longer on a loaded machine) 4 on node B use the hour's 10 between them
            for _ in range(6):
                assert (await a.call("GET", "/v1/devices")).status_code == 200
            await wait_for(lambda: left(b) == 4, timeout=15)
            remaining = []
            for _ in range(4):
                r = await a.client.get(b_url + "/v1/devices", headers=a.headers)
                assert r.status_code == 200, r.text
                remaining.append(int(r.headers["X-RateLimit-Remaining"]))
            assert remaining == [3, 2, 1, 0]  # B counts A's six
            r = await a.client.get(b_url + "/v1/devices", headers=a.headers)
            assert_error(r, 429, "rate_limited")
            await wait_for(lambda: left(a.services) == 0, timeout=15)
            r = await a.call("GET", "/v1/devices")  # and A counts B's four
            assert_error(r, 429, "rate_limited")
            nursery.cancel_scope.cancel()


async def test_sign_in_failures_are_counted_on_every_node(nats_server, db_url, tmp_path):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a, b, b_url = await two_nodes(nursery, db_url, tmp_path / "hub", nats_server.url)
            s = a.services
            pw = await trio.to_thread.run_sync(hash_password, "right")
            user = await s.stores.orgs.create_user("target@example.test", s.clock.now(), password_hash=pw)
            await s.stores.orgs.add_member(uuid.UUID(a.org_id), user["id"], "admin", s.clock.now())
            statuses = []
            for i in range(6):  # the account's limit is 5 failures in 15 minutes, whichever node they reach
                base = (a.base_url, b_url)[i % 2]
                r = await a.client.post(base + "/v1/auth/login",
                                        json={"email": "target@example.test", "password": f"wrong{i}"})
                statuses.append(r.status_code)
            assert statuses == [401] * 5 + [429]
            r = await a.client.post(a.base_url + "/v1/auth/login",
                                    json={"email": "target@example.test", "password": "right"})
            assert_error(r, 429, "rate_limited")  # refused unchecked: even the right password waits
            assert len(s.access.login_throttle) == 0 and len(b.login_throttle) == 0  # not counted per node
            nursery.cancel_scope.cancel()


async def test_token_requests_are_throttled_on_every_node(nats_server, db_url, tmp_path):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a, b, b_url = await two_nodes(nursery, db_url, tmp_path / "hub", nats_server.url)
            form = {"grant_type": "client_credentials", "client_id": "no-such-client", "client_secret": "guess"}
            statuses = []
            for i in range(11):  # 10 attempts per client id a minute
                base = (a.base_url, b_url)[i % 2]
                r = await a.client.post(base + "/v1/oauth/token", data=form)
                statuses.append(r.status_code)
            assert statuses == [401] * 10 + [429]
            assert r.json()["error"] == "slow_down" and int(r.headers["Retry-After"]) >= 1
            nursery.cancel_scope.cancel()


async def test_a_dead_node_s_streams_stop_counting(db_url):
    from storage.db import Database
    from storage.nodes import ClusterNodes

    db = Database(db_url)
    await db.open()
    try:
        store, now = ClusterLimits(db), dt.datetime.now(dt.timezone.utc)
        for _ in range(2):
            assert await store.open_stream("org:x", uuid.uuid4(), "gone", 2, now) is not None
        assert await store.open_stream("org:x", uuid.uuid4(), "alive", 2, now) is None  # at the cap
        nodes = ClusterNodes(db)
        gone_seen = await nodes.renew("gone")
        await nodes.renew("alive")
        # "alive" judges every row not renewed since just after "gone"'s last renewal: "gone" is dead
        assert await nodes.reap("alive", gone_seen + dt.timedelta(microseconds=1), ()) == {"gone": 0}
        assert await store.open_stream("org:x", uuid.uuid4(), "alive", 2, now) == 1
    finally:
        await db.close()


async def test_concurrent_attempts_never_pass_the_limit(db_url):
    """The advisory lock per key: 20 reservations at once on one key with limit 5 record exactly 5."""
    from storage.db import Database

    db = Database(db_url, max_size=8)
    await db.open()
    try:
        store, now = ClusterLimits(db), dt.datetime.now(dt.timezone.utc)
        results = []

        async def one(i: int) -> None:
            got = await store.reserve_attempts({"k": 5, f"addr-{i % 2}": 100}, dt.timedelta(minutes=1), now,
                                               f"n{i % 3}")
            results.append(got.wait)

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(one, i)
        assert sum(1 for w in results if w == 0) == 5
        assert all(55 <= w <= 60 for w in results if w > 0)
        assert await db.fetchval("SELECT count(*) FROM cluster_attempts WHERE key = 'k'") == 5
        # the refused reservations recorded nothing under the other key either
        assert await db.fetchval("SELECT count(*) FROM cluster_attempts WHERE key LIKE 'addr-%'") == 5
    finally:
        await db.close()
