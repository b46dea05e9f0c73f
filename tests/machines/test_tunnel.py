"""The tunnel session machine: pure transitions, time as an argument."""

from __future__ import annotations

import datetime as dt

import pytest

from actors.machines import tunnel as tm

T0 = dt.datetime(2026, 1, 5, 12, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_open_renew_close():
    m = tm.TunnelMachine(at(600))
    assert m.next_deadline() == at(600)
    assert m.handle(tm.Answered(), at(1)) == [tm.MarkOpen()]
    assert m.state is tm.State.OPEN
    assert m.handle(tm.Renewed(at(900)), at(500)) == [tm.Extend(at(900))]
    assert m.next_deadline() == at(900)
    assert m.handle(tm.CloseRequested("bye"), at(600)) == [tm.SendClose("bye")]
    assert m.state is tm.State.CLOSING and m.next_deadline() is None
    assert m.handle(tm.CloseDone(), at(601)) == [tm.Finish(tm.State.CLOSED, "bye"), tm.NotifyClosed("bye"), tm.Stop()]
    assert m.state is tm.State.CLOSED
    assert m.handle(tm.CloseDone(), at(602)) == []  # a late confirmation changes nothing


def test_expiry_is_an_input_time():
    m = tm.TunnelMachine(at(600))
    m.handle(tm.Answered(), at(1))
    assert m.handle(tm.Tick(), at(599.9)) == []
    assert m.state is tm.State.OPEN
    assert m.handle(tm.Tick(), at(600)) == [tm.Finish(tm.State.CLOSED, "expired"), tm.NotifyClosed("expired"),
                                            tm.Stop()]
    assert m.state is tm.State.CLOSED and m.next_deadline() is None


def test_refused_open_fails_and_device_end_closes():
    m = tm.TunnelMachine(at(600))
    assert m.handle(tm.Refused("ssh_disabled"), at(1)) == [tm.Finish(tm.State.FAILED, "ssh_disabled"), tm.Stop()]
    assert m.state is tm.State.FAILED
    m2 = tm.TunnelMachine(at(600))
    m2.handle(tm.Answered(), at(1))
    assert m2.handle(tm.DeviceEnded("peer gone"), at(5)) == [
        tm.Finish(tm.State.CLOSED, "peer gone"), tm.NotifyClosed("peer gone"), tm.Stop()]


@pytest.mark.parametrize("event", [tm.Answered(), tm.Renewed(at(900)), tm.CloseRequested("x"), tm.Refused("x")])
def test_illegal_events_raise_and_change_nothing(event):
    m = tm.TunnelMachine(at(600), tm.State.CLOSED)
    with pytest.raises(tm.IllegalTransition):
        m.handle(event, at(1))
    assert m.state is tm.State.CLOSED


def test_a_renewal_never_shortens_the_session():
    m = tm.TunnelMachine(at(600), tm.State.OPEN)
    with pytest.raises(tm.IllegalTransition):
        m.handle(tm.Renewed(at(600)), at(10))
    assert m.expires_at == at(600) and m.state is tm.State.OPEN
