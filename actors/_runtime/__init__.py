"""The actor runtime's one internal cell (as trio's ``_core``): its modules share each other's internals
by design, and nothing outside it does. What users of the runtime import is actors/runtime.py.

    actor.py       the Actor (mailbox, loop, ask/tell, Reply, parking, storage outages)
    supervisor.py  the Supervisor (runs, restarts, gives up, wakes) and the Registry
    background.py  ActorTasks: an actor's background work in the Supervisor's nursery
    mailbox.py     the bounded mailbox, one reader
    parktimer.py   the one timer task waking a Supervisor's parked actors

Inside the cell a module may read another object's private field (``actor._needs_start``,
``tasks._crashed``): they are one mechanism split for size. Outside it no module reads a private
field of another object (tests/actors/test_runtime_cell.py).
"""

from __future__ import annotations

from actors._runtime.actor import Actor, ActorStatistics, Reply
from actors._runtime.supervisor import Escalation, Registry, Supervisor

__all__ = ["Actor", "ActorStatistics", "Escalation", "Registry", "Reply", "Supervisor"]
