"""The device connection machine, with no IO and no trio: events in, effects out, exact instants."""

from __future__ import annotations

import copy
import datetime as dt

import pytest

from actors.machines.connection import (
    DUE,
    MAINTENANCE_HELLO,
    REBOOT_PENDING,
    STALE,
    THE_REBOOT,
    TRANSITIONS,
    CommandFailed,
    CommandSucceeded,
    Conn,
    ConnectionMachine,
    DropLink,
    Heartbeat,
    IllegalTransition,
    LinkDown,
    LinkUp,
    NotConnected,
    Persist,
    Publish,
    RebootRequested,
    SendCommand,
    Tick,
    event_type,
)

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
HB = 90.0   # heartbeat timeout, seconds
RB = 300.0  # reboot timeout, seconds
FACTS = {"firmware": "1.2.3", "architecture": "arm64", "tunnelPublicKey": "pk"}
EVENT_TYPES = (LinkUp, LinkDown, Heartbeat, RebootRequested, CommandSucceeded, CommandFailed, Tick)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def fields(m: ConnectionMachine) -> dict:
    return copy.deepcopy(vars(m))


def publish(state: str, online: bool, boot: str | None) -> Publish:
    return Publish("device.state", {"state": state, "online": online, "bootReason": boot})


# -- machines brought into each state by events (never by poking fields) -------------------------
def offline() -> ConnectionMachine:
    """Was online on c1 from T0, link went down at +5 s."""
    m = ConnectionMachine(heartbeat_timeout=HB, reboot_timeout=RB)
    m.handle(LinkUp("c1", "power_on", FACTS), T0)
    m.handle(LinkDown("c1"), at(5))
    assert m.state is Conn.OFFLINE
    return m


def online() -> ConnectionMachine:
    m = ConnectionMachine(heartbeat_timeout=HB, reboot_timeout=RB)
    m.handle(LinkUp("c1", "power_on", FACTS), T0)
    assert m.state is Conn.ONLINE
    return m


def maintenance() -> ConnectionMachine:
    m = ConnectionMachine(heartbeat_timeout=HB, reboot_timeout=RB)
    m.handle(LinkUp("c1", "memtest", FACTS, maintenance=True), T0)
    assert m.state is Conn.MAINTENANCE
    return m


def rebooting() -> ConnectionMachine:
    """Online on c1 from T0, reboot r1 requested at +1 s and acknowledged at +2 s."""
    m = online()
    m.handle(RebootRequested("r1"), at(1))
    m.handle(CommandSucceeded("r1"), at(2))
    assert m.state is Conn.REBOOTING
    return m


SETUPS = {Conn.OFFLINE: offline, Conn.ONLINE: online, Conn.MAINTENANCE: maintenance, Conn.REBOOTING: rebooting}


