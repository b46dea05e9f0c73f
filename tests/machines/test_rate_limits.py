"""hub/auth/ratelimit.RateLimiter without IO: fixed hourly windows, and in a cluster the other nodes'
counts learnt each sync round (hub/cluster/limits.py carries them)."""

from __future__ import annotations

import datetime as dt

from hub.auth.ratelimit import RateLimiter, key_text

T0 = dt.datetime(2026, 11, 26, 10, 0, 5, tzinfo=dt.timezone.utc)
WINDOW = int(T0.timestamp()) - int(T0.timestamp()) % 3600
ORG = ("org", "o1")


def test_a_window_counts_up_to_the_limit_and_a_new_window_starts_afresh():
    rl = RateLimiter()
    decisions = [rl.hit(ORG, 3, T0) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert decisions[-1].reset == WINDOW + 3600 and decisions[-1].retry_after == 3600 - 5
    assert rl.hit(ORG, 3, T0 + dt.timedelta(hours=1)).allowed


def test_the_other_nodes_counts_are_added_to_this_one_s():
    rl = RateLimiter()
    rl.learn(WINDOW, {key_text(ORG): 8})
    assert rl.peek(ORG, 10, T0).remaining == 2
    assert [rl.hit(ORG, 10, T0).allowed for _ in range(3)] == [True, True, False]
    assert rl.hit(("org", "o2"), 10, T0).remaining == 9  # another key is untouched


def test_changes_hand_over_this_node_s_counts_once_and_again_when_not_sent():
    rl = RateLimiter()
    for _ in range(3):
        rl.hit(ORG, 10, T0)
    assert rl.changes(T0) == (WINDOW, {"org:o1": 3})
    assert rl.changes(T0) == (WINDOW, {})  # nothing new
    rl.hit(ORG, 10, T0)
    assert rl.changes(T0) == (WINDOW, {"org:o1": 4})
    rl.not_sent()  # the database was unreachable: the next round carries it again
    assert rl.changes(T0) == (WINDOW, {"org:o1": 4})


def test_counts_of_an_old_window_are_ignored_and_a_newer_one_starts_the_window():
    rl = RateLimiter()
    rl.hit(ORG, 10, T0)
    rl.learn(WINDOW - 3600, {"org:o1": 9})  # a round that read the previous hour
    assert rl.peek(ORG, 10, T0).remaining == 9
    later = T0 + dt.timedelta(hours=1)
    rl.learn(WINDOW + 3600, {"org:o1": 9})  # the other nodes are in the next hour already
    assert rl.peek(ORG, 10, later).remaining == 1
    assert rl.changes(T0) == (WINDOW, {})  # this node's new window holds nothing of its own yet


def test_a_single_process_keeps_no_change_set_until_a_cluster_first_asks():
    rl = RateLimiter()
    for key in (ORG, ("org", "o2")):
        rl.hit(key, 10, T0)
    assert not rl._changed  # nobody reads changes in one process: hit keeps none
    # the first round hands over every count so far; later rounds only what changed
    assert rl.changes(T0) == (WINDOW, {"org:o1": 1, "org:o2": 1})
    rl.hit(ORG, 10, T0)
    assert rl.changes(T0) == (WINDOW, {"org:o1": 2})
