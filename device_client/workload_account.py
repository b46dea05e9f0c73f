"""The account a device's workload runs as (``run_as``), and how the agent lets it reach its files.

By default the workload runs as the agent's own user; a real device's
operator chooses (``fleethub agent --workload-user`` or FLEETHUB_WORKLOAD_USER). Simulated devices
(``device_client/sim.py``) run in the hub's host, so when the simulator is root their workloads run
as an unprivileged account (``simulator_user``: FLEETHUB_WORKLOAD_USER, default ``nobody``), never
root. Without root nothing else is possible: the workload runs as the simulator's own user. For
another account the agent makes the path to the device root traversable (execute only: nothing is
listed, and the agent's files stay 0600) and gives the account the volumes directory; secret files
keep the mode and owner they were delivered with.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path

WORKLOAD_USER_ENV = "FLEETHUB_WORKLOAD_USER"
SIMULATOR_DEFAULT_USER = "nobody"


@dataclass(frozen=True)
class RunAs:
    """The account a workload runs as when it is not the agent's own."""

    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def lookup(cls, name: str) -> RunAs:
        """``name`` is a user name or a numeric uid; ValueError when the system has no such user."""
        try:
            entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        except (KeyError, ValueError):
            raise ValueError(f"no user {name!r} on this system (workload user)") from None
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)

    def is_other(self) -> bool:
        return self.uid != os.geteuid()


def configured_user(name: str | None = None) -> RunAs | None:
    """A real agent's workload account: ``name``, else FLEETHUB_WORKLOAD_USER, else the agent's own."""
    name = name or os.environ.get(WORKLOAD_USER_ENV)
    return RunAs.lookup(name) if name else None


def simulator_user(name: str | None = None) -> RunAs | None:
    """Simulated devices' workload account: unprivileged when the simulator is root (configuration
    commands come from the hub's tenants, and this host holds the hub's keys); None when not root,
    where switching is impossible and the workload runs as the simulator's own user."""
    if os.geteuid() != 0:
        return None
    user = RunAs.lookup(name or os.environ.get(WORKLOAD_USER_ENV) or SIMULATOR_DEFAULT_USER)
    if user.uid == 0:
        raise ValueError(f"simulated workloads must not run as root ({user.name!r} has uid 0)")
    return user


def make_traversable(path: Path) -> None:
    """Execute (not read) for others on ``path`` and its parents, so another account can reach a
    known path below without listing anything on the way."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if mode & 0o001 != 0o001:
            parent.chmod(mode | 0o001)