# -- the whole table: every legal (state, key) with its next state and exact effects ----------------
# Each case: (state, events first fed to get there, event, now, its key, next state, effects). The
# event instants are chosen so that Tick lands exactly on the deadline of the state it is fed to.
R1 = ((RebootRequested("r1"), at(1)),)  # a reboot sent, its reply not in yet
M = MAINTENANCE_HELLO
CASES = [
    # OFFLINE (down at +5 s, last seen T0; no current link)
    (Conn.OFFLINE, (), LinkUp("c2", "watchdog", FACTS), at(60), LinkUp, Conn.ONLINE,
     [Persist(Conn.ONLINE, True, "watchdog", at(60), at(60), FACTS), publish("online", True, "watchdog")]),
    (Conn.OFFLINE, (), LinkUp("c2", "memtest", FACTS, maintenance=True), at(60), (LinkUp, M), Conn.MAINTENANCE,
     [Persist(Conn.MAINTENANCE, True, "memtest", at(60), at(60), FACTS), publish("maintenance", True, "memtest")]),
    (Conn.OFFLINE, (), LinkDown("c1"), at(60), (LinkDown, STALE), Conn.OFFLINE, []),
    (Conn.OFFLINE, (), Heartbeat("c1"), at(60), (Heartbeat, STALE), Conn.OFFLINE, []),
    (Conn.OFFLINE, (), Tick(), at(10_000), Tick, Conn.OFFLINE, []),
    (Conn.OFFLINE, (), CommandSucceeded("x"), at(60), CommandSucceeded, Conn.OFFLINE, []),
    (Conn.OFFLINE, (), CommandFailed("x"), at(60), CommandFailed, Conn.OFFLINE, []),
    # ONLINE on c1 since T0
    (Conn.ONLINE, (), LinkUp("c2", "watchdog", FACTS), at(30), LinkUp, Conn.ONLINE,
     [DropLink("c1"), Persist(Conn.ONLINE, True, "watchdog", at(30), at(30), FACTS),
      publish("online", True, "watchdog")]),
    (Conn.ONLINE, (), LinkUp("c2", "memtest", FACTS, maintenance=True), at(30), (LinkUp, M), Conn.MAINTENANCE,
     [DropLink("c1"), Persist(Conn.MAINTENANCE, True, "memtest", at(30), at(30), FACTS),
      publish("maintenance", True, "memtest")]),
    (Conn.ONLINE, (), LinkDown("c1"), at(30), LinkDown, Conn.OFFLINE,
     [Persist(Conn.OFFLINE, False, "power_on", T0, T0), publish("offline", False, "power_on")]),
    (Conn.ONLINE, R1, LinkDown("c1"), at(12), (LinkDown, REBOOT_PENDING), Conn.REBOOTING,
     [Persist(Conn.REBOOTING, False, "power_on", T0, T0), publish("rebooting", False, "power_on")]),
    (Conn.ONLINE, (), LinkDown("c0"), at(30), (LinkDown, STALE), Conn.ONLINE, []),
    (Conn.ONLINE, (), Heartbeat("c1"), at(30), Heartbeat, Conn.ONLINE,
     [Persist(Conn.ONLINE, True, "power_on", at(30), T0)]),
    (Conn.ONLINE, (), Heartbeat("c0"), at(30), (Heartbeat, STALE), Conn.ONLINE, []),
    (Conn.ONLINE, (), Tick(), at(30), Tick, Conn.ONLINE, []),
    (Conn.ONLINE, (), Tick(), at(HB), (Tick, DUE), Conn.OFFLINE,
     [DropLink("c1"), Persist(Conn.OFFLINE, False, "power_on", T0, T0), publish("offline", False, "power_on")]),
    (Conn.ONLINE, (), RebootRequested("r9"), at(30), RebootRequested, Conn.ONLINE, [SendCommand("r9", "reboot", {})]),
    (Conn.ONLINE, (), CommandSucceeded("other"), at(30), CommandSucceeded, Conn.ONLINE, []),
    (Conn.ONLINE, R1, CommandSucceeded("r1"), at(2), (CommandSucceeded, THE_REBOOT), Conn.REBOOTING,
     [Persist(Conn.REBOOTING, False, "power_on", T0, T0), publish("rebooting", False, "power_on")]),
    (Conn.ONLINE, (), CommandFailed("other"), at(30), CommandFailed, Conn.ONLINE, []),
    (Conn.ONLINE, R1, CommandFailed("r1"), at(2), (CommandFailed, THE_REBOOT), Conn.ONLINE, []),
    # MAINTENANCE on c1 since T0
    (Conn.MAINTENANCE, (), LinkUp("c2", "power_on", FACTS), at(30), LinkUp, Conn.ONLINE,
     [DropLink("c1"), Persist(Conn.ONLINE, True, "power_on", at(30), at(30), FACTS),
      publish("online", True, "power_on")]),
    (Conn.MAINTENANCE, (), LinkUp("c2", "memtest", FACTS, maintenance=True), at(30), (LinkUp, M),
     Conn.MAINTENANCE, [DropLink("c1"), Persist(Conn.MAINTENANCE, True, "memtest", at(30), at(30), FACTS),
                        publish("maintenance", True, "memtest")]),
    (Conn.MAINTENANCE, (), LinkDown("c1"), at(30), LinkDown, Conn.OFFLINE,
     [Persist(Conn.OFFLINE, False, "memtest", T0, T0), publish("offline", False, "memtest")]),
    (Conn.MAINTENANCE, R1, LinkDown("c1"), at(12), (LinkDown, REBOOT_PENDING), Conn.REBOOTING,
     [Persist(Conn.REBOOTING, False, "memtest", T0, T0), publish("rebooting", False, "memtest")]),
    (Conn.MAINTENANCE, (), LinkDown("c0"), at(30), (LinkDown, STALE), Conn.MAINTENANCE, []),
    (Conn.MAINTENANCE, (), Heartbeat("c1"), at(30), Heartbeat, Conn.MAINTENANCE,
     [Persist(Conn.MAINTENANCE, True, "memtest", at(30), T0)]),
    (Conn.MAINTENANCE, (), Heartbeat("c0"), at(30), (Heartbeat, STALE), Conn.MAINTENANCE, []),
    (Conn.MAINTENANCE, (), Tick(), at(30), Tick, Conn.MAINTENANCE, []),
    (Conn.MAINTENANCE, (), Tick(), at(HB), (Tick, DUE), Conn.OFFLINE,
     [DropLink("c1"), Persist(Conn.OFFLINE, False, "memtest", T0, T0), publish("offline", False, "memtest")]),
    (Conn.MAINTENANCE, (), RebootRequested("r9"), at(30), RebootRequested, Conn.MAINTENANCE,
     [SendCommand("r9", "reboot", {})]),
    (Conn.MAINTENANCE, (), CommandSucceeded("other"), at(30), CommandSucceeded, Conn.MAINTENANCE, []),
    (Conn.MAINTENANCE, R1, CommandSucceeded("r1"), at(2), (CommandSucceeded, THE_REBOOT), Conn.REBOOTING,
     [Persist(Conn.REBOOTING, False, "memtest", T0, T0), publish("rebooting", False, "memtest")]),
    (Conn.MAINTENANCE, (), CommandFailed("other"), at(30), CommandFailed, Conn.MAINTENANCE, []),
    (Conn.MAINTENANCE, R1, CommandFailed("r1"), at(2), (CommandFailed, THE_REBOOT), Conn.MAINTENANCE, []),
    # REBOOTING since +2 s (link c1 never reported down)
    (Conn.REBOOTING, (), LinkUp("c2", "reboot", FACTS), at(40), LinkUp, Conn.ONLINE,
     [Persist(Conn.ONLINE, True, "reboot", at(40), at(40), FACTS), publish("online", True, "reboot")]),
    (Conn.REBOOTING, (), LinkUp("c2", "memtest", FACTS, maintenance=True), at(40), (LinkUp, M), Conn.MAINTENANCE,
     [Persist(Conn.MAINTENANCE, True, "memtest", at(40), at(40), FACTS), publish("maintenance", True, "memtest")]),
    (Conn.REBOOTING, (), LinkDown("c1"), at(40), LinkDown, Conn.REBOOTING, []),
    (Conn.REBOOTING, (), LinkDown("c0"), at(40), (LinkDown, STALE), Conn.REBOOTING, []),
    (Conn.REBOOTING, (), Heartbeat("c1"), at(40), Heartbeat, Conn.REBOOTING, []),
    (Conn.REBOOTING, (), Heartbeat("c0"), at(40), (Heartbeat, STALE), Conn.REBOOTING, []),
    (Conn.REBOOTING, (), Tick(), at(40), Tick, Conn.REBOOTING, []),
    (Conn.REBOOTING, (), Tick(), at(2 + RB), (Tick, DUE), Conn.OFFLINE,
     [DropLink("c1"), Persist(Conn.OFFLINE, False, "power_on", T0, T0), publish("offline", False, "power_on")]),
    (Conn.REBOOTING, (), CommandSucceeded("r1"), at(40), CommandSucceeded, Conn.REBOOTING, []),
    (Conn.REBOOTING, (), CommandFailed("r1"), at(40), CommandFailed, Conn.REBOOTING, []),
]

