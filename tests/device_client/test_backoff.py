"""The one backoff (device_client/shared/backoff.py): its sequence as a table, its jitter from the random
generator it is given, and the three places that use it."""

from __future__ import annotations

import random

import pytest

from device_client.shared.backoff import Backoff


class Fixed(random.Random):
    """A generator whose uniform(a, b) is always a + share * (b - a): the jitter, named."""

    def __init__(self, share: float) -> None:
        super().__init__(0)
        self.share = share

    def uniform(self, a: float, b: float) -> float:
        return a + self.share * (b - a)


@pytest.mark.parametrize(("initial", "maximum", "factor", "jitter", "share", "delays"), [
    (0.5, 4.0, 2.0, False, 0.0, [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]),
    (0.5, 4.0, 2.0, True, 1.0, [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]),   # full jitter's top is the ceiling
    (0.5, 4.0, 2.0, True, 0.5, [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]),
    (0.5, 4.0, 2.0, True, 0.0, [0.0] * 6),                         # and its bottom is 0
    (1.0, 30.0, 3.0, False, 0.0, [1.0, 3.0, 9.0, 27.0, 30.0, 30.0]),  # the cap is not a power of the factor
    (0.05, 5.0, 2.0, False, 0.0, [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]),  # the supervisor's defaults
    (2.0, 2.0, 2.0, False, 0.0, [2.0, 2.0]),
])
def test_delays(initial, maximum, factor, jitter, share, delays):
    backoff = Backoff(initial, maximum, Fixed(share), factor=factor, jitter=jitter)
    assert [backoff.next_delay() for _ in delays] == pytest.approx(delays)
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(delays[0])


def test_the_window_of_a_drain_is_spread_by_the_generator():
    assert Backoff(1, 2, Fixed(0.25)).within(60) == 15.0


def test_the_default_generator_spreads_delays_over_the_whole_window():
    delays = [Backoff(1.0, 1.0, random.Random(i)).next_delay() for i in range(50)]
    assert min(delays) < 0.2 and max(delays) > 0.8


@pytest.mark.parametrize(("initial", "maximum", "factor"), [(0, 1, 2), (-1, 1, 2), (2, 1, 2), (1, 2, 0.5)])
def test_a_policy_that_cannot_back_off_is_refused(initial, maximum, factor):
    with pytest.raises(ValueError):
        Backoff(initial, maximum, factor=factor)


def test_the_link_the_supervisor_and_the_workload_share_it():
    import actors._runtime.actor
    import actors._runtime.supervisor
    import device_client.agentlink
    import device_client.workload

    assert device_client.agentlink.Backoff is Backoff
    assert actors._runtime.actor.Backoff is Backoff  # an actor's storage backoff
    assert actors._runtime.supervisor.Backoff is Backoff  # its restart backoff
    assert device_client.workload.Backoff is Backoff
