"""The actor runtime, as its users see it: actors with one bounded mailbox, a trio task only while
there is work, supervised (DESIGN.md section 4). The mechanism is the private cell actors/_runtime/.

    Actor        subclass it; implement ``on_start`` (rebuild from storage), ``receive`` (one message
                 at a time) and optionally ``next_deadline``/``on_deadline``, ``should_stop`` and
                 ``on_given_up``. ``ask`` waits for the reply, ``tell`` does not, ``post`` waits for
                 mailbox space; ``defer_reply`` hands the current ask's ``Reply`` to later work;
                 ``tasks.start_soon`` runs background work that counts as the actor's;
                 ``until_stored`` waits out a storage outage.
    Reply        a one-shot reply slot (``set``, ``fail``, ``wait``).
    Supervisor   runs actors in its nursery and restarts a crashed one with backoff; more than
                 ``max_restarts`` crashes inside ``window`` seconds gives that actor up (stopped, its
                 askers answered, forgotten: the next message for its key starts a fresh one), never
                 the process. ``Escalation`` is the supervisor itself failing.
    Registry     gets or starts the actor for a key, and forgets it when it stops.

The errors an ask raises are actors/errors.py's, named here too for the runtime's callers.
"""

from __future__ import annotations

from actors._runtime import Actor, ActorStatistics, Escalation, Registry, Reply, Supervisor
from actors.errors import ActorCrashed, ActorError, ActorStopped, AskTimeout, MailboxFull

__all__ = ["Actor", "ActorCrashed", "ActorError", "ActorStatistics", "ActorStopped", "AskTimeout", "Escalation",
           "MailboxFull", "Registry", "Reply", "Supervisor"]
