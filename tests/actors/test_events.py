"""EventHub: bounded broadcast per topic; a subscriber that falls behind is dropped, never buffered."""

from __future__ import annotations

import trio

from hub.events import EventHub


def ev(n: int) -> dict:
    return {"kind": "device.state", "n": n}


def drain(sub) -> tuple[list[dict], bool]:
    """The buffered events, and whether the stream has ended."""
    out = []
    while True:
        try:
            out.append(sub.receive.receive_nowait())
        except trio.WouldBlock:
            return out, False
        except trio.EndOfChannel:
            return out, True


async def test_publish_reaches_every_subscriber_of_the_topic_only():
    with trio.fail_after(1):
        hub = EventHub()
        a, b = hub.subscribe(("org", 1)), hub.subscribe(("org", 1))
        other = hub.subscribe(("org", 2))
        hub.publish(("org", 1), ev(1))
        hub.publish(("device", 9), ev(2))  # nobody listens: not counted
        assert drain(a) == ([ev(1)], False) and drain(b) == ([ev(1)], False)
        assert drain(other) == ([], False)
        assert hub.published == 1 and hub.subscriber_count() == 3


async def test_subscriber_receives_in_order_with_async_receive():
    with trio.fail_after(1):
        hub = EventHub()
        with hub.subscribe("t") as sub:
            for i in range(3):
                hub.publish("t", ev(i))
            assert [await sub.receive.receive() for _ in range(3)] == [ev(0), ev(1), ev(2)]
        assert hub.subscriber_count() == 0


async def test_slow_subscriber_is_dropped_and_marked_while_others_go_on():
    with trio.fail_after(1):
        hub = EventHub(buffer=3)
        slow, fast = hub.subscribe("t"), hub.subscribe("t")
        for i in range(3):
            hub.publish("t", ev(i))
        assert drain(fast) == ([ev(0), ev(1), ev(2)], False)
        assert not slow.dropped
        hub.publish("t", ev(3))  # slow's buffer is full
        assert slow.dropped and not fast.dropped
        assert hub.dropped == 1 and hub.subscriber_count() == 1
        hub.publish("t", ev(4))
        assert hub.dropped == 1  # dropped once, not once per event
        # the dropped stream delivers what it had buffered, then ends
        assert drain(slow) == ([ev(0), ev(1), ev(2)], True)
        assert drain(fast) == ([ev(3), ev(4)], False)


async def test_a_subscriber_that_never_reads_never_grows_beyond_its_buffer():
    with trio.fail_after(5):
        hub = EventHub(buffer=8)
        sub = hub.subscribe(("device", 1))
        for i in range(10_000):
            hub.publish(("device", 1), ev(i))
            assert sub.receive.statistics().current_buffer_used <= 8
        assert sub.dropped and hub.dropped == 1
        assert hub.subscriber_count() == 0 and hub._topics == {}
        assert drain(sub) == ([ev(i) for i in range(8)], True)


async def test_closed_subscriber_is_removed_and_publishing_after_is_harmless():
    with trio.fail_after(1):
        hub = EventHub()
        sub = hub.subscribe("t")
        sub.close()
        assert hub.subscriber_count() == 0
        hub.publish("t", ev(1))
        assert hub.published == 0 and hub.dropped == 0
        assert drain(sub) == ([], True)


async def test_subscriber_whose_reader_went_away_is_removed_without_counting_a_drop():
    with trio.fail_after(1):
        hub = EventHub()
        gone, live = hub.subscribe("t"), hub.subscribe("t")
        gone.receive.close()  # the SSE client disconnected
        hub.publish("t", ev(1))
        assert hub.subscriber_count() == 1 and not gone.dropped and hub.dropped == 0
        assert drain(live) == ([ev(1)], False)


def test_streams_are_capped_per_owner_and_released_on_close():
    from hub.errors import RateLimited
    from hub.events import EventHub

    hub = EventHub(buffer=4, max_per_owner=2)
    a = hub.subscribe(("device", 1), owner=("org", "A"))
    b = hub.subscribe(("device", 2), owner=("org", "A"))
    other = hub.subscribe(("device", 3), owner=("org", "B"))  # another organisation's own allowance
    unowned = [hub.subscribe(("device", 1)) for _ in range(5)]  # internal subscribers are not counted
    try:
        hub.subscribe(("device", 1), owner=("org", "A"))
    except RateLimited as exc:
        assert exc.code == "too_many_streams" and exc.headers["Retry-After"] == "5"
    else:
        raise AssertionError("a third stream was allowed")
    a.close()
    c = hub.subscribe(("device", 1), owner=("org", "A"))
    # a subscriber dropped for falling behind releases its slot too
    for i in range(5):
        hub.publish(("device", 1), {"kind": "x", "i": i})
    assert c.dropped
    d = hub.subscribe(("device", 4), owner=("org", "A"))
    for s in (b, d, other, *unowned):
        s.close()
    assert hub.subscriber_count() == 0 and hub._owned == {}