# Illegal: an event type with no key at all in its state's row.
ILLEGAL = [(state, ev) for state in Conn for ev in EVENT_TYPES
           if not any(event_type(key) is ev for key in TRANSITIONS[state])]


def test_cases_cover_exactly_the_transition_table():
    table = {(state, key) for state, row in TRANSITIONS.items() for key in row}
    assert [(c[0], c[4]) for c in CASES if (c[0], c[4]) in table] == [(c[0], c[4]) for c in CASES]
    assert {(c[0], c[4]) for c in CASES} == table and len(CASES) == len(table)
    assert set(TRANSITIONS) == set(Conn)
    assert set(ILLEGAL) == {(Conn.OFFLINE, RebootRequested), (Conn.REBOOTING, RebootRequested)}


@pytest.mark.parametrize(("state", "before", "event", "now", "key", "after", "effects"), CASES,
                         ids=[f"{c[0].name}-{c[4].__name__ if isinstance(c[4], type) else c[4][0].__name__ + '.' + c[4][1]}"
                              for c in CASES])
def test_transition(state, before, event, now, key, after, effects):
    m = SETUPS[state]()
    for e, t in before:
        m.handle(e, t)
    assert m.state is state
    assert m.key(event, now) == key
    assert m.handle(event, now) == effects
    assert m.state is after is TRANSITIONS[state][key]
    assert m.online is (after in (Conn.ONLINE, Conn.MAINTENANCE))


@pytest.mark.parametrize(("state", "event_type"), ILLEGAL, ids=[f"{s.name}-{e.__name__}" for s, e in ILLEGAL])
def test_illegal_event_raises_and_changes_nothing(state, event_type):
    m = SETUPS[state]()
    before = fields(m)
    with pytest.raises(IllegalTransition) as info:
        m.handle(event_type("r2"), at(50))
    assert info.value.state is state
    assert fields(m) == before


@pytest.mark.parametrize("state", list(Conn))
def test_unknown_event_type_is_illegal_in_every_state(state):
    m = SETUPS[state]()
    before = fields(m)
    with pytest.raises(IllegalTransition, match="object is not allowed"):
        m.handle(object(), at(50))
    assert fields(m) == before


def test_illegal_transition_is_not_a_not_connected_for_other_events():
    with pytest.raises(IllegalTransition) as info:
        offline().handle(object(), at(50))
    assert not isinstance(info.value, NotConnected)


# -- newest connection wins ---------------------------------------------------------------------
def test_newer_link_drops_the_older_and_the_older_link_down_changes_nothing():
    m = online()
    assert m.handle(LinkUp("c2", "power_on", FACTS), at(20))[0] == DropLink("c1")
    assert m.conn_id == "c2" and m.connected_at == at(20)
    before = fields(m)
    assert m.handle(LinkDown("c1"), at(21)) == []
    assert fields(m) == before
    assert m.handle(Heartbeat("c1"), at(22)) == []  # the old socket's late heartbeat is not the device's
    assert fields(m) == before
    m.handle(LinkDown("c2"), at(23))
    assert m.state is Conn.OFFLINE and m.conn_id is None


def test_same_link_saying_hello_again_is_not_dropped():
    m = online()
    effects = m.handle(LinkUp("c1", "power_on", FACTS), at(20))
    assert not any(isinstance(e, DropLink) for e in effects)


def test_link_up_after_offline_does_not_drop_anything():
    m = offline()
    effects = m.handle(LinkUp("c2", "power_on"), at(20))
    assert not any(isinstance(e, DropLink) for e in effects)
    assert effects[0] == Persist(Conn.ONLINE, True, "power_on", at(20), at(20), {})


# -- heartbeats and the deadline ----------------------------------------------------------------
def test_heartbeat_moves_last_seen_and_pushes_the_deadline_by_exactly_the_timeout():
    m = online()
    assert m.next_deadline() == at(HB)
    m.handle(Heartbeat("c1"), at(30))
    assert m.last_seen_at == at(30)
    assert m.next_deadline() == at(30 + HB)
    m.handle(Heartbeat("c1"), at(61.5))
    assert m.next_deadline() == at(61.5 + HB)


def test_tick_before_the_deadline_does_nothing():
    m = online()
    m.handle(Heartbeat("c1"), at(30))
    before = fields(m)
    assert m.handle(Tick(), at(30 + HB) - dt.timedelta(microseconds=1)) == []
    assert fields(m) == before


def test_tick_at_the_deadline_goes_offline_and_drops_the_link():
    m = online()
    m.handle(Heartbeat("c1"), at(30))
    effects = m.handle(Tick(), at(30 + HB))
    assert effects == [DropLink("c1"), Persist(Conn.OFFLINE, False, "power_on", at(30), T0),
                       publish("offline", False, "power_on")]
    assert m.state is Conn.OFFLINE and m.conn_id is None and m.next_deadline() is None


def test_tick_after_the_deadline_goes_offline_too():
    m = online()
    assert isinstance(m.handle(Tick(), at(HB + 1000))[0], DropLink)
    assert m.state is Conn.OFFLINE


def test_offline_machine_has_no_deadline_and_keeps_its_last_seen():
    m = offline()
    assert m.next_deadline() is None
    assert m.last_seen_at == T0


def test_machine_rebuilt_from_storage_keeps_boot_reason_and_last_seen():
    m = ConnectionMachine(heartbeat_timeout=HB, reboot_timeout=RB, boot_reason="watchdog", last_seen_at=T0)
    assert (m.state, m.online, m.boot_reason, m.last_seen_at) == (Conn.OFFLINE, False, "watchdog", T0)
    assert m.next_deadline() is None


# -- reboot -------------------------------------------------------------------------------------
def test_reboot_sends_a_command_and_waits_for_the_acknowledgement():
    m = online()
    assert m.handle(RebootRequested("r1"), at(10)) == [SendCommand("r1", "reboot", {})]
    assert m.state is Conn.ONLINE and m.reboot_pending == "r1"
    effects = m.handle(CommandSucceeded("r1"), at(11))
    assert m.state is Conn.REBOOTING and m.rebooting_since == at(11) and m.reboot_pending is None
    assert effects == [Persist(Conn.REBOOTING, False, "power_on", T0, T0), publish("rebooting", False, "power_on")]
    assert m.next_deadline() == at(11 + RB)


def test_success_of_another_command_does_not_start_rebooting():
    m = online()
    m.handle(RebootRequested("r1"), at(10))
    assert m.handle(CommandSucceeded("ping"), at(11)) == []
    assert m.state is Conn.ONLINE and m.reboot_pending == "r1"


def test_failed_reboot_clears_the_pending_reboot():
    m = online()
    m.handle(RebootRequested("r1"), at(10))
    assert m.handle(CommandFailed("r1"), at(11)) == []
    assert m.state is Conn.ONLINE and m.reboot_pending is None
    m.handle(LinkDown("c1"), at(12))
    assert m.state is Conn.OFFLINE  # no longer taken for a reboot


def test_link_down_while_reboot_pending_means_rebooting():
    m = online()
    m.handle(RebootRequested("r1"), at(10))
    effects = m.handle(LinkDown("c1"), at(12))
    assert m.state is Conn.REBOOTING and m.rebooting_since == at(12) and m.reboot_pending is None
    assert effects == [Persist(Conn.REBOOTING, False, "power_on", T0, T0), publish("rebooting", False, "power_on")]
    assert m.next_deadline() == at(12 + RB)
    # the acknowledgement arriving after the link went down changes nothing
    before = fields(m)
    assert m.handle(CommandSucceeded("r1"), at(13)) == []
    assert fields(m) == before


def test_link_up_while_rebooting_is_online_with_the_new_boot_reason():
    m = online()
    m.handle(RebootRequested("r1"), at(10))
    m.handle(LinkDown("c1"), at(12))
    effects = m.handle(LinkUp("c2", "reboot", {"firmware": "1.2.4"}), at(40))
    assert effects == [Persist(Conn.ONLINE, True, "reboot", at(40), at(40), {"firmware": "1.2.4"}),
                       publish("online", True, "reboot")]
    assert (m.state, m.boot_reason, m.conn_id, m.rebooting_since) == (Conn.ONLINE, "reboot", "c2", None)
    assert m.next_deadline() == at(40 + HB)


def test_reboot_timeout_is_offline():
    m = online()
    m.handle(RebootRequested("r1"), at(10))
    m.handle(LinkDown("c1"), at(12))
    before = fields(m)
    assert m.handle(Tick(), at(12 + RB) - dt.timedelta(microseconds=1)) == []
    assert fields(m) == before
    effects = m.handle(Tick(), at(12 + RB))
    # the link is already gone: nothing to drop
    assert effects == [Persist(Conn.OFFLINE, False, "power_on", T0, T0), publish("offline", False, "power_on")]
    assert m.state is Conn.OFFLINE and m.rebooting_since is None and m.next_deadline() is None


def test_reboot_while_offline_raises_not_connected_and_changes_nothing():
    m = offline()
    before = fields(m)
    with pytest.raises(NotConnected):
        m.handle(RebootRequested("r1"), at(10))
    assert fields(m) == before
    fresh = ConnectionMachine(heartbeat_timeout=HB, reboot_timeout=RB)
    with pytest.raises(NotConnected):
        fresh.handle(RebootRequested("r1"), at(10))


def test_reboot_while_rebooting_raises_not_connected():
    m = rebooting()
    before = fields(m)
    with pytest.raises(NotConnected):
        m.handle(RebootRequested("r2"), at(10))
    assert fields(m) == before


# -- maintenance ---------------------------------------------------------------------------------
def test_maintenance_hello_is_maintenance_and_counts_as_online():
    m = ConnectionMachine(heartbeat_timeout=HB, reboot_timeout=RB)
    effects = m.handle(LinkUp("c1", "memtest", FACTS, maintenance=True), T0)
    assert m.state is Conn.MAINTENANCE and m.online
    assert effects == [Persist(Conn.MAINTENANCE, True, "memtest", T0, T0, FACTS),
                       publish("maintenance", True, "memtest")]
    assert m.next_deadline() == at(HB)


def test_maintenance_device_reboots_like_an_online_one():
    m = maintenance()
    assert m.handle(RebootRequested("r1"), at(5)) == [SendCommand("r1", "reboot", {})]
    m.handle(CommandSucceeded("r1"), at(6))
    assert m.state is Conn.REBOOTING
    m.handle(LinkUp("c2", "reboot"), at(30))
    assert m.state is Conn.ONLINE and m.boot_reason == "reboot"


# -- effects ------------------------------------------------------------------------------------
def test_persist_carries_facts_only_on_link_up():
    m = ConnectionMachine(heartbeat_timeout=HB, reboot_timeout=RB)
    up = m.handle(LinkUp("c1", "power_on", FACTS), T0)
    assert [e.facts for e in up if isinstance(e, Persist)] == [FACTS]
    beat = m.handle(Heartbeat("c1"), at(1))
    assert beat == [Persist(Conn.ONLINE, True, "power_on", at(1), T0, None)]
    down = m.handle(LinkDown("c1"), at(2))
    assert [e.facts for e in down if isinstance(e, Persist)] == [None]


def test_every_state_change_is_published_and_persisted():
    m = ConnectionMachine(heartbeat_timeout=HB, reboot_timeout=RB)
    seen = []
    for event, now in [(LinkUp("c1", "power_on"), T0), (RebootRequested("r1"), at(1)),
                       (CommandSucceeded("r1"), at(2)), (LinkUp("c2", "reboot"), at(20)),
                       (LinkDown("c2"), at(30))]:
        before = m.state
        effects = m.handle(event, now)
        if m.state is not before or isinstance(event, LinkUp):
            pub = [e for e in effects if isinstance(e, Publish)]
            per = [e for e in effects if isinstance(e, Persist)]
            assert len(pub) == 1 and len(per) == 1
            assert pub[0].payload["state"] == m.state.value == per[0].state.value
            seen.append(m.state)
    assert seen == [Conn.ONLINE, Conn.REBOOTING, Conn.ONLINE, Conn.OFFLINE]
